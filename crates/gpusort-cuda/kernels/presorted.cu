// presorted.cu — presorted input found in one read of the key, and finished without the radix
// passes (issue 22: ORDER BY over clustered tables meets keys already in order or in reverse
// order; a sort that notices it does one read instead of a pass per digit).
//
// Bandyopadhyay & Sahni's record sorts (004, sections V and VI) run every radix pass whatever the
// input's order. Before them, gpusort reads the key once:
//
// * order_scan: for every row i > 0, key(i - 1) against key(i), word by word (ByField, word 0
//   most significant), counting the rows whose key is smaller than the previous row's
//   (descents), greater (ascents) and equal. No descents: the input is sorted and stays where it
//   is. No ascents and no equal neighbours: it is strictly decreasing, and the sorted order is
//   the rows reversed (stable, as no two keys are equal). No ascents but equal neighbours: it is
//   non-increasing, and the sorted order is its groups of equal keys reversed, each group's rows
//   kept in input order (reverse_groups). The first ORDER_SCAN_MAX_DESCENTS descents also
//   record where they are: with no more than that, the rows are that many + 1 ascending runs,
//   which the host merges (merge.cu, seed 003) instead of sorting. A warp that sees both a
//   descent and an ascent once more descents than that are recorded raises a flag that stops
//   every thread.
// * reverse_lanes: rows i and n - 1 - i swapped in place for i < n / 2, in every lane of the
//   table at once (key words, columns and Hybrid records alike, `width` bytes a row; the lane
//   is blockIdx.y); each thread loads REVERSE_ITEMS rows and their mirrors before it stores;
// * reverse_iota: the permutation of reversed rows, n - 1 - i;
// * reverse_groups: for non-increasing keys, the permutation that puts the groups of equal keys
//   in reverse order and keeps each group's rows in input order: row i of the group [s, e)
//   goes to n - e + (i - s). A block takes a tile of REVERSE_GROUPS_TILE rows: the group starts
//   inside it by block-wide scans of the rows where the key changes, the groups cut by its
//   edges by a binary search each;
// * distinct_sample and distinct_ranks: few distinct keys (at most DISTINCT_MAX, keys of at most
//   two words). One block hashes the keys of DISTINCT_SAMPLE rows spread over the input in
//   shared memory; with at most DISTINCT_MAX distinct it writes them sorted (the dictionary).
//   distinct_ranks then looks every key up in it: a key it lacks raises a flag (the sample
//   missed a value: the radix passes run); else it may write each row's rank in the
//   dictionary, a digit that orders the rows as their keys do, and one stable radix pass over
//   it sorts them (a counting sort; the CPU backend's gpusort::cpu::presorted does the same).
//
// Each thread walks rows with a grid stride; order_scan's warps combine their counts with
// shuffles and one lane per warp adds them to the totals.

// The most key words order_scan compares (a longer key takes the radix passes unscanned); the
// host defines it (kernels.rs SHARED_CONSTANTS).
#if !defined(ORDER_SCAN_MAX_WORDS) || !defined(ORDER_SCAN_MAX_DESCENTS) || !defined(REVERSE_MAX_LANES) || \
    !defined(REVERSE_ITEMS) || !defined(REVERSE_GROUPS_BLOCK) || !defined(REVERSE_GROUPS_IPT) ||                \
    !defined(REVERSE_GROUPS_TILE) || !defined(DISTINCT_MAX) || !defined(DISTINCT_SAMPLE) ||                     \
    !defined(DISTINCT_SLOTS) || !defined(DISTINCT_BLOCK) || !defined(SCAN_DISTINCT) || !defined(SCAN_MISSING)
#error "the order scan's, the reversal's and the distinct keys' constants come from the host"
#endif

// The key words order_scan compares, most significant first, passed by value.
struct ScanWords {
    const u32* w[ORDER_SCAN_MAX_WORDS];
};

// counts[0] += descents, counts[1] += ascents, counts[2] += equal neighbours; counts[3] is set
// once the input is known to be neither sorted nor reversed nor a few runs (a descent beside an
// ascent or an equal pair, with more than ORDER_SCAN_MAX_DESCENTS descents recorded), and every
// thread then stops: random keys cost the scan a row or two a thread, not a read of the key.
// counts[4] counts the descents offered to `descents_at`, which keeps the rows of the first
// ORDER_SCAN_MAX_DESCENTS (in no particular order). The host zeroes the counts first.
extern "C" __global__ void order_scan(u32 n, ScanWords words, u32 nwords, u64* counts, u32* descents_at) {
    u64 desc = 0, asc = 0, eq = 0;
    volatile u64* stop = counts + 3;
    const u32 lane = threadIdx.x & 31;
    // Whether this warp has seen more descents recorded than kept (warp-uniform).
    bool over = false;
    u32 iter = 0;
    for (size_t i = 1 + (size_t)blockIdx.x * blockDim.x + threadIdx.x; __any_sync(FULL_MASK, i < n);
         i += (size_t)gridDim.x * blockDim.x, iter++) {
        int c = 0;
        if (i < n) {
            // Unrolled with a break: a word picked by an index the compiler cannot fold would
            // copy `words` into local memory (merge.cu).
#pragma unroll
            for (u32 w = 0; w < ORDER_SCAN_MAX_WORDS; w++) {
                if (w >= nwords || c != 0) break;
                const u32 a = words.w[w][i - 1], b = words.w[w][i];
                c = (a > b) - (a < b);
            }
            desc += c > 0;
            asc += c < 0;
            eq += c == 0;
        }
        // Where the descents are, while few have been: one atomic a warp, lanes in lane order.
        const u32 descending = __ballot_sync(FULL_MASK, c > 0);
        if (descending != 0 && !over) {
            u64 base = 0;
            if (lane == 0) base = atomicAdd((unsigned long long*)&counts[4], (unsigned long long)__popc(descending));
            base = __shfl_sync(FULL_MASK, base, 0);
            const u64 at = base + __popc(descending & ((1u << lane) - 1));
            if (c > 0 && at < ORDER_SCAN_MAX_DESCENTS) descents_at[at] = (u32)i;
            over = base + __popc(descending) > ORDER_SCAN_MAX_DESCENTS;
        }
        // The warp decides together: unordered as soon as any lane saw a descent and any lane
        // an ascent, past the descents recorded, or another warp said so (equal neighbours
        // beside descents alone are non-increasing input, which reverse_groups sorts).
        const bool any_desc = __any_sync(FULL_MASK, desc > 0);
        const bool any_asc = __any_sync(FULL_MASK, asc > 0);
        if (any_desc && any_asc && over) {
            if (lane == 0) *stop = 1;
            return;
        }
        // Another warp's verdict, every 16 rows a thread: a read of the flag each row put its
        // latency between every two loads and tripled the scan of sorted keys (0.05 -> 0.16 ms
        // for 10M two-word keys); random keys stop in their warp's first row anyway.
        if ((iter & 15) == 15 && __any_sync(FULL_MASK, *stop != 0)) return;
    }
    for (int d = 16; d > 0; d /= 2) {
        desc += __shfl_xor_sync(FULL_MASK, desc, d);
        asc += __shfl_xor_sync(FULL_MASK, asc, d);
        eq += __shfl_xor_sync(FULL_MASK, eq, d);
    }
    if (lane == 0) {
        if (desc) atomicAdd((unsigned long long*)&counts[0], (unsigned long long)desc);
        if (asc) atomicAdd((unsigned long long*)&counts[1], (unsigned long long)asc);
        if (eq) atomicAdd((unsigned long long*)&counts[2], (unsigned long long)eq);
    }
}

// The lanes reverse_lanes reverses, passed by value: each one's rows and their width in bytes.
struct ReverseLanes {
    u8* data[REVERSE_MAX_LANES];
    u32 width[REVERSE_MAX_LANES];
};

// Rows i and n - 1 - i of `rows` swapped for every i < n / 2, REVERSE_ITEMS rows a thread (a
// block's threads take consecutive rows), their loads all issued before the first store.
template <typename T>
__device__ __forceinline__ void reverse_items(T* rows, size_t n) {
    const size_t half = n / 2;
    const size_t step = (size_t)gridDim.x * blockDim.x * REVERSE_ITEMS;
    for (size_t base = (size_t)blockIdx.x * blockDim.x * REVERSE_ITEMS + threadIdx.x; base < half; base += step) {
        T a[REVERSE_ITEMS], b[REVERSE_ITEMS];
#pragma unroll
        for (u32 k = 0; k < REVERSE_ITEMS; k++) {
            const size_t i = base + (size_t)k * blockDim.x;
            if (i < half) {
                a[k] = rows[i];
                b[k] = rows[n - 1 - i];
            }
        }
#pragma unroll
        for (u32 k = 0; k < REVERSE_ITEMS; k++) {
            const size_t i = base + (size_t)k * blockDim.x;
            if (i < half) {
                rows[i] = b[k];
                rows[n - 1 - i] = a[k];
            }
        }
    }
}

// Rows of `width` bytes (a multiple of 4 other than 4, 8 and 16: Hybrid records) swapped word
// by word, a row a thread.
__device__ __forceinline__ void reverse_words(u32* rows, size_t n, u32 words) {
    const size_t half = n / 2;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < half; i += (size_t)gridDim.x * blockDim.x) {
        u32* a = rows + i * words;
        u32* b = rows + (n - 1 - i) * words;
        for (u32 k = 0; k < words; k++) {
            const u32 t = a[k];
            a[k] = b[k];
            b[k] = t;
        }
    }
}

// Every lane of `lanes` reversed in place (lane blockIdx.y), rows of 1, 2, 4, 8, 16 bytes or a
// multiple of 4 (the buffers are allocation-aligned). One launch for all lanes: launched one a
// lane, each thread swapping one row, the reversal ran at half a device copy's rate.
extern "C" __global__ void reverse_lanes(u32 n, ReverseLanes lanes) {
    u8* data = nullptr;
    u32 width = 0;
    // Picked by an unrolled comparison: an index the compiler cannot fold would copy `lanes`
    // into local memory.
#pragma unroll
    for (u32 l = 0; l < REVERSE_MAX_LANES; l++) {
        if (l == blockIdx.y) {
            data = lanes.data[l];
            width = lanes.width[l];
        }
    }
    switch (width) {
        case 1: reverse_items(data, n); break;
        case 2: reverse_items(reinterpret_cast<u16*>(data), n); break;
        case 4: reverse_items(reinterpret_cast<u32*>(data), n); break;
        case 8: reverse_items(reinterpret_cast<u64*>(data), n); break;
        case 16: reverse_items(reinterpret_cast<uint4*>(data), n); break;
        default: reverse_words(reinterpret_cast<u32*>(data), n, width / 4); break;
    }
}
extern "C" __global__ void reverse_iota(u32 n, u32* out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = n - 1 - (u32)i;
    }
}

// The key of row i: one word, or two (hi most significant).
__device__ __forceinline__ u64 distinct_key(const u32* hi, const u32* lo, size_t i) {
    return lo ? ((u64)hi[i] << 32) | lo[i] : (u64)hi[i];
}

// Where order_scan stopped (counts[3]), the keys of DISTINCT_SAMPLE rows spread evenly over the
// n rows, hashed into shared memory by one block of DISTINCT_BLOCK threads. With at most DISTINCT_MAX distinct among them it writes
// them in ascending order to `dict` and their number to counts[SCAN_DISTINCT]; else it leaves
// that word 0 (the host zeroes it first), and so does every block of distinct_ranks.
extern "C" __global__ void __launch_bounds__(DISTINCT_BLOCK)
    distinct_sample(u32 n, const u32* hi, const u32* lo, u64* dict, u64* counts) {
    // Where order_scan did not stop, it finds the rows sorted, reversed or in runs (or, rarely,
    // in no order it takes); few distinct keys are looked for only where it stopped.
    if (counts[3] == 0) return;
    // A slot holds EMPTY or a key; the key EMPTY itself is counted by a flag of its own.
    const u64 EMPTY = ~0ull;
    __shared__ u64 slots[DISTINCT_SLOTS];
    __shared__ u64 listed[DISTINCT_MAX];
    __shared__ u32 inserted, has_empty, nlisted;
    for (u32 s = threadIdx.x; s < DISTINCT_SLOTS; s += blockDim.x) slots[s] = EMPTY;
    if (threadIdx.x == 0) {
        inserted = 0;
        has_empty = 0;
        nlisted = 0;
    }
    __syncthreads();
    for (u32 s = threadIdx.x; s < DISTINCT_SAMPLE; s += blockDim.x) {
        // Past the limit the answer is known: random keys stop in the first round.
        if (*(volatile u32*)&inserted > DISTINCT_MAX) break;
        const u64 k = distinct_key(hi, lo, (size_t)s * n / DISTINCT_SAMPLE);
        if (k == EMPTY) {
            has_empty = 1;
            continue;
        }
        // Linear probing; the table has twice the sample's slots, so a free one is always found.
        u32 h = (u32)((k * 0x9E3779B97F4A7C15ull) >> 40) & (DISTINCT_SLOTS - 1);
        for (;;) {
            const u64 old = atomicCAS((unsigned long long*)&slots[h], (unsigned long long)EMPTY, (unsigned long long)k);
            if (old == EMPTY) {
                atomicAdd(&inserted, 1u);
                break;
            }
            if (old == k) break;
            h = (h + 1) & (DISTINCT_SLOTS - 1);
        }
    }
    __syncthreads();
    const u32 distinct = inserted + has_empty;
    if (distinct > DISTINCT_MAX) return;
    for (u32 s = threadIdx.x; s < DISTINCT_SLOTS; s += blockDim.x) {
        if (slots[s] != EMPTY) listed[atomicAdd(&nlisted, 1u)] = slots[s];
    }
    __syncthreads();
    if (threadIdx.x == 0 && has_empty) listed[distinct - 1] = EMPTY;
    __syncthreads();
    // Each key's place: the keys smaller than it (they are distinct).
    if (threadIdx.x < distinct) {
        const u64 k = listed[threadIdx.x];
        u32 rank = 0;
        for (u32 j = 0; j < distinct; j++) rank += listed[j] < k;
        dict[rank] = k;
    }
    if (threadIdx.x == 0) counts[SCAN_DISTINCT] = distinct;
}

// Every row's key looked up in the dictionary distinct_sample wrote (nothing to do where it
// wrote none). A key it lacks sets counts[SCAN_MISSING] and stops every thread; else, where
// `ranks` is given, row i's rank in the dictionary goes to ranks[i].
extern "C" __global__ void distinct_ranks(u32 n, const u32* hi, const u32* lo, const u64* dict, u64* counts,
                                          u32* ranks) {
    __shared__ u64 d[DISTINCT_MAX];
    const u32 m = (u32)counts[SCAN_DISTINCT];
    if (m == 0) return;
    for (u32 j = threadIdx.x; j < m; j += blockDim.x) d[j] = dict[j];
    __syncthreads();
    volatile u64* missing = counts + SCAN_MISSING;
    const u32 lane = threadIdx.x & 31;
    u32 iter = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; __any_sync(FULL_MASK, i < n);
         i += (size_t)gridDim.x * blockDim.x, iter++) {
        bool lacks = false;
        if (i < n) {
            const u64 k = distinct_key(hi, lo, i);
            // The first entry not below k.
            u32 at = 0, len = m;
            while (len > 0) {
                const u32 half = len / 2;
                if (d[at + half] < k) {
                    at += half + 1;
                    len -= half + 1;
                } else {
                    len = half;
                }
            }
            lacks = at == m || d[at] != k;
            if (ranks) ranks[i] = at;
        }
        if (__any_sync(FULL_MASK, lacks)) {
            if (lane == 0) *missing = 1;
            return;
        }
        if ((iter & 15) == 15 && __any_sync(FULL_MASK, *missing != 0)) return;
    }
}

// Row x's key against row y's: -1, 0 or 1 (the words of `words`, most significant first).
__device__ __forceinline__ int scan_cmp(const ScanWords& words, u32 nwords, size_t x, size_t y) {
#pragma unroll
    for (u32 w = 0; w < ORDER_SCAN_MAX_WORDS; w++) {
        if (w >= nwords) break;
        const u32 a = words.w[w][x], b = words.w[w][y];
        if (a != b) return a < b ? -1 : 1;
    }
    return 0;
}

// The first row of the group of equal keys that row `row` is in (keys non-increasing): a
// gallop back from it, then a binary search; a short group costs a load or two.
__device__ u32 group_start(const ScanWords& words, u32 nwords, u32 row) {
    u32 a = row, bound = 0, step = 1;
    while (a > 0) {
        const u32 probe = a > step ? a - step : 0;
        if (scan_cmp(words, nwords, probe, row) > 0) {
            bound = probe + 1;
            break;
        }
        a = probe;
        step *= 2;
    }
    // The first row of [bound, a] not above row's key (row a has it).
    u32 lo = bound, hi = a;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2;
        if (scan_cmp(words, nwords, mid, row) > 0) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// The row after the last of the group of equal keys that row `row` is in (or n): a gallop
// forward, then a binary search.
__device__ u32 group_end(const ScanWords& words, u32 nwords, u32 n, u32 row) {
    u32 a = row, bound = n, step = 1;
    while (a + 1 < n) {
        const u32 probe = (u32)min((u64)a + step, (u64)n - 1);
        if (scan_cmp(words, nwords, probe, row) < 0) {
            bound = probe;
            break;
        }
        a = probe;
        step *= 2;
    }
    // The first row of [a + 1, bound) below row's key, or bound (a row below it, or n).
    u32 lo = a + 1, hi = bound;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2;
        if (scan_cmp(words, nwords, mid, row) < 0) hi = mid; else lo = mid + 1;
    }
    return lo;
}

// perm[n - e + (i - s)] = i for every row i of non-increasing keys, [s, e) the rows of i's key
// (see the top). REVERSE_GROUPS_BLOCK threads, REVERSE_GROUPS_IPT consecutive rows each.
extern "C" __global__ void __launch_bounds__(REVERSE_GROUPS_BLOCK)
    reverse_groups(u32 n, ScanWords words, u32 nwords, u32* perm) {
    // Per thread: the last group start among its rows (or 0), the first (or n).
    __shared__ u32 last_start[REVERSE_GROUPS_BLOCK], first_start[REVERSE_GROUPS_BLOCK];
    __shared__ u32 edge[2];
    const u32 t0 = blockIdx.x * REVERSE_GROUPS_TILE;
    const u32 t1 = min(t0 + REVERSE_GROUPS_TILE, n);
    // The groups the tile's edges cut (two warps, beside the other threads' own rows).
    if (threadIdx.x == 0) edge[0] = group_start(words, nwords, t0);
    if (threadIdx.x == 32) edge[1] = group_end(words, nwords, n, t1 - 1);
    const u32 r0 = t0 + threadIdx.x * REVERSE_GROUPS_IPT;
    const u32 r1 = min(r0 + REVERSE_GROUPS_IPT, t1);
    // Group starts among this thread's rows: rows (past t0) whose key differs from the row before.
    u32 starts = 0, last = 0, first = n;
    for (u32 r = max(r0, t0 + 1); r < r1; r++) {
        if (scan_cmp(words, nwords, r - 1, r) != 0) {
            starts |= 1u << (r - r0);
            last = r;
            first = min(first, r);
        }
    }
    last_start[threadIdx.x] = last;
    first_start[threadIdx.x] = first;
    __syncthreads();
    // Inclusive max-scan of the last starts and suffix min-scan of the first starts (Hillis and
    // Steele over the block's threads).
    for (u32 d = 1; d < REVERSE_GROUPS_BLOCK; d *= 2) {
        const u32 l = threadIdx.x >= d ? last_start[threadIdx.x - d] : 0;
        const u32 f = threadIdx.x + d < REVERSE_GROUPS_BLOCK ? first_start[threadIdx.x + d] : n;
        __syncthreads();
        last_start[threadIdx.x] = max(last_start[threadIdx.x], l);
        first_start[threadIdx.x] = min(first_start[threadIdx.x], f);
        __syncthreads();
    }
    if (r0 >= r1) return;
    // The group start before this thread's rows, and the first start after them.
    u32 s = max(threadIdx.x > 0 ? last_start[threadIdx.x - 1] : 0, edge[0]);
    u32 after = threadIdx.x + 1 < REVERSE_GROUPS_BLOCK ? first_start[threadIdx.x + 1] : n;
    if (after >= t1) after = edge[1];
    // Each row's group end: the next start among its rows, else `after`.
    u32 ends[REVERSE_GROUPS_IPT];
    u32 e = after;
#pragma unroll
    for (int k = REVERSE_GROUPS_IPT - 1; k >= 0; k--) {
        ends[k] = e;
        if (starts >> k & 1) e = r0 + k;
    }
#pragma unroll
    for (u32 k = 0; k < REVERSE_GROUPS_IPT; k++) {
        const u32 r = r0 + k;
        if (r >= r1) break;
        if (starts >> k & 1) s = r;
        perm[n - ends[k] + (r - s)] = r;
    }
}
