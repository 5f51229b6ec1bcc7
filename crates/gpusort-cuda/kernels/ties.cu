// ties.cu — rows whose truncated string prefixes tie, ordered on the device by the bytes past
// the prefix (issue 23). The radix sort orders rows by a key that keeps the first bytes of a
// string or binary sort column (gpusort::keys); rows equal up to there and longer form tie
// groups, contiguous ranges of sorted positions. When every later sort field is exact, the
// radix sort has already put a group's rows in the order of the later fields and then of the
// input row, so a stable sort of each group by the bytes past the prefix finishes it
// (gpusort::ties). Here that sort runs on the GPU, 8 bytes at a time:
//
// * ties_bmcs: many small groups in one launch, after Dieguez, Amor & Doallo's BPLG-BMCS
//   (seed 001: batches of small problems per block, each sorted in shared memory by a bitonic
//   merge network). The host packs groups back to back into batches of up to TIES_CAP rows; a
//   block loads a batch's rows into shared memory and sorts them by (run, next 8 bytes, bytes
//   left, place), where a run starts as the row's group and the place keeps the sort stable.
//   The runs still equal with bytes to come split off and take the next 8 bytes, round after
//   round, all in shared memory, until no run is left (or TIES_MAX_ROUNDS rounds: the block
//   then writes nothing and raises its flag, and the host finishes its groups).
// * groups larger than a batch: ties_keys writes, for each of their rows, the group's index,
//   the next 8 bytes (two words) and the bytes-left code; a stable radix sort of those words
//   with the row index (gpusort's own, sort.rs) orders every large group at once;
//   ties_scatter puts the rows back at their groups' positions. The runs still equal go round
//   again with the next 8 bytes, or to ties_bmcs once they fit a batch.
//
// Finding the groups comes first: ties_marks reads the sorted key words once and writes two
// bitmaps of the sorted rows, the rows whose key agrees with the row before them through the
// string field, and the rows whose value was cut at the prefix (gpusort::ties::TruncationTest).
// The host downloads those bits (2 bits a row, not the key's words) and reads the groups from
// them; the large groups' rounds find their runs still equal the same way.
//
// The kernels sort indices of the tied rows' tails (their bytes past the prefix), listed in
// sorted order, and ties_place then writes each tail's input row at its sorted position. The
// tails are read either from offsets and bytes the host gathered (ties.rs), or, when the column
// is a string or binary view column whose data buffers are on the device for the key's
// encoding (keys.cu's view fields), through the tied rows' views: nothing gathered on the host.

#if !defined(TIES_CAP) || !defined(TIES_BLOCK) || !defined(TIES_MAX_ROUNDS)
#error "defined by the host before the sources (kernels.rs SHARED_CONSTANTS)"
#endif

// The tails, passed by value. Gathered (offsets not null): tail k is
// data[offsets[k], offsets[k + 1]). Else through views: tail k is the bytes past the first
// `skip` of the value of the 16-byte view views[rows[k]] (length, 4-byte prefix, buffer index,
// offset; up to 12 bytes inline), whose data buffer is at buffers[buffer index].
// Through views, a tail also starts past the bytes its group's rows share beyond `skip`
// (shared[group_of[k]], found by ties_shared) when `shared` is not null.
struct ByteColumn {
    const long long* offsets;
    const u8* data;
    const u8* views;
    const u32* rows;
    const u8* const* buffers;
    const u32* group_of;
    const u32* shared;
    u32 skip;
    u32 pad;
};

// Where tail `k` starts, and its length.
__device__ __forceinline__ const u8* value_at(const ByteColumn& c, u32 k, u32& len) {
    if (c.offsets) {
        const long long a = c.offsets[k];
        len = (u32)(c.offsets[k + 1] - a);
        return c.data + a;
    }
    const u8* view = c.views + 16ull * c.rows[k];
    const u32 n = *reinterpret_cast<const u32*>(view);
    const u32 skip = c.skip + (c.shared ? c.shared[c.group_of[k]] : 0u);
    len = n > skip ? n - skip : 0;
    if (len == 0) return view;  // nothing past `skip`: no byte is read
    if (n <= 12) return view + 4 + skip;
    const u32 buffer = *reinterpret_cast<const u32*>(view + 8);
    const u32 offset = *reinterpret_cast<const u32*>(view + 12);
    return c.buffers[buffer] + offset + skip;
}

// The bytes each tie group's rows share past the column's `skip`, through views (col.shared
// null): a thread per listed tail k (of group group_of[k], whose first tail is firsts[group])
// takes the common prefix of its tail and its group's first, and the group keeps the least
// (shared starts at ~0). As gpusort-cuda's shared_bytes does on the host for gathered tails: a
// group of URLs that share a long path is then ordered from the bytes where they differ.
extern "C" __global__ void ties_shared(ByteColumn col, const u32* group_of, const u32* firsts, u32 m, u32* shared) {
    const u32 k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= m) return;
    const u32 g = group_of[k];
    const u32 f = firsts[g];
    if (f == k) return;
    u32 la, lb;
    const u8* a = value_at(col, k, la);
    const u8* b = value_at(col, f, lb);
    const u32 n = la < lb ? la : lb;
    u32 i = 0;
    while (i < n && a[i] == b[i]) i++;
    atomicMin(&shared[g], i);
}

// Bytes [skip, skip + 8) of a value of `len` bytes at `p`, big-endian and zero-padded, and how
// many bytes it has from `skip` on, at most 9 (9: more than these 8).
__device__ __forceinline__ u64 tail_word(const u8* p, u32 len, u32 skip, u32& left) {
    const u32 rest = len > skip ? len - skip : 0;
    left = rest < 9 ? rest : 9;
    const u32 take = rest < 8 ? rest : 8;
    u64 w = 0;
#pragma unroll
    for (u32 i = 0; i < 8; i++) w = (w << 8) | (i < take ? (u64)p[skip + i] : 0ull);
    return w;
}

// The 8 bytes and bytes-left code a row sorts by at `skip`, in the column's direction: bytes
// flipped when descending, and the code 9 - left, so that a longer value comes first.
__device__ __forceinline__ u64 tail_key(const ByteColumn& c, u32 row, u32 skip, u32 descending, u32& code) {
    u32 len, left;
    const u8* p = value_at(c, row, len);
    const u64 w = tail_word(p, len, skip, left);
    code = descending ? 9 - left : left;
    return descending ? ~w : w;
}

// ---- small groups: batched bitonic merge sorts in shared memory ----

// A group of a batch: its first sorted position, rows, and where its rows start in the batch.
struct TieSeg {
    u32 start;
    u32 len;
    u32 tile_off;
    u32 pad;
};

// A batch: its groups [first, first + count) of the segment table, and their rows in all.
struct TieBatch {
    u32 first;
    u32 count;
    u32 rows;
    u32 pad;
};

// A row's tag in the batch's sort: its run's first place (bits 31..16), its bytes-left code
// (15..12; INACTIVE once its run is finished) and its place in the batch (11..0). Rows compare
// by (run, 8 bytes, code, place).
#define TAG_RUN(t) ((t) >> 16)
#define TAG_CODE(t) (((t) >> 12) & 15u)
#define TAG_PLACE(t) ((t) & 0xfffu)
#define INACTIVE 15u
static_assert(TIES_CAP <= 4096, "a place takes 12 bits of a tag");

__device__ __forceinline__ bool tie_greater(u32 ta, u64 ka, u32 tb, u64 kb) {
    if (TAG_RUN(ta) != TAG_RUN(tb)) return TAG_RUN(ta) > TAG_RUN(tb);
    if (ka != kb) return ka > kb;
    return (ta & 0xffffu) > (tb & 0xffffu);
}

// The segment of the batch that holds place `i` (the last whose tile_off <= i).
__device__ __forceinline__ const TieSeg& seg_of(const TieSeg* segs, const TieBatch& b, u32 i) {
    u32 lo = b.first, hi = b.first + b.count - 1;
    while (lo < hi) {
        const u32 mid = (lo + hi + 1) / 2;
        if (segs[mid].tile_off <= i) lo = mid;
        else hi = mid - 1;
    }
    return segs[lo];
}

// Bitonic sort of the first `p` (a power of two) keys and tags in shared memory.
__device__ __forceinline__ void bitonic_sort(u64* key, u32* tag, u32 p) {
    for (u32 k = 2; k <= p; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 t = threadIdx.x; t < p / 2; t += TIES_BLOCK) {
                const u32 i = 2 * t - (t & (j - 1));
                const u32 l = i + j;
                const bool up = (i & k) == 0;
                const u32 ti = tag[i], tl = tag[l];
                const u64 ki = key[i], kl = key[l];
                if (tie_greater(ti, ki, tl, kl) == up) {
                    tag[i] = tl;
                    tag[l] = ti;
                    key[i] = kl;
                    key[l] = ki;
                }
            }
            __syncthreads();
        }
    }
}

// Inclusive max-scan of the first `n` words of `s` (n <= TIES_CAP), each thread a run of
// consecutive words.
__device__ __forceinline__ void block_max_scan(u32* s, u32 n, u32* s_warp) {
    constexpr u32 PER = TIES_CAP / TIES_BLOCK;
    const u32 lo = threadIdx.x * PER;
    u32 m = 0;
    for (u32 i = lo; i < lo + PER && i < n; i++) {
        m = max(m, s[i]);
        s[i] = m;
    }
    // The threads' maxima scanned across the block: within warps by shuffles, then warps.
    u32 incl = m;
#pragma unroll
    for (u32 d = 1; d < 32; d <<= 1) {
        const u32 v = __shfl_up_sync(FULL_MASK, incl, d);
        if ((threadIdx.x & 31) >= d) incl = max(incl, v);
    }
    if ((threadIdx.x & 31) == 31) s_warp[threadIdx.x / 32] = incl;
    __syncthreads();
    if (threadIdx.x < 32) {
        u32 w = threadIdx.x < TIES_BLOCK / 32 ? s_warp[threadIdx.x] : 0;
#pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            const u32 v = __shfl_up_sync(FULL_MASK, w, d);
            if (threadIdx.x >= d) w = max(w, v);
        }
        if (threadIdx.x < TIES_BLOCK / 32) s_warp[threadIdx.x] = w;
    }
    __syncthreads();
    // What the threads before this one saw.
    u32 before = __shfl_up_sync(FULL_MASK, incl, 1);
    if ((threadIdx.x & 31) == 0) before = 0;
    if (threadIdx.x >= 32) before = max(before, s_warp[threadIdx.x / 32 - 1]);
    for (u32 i = lo; i < lo + PER && i < n; i++) s[i] = max(s[i], before);
    __syncthreads();
}

// One block per batch: the batch's groups, which share their first `skip` bytes and go on,
// ordered by the rest of their bytes, stably; `perm` (sorted position -> input row) rewritten
// at their positions. After TIES_MAX_ROUNDS rounds with runs still equal, nothing is written
// and unfinished[batch] is set.
extern "C" __global__ void __launch_bounds__(TIES_BLOCK)
    ties_bmcs(ByteColumn col, const TieBatch* batches, const TieSeg* segs, u32* perm, u32 skip, u32 descending,
              u32* unfinished) {
    __shared__ u64 key[TIES_CAP];
    __shared__ u32 tag[TIES_CAP];
    __shared__ u32 rows[TIES_CAP];  // by place
    __shared__ u32 scan[TIES_CAP];
    __shared__ u8 head[TIES_CAP];
    __shared__ u8 active[TIES_CAP];
    __shared__ u32 s_warp[TIES_BLOCK / 32];
    const TieBatch b = batches[blockIdx.x];
    const u32 n = b.rows;
    u32 p = 2;
    while (p < n) p <<= 1;
    for (u32 i = threadIdx.x; i < n; i += TIES_BLOCK) {
        const TieSeg& s = seg_of(segs, b, i);
        rows[i] = perm[s.start + (i - s.tile_off)];
        tag[i] = (s.tile_off << 16) | i;
        active[i] = 1;
    }
    __syncthreads();
    const u32 more = descending ? 0 : 9;
    for (u32 round = 0;; round++) {
        for (u32 i = threadIdx.x; i < p; i += TIES_BLOCK) {
            if (i >= n) {
                key[i] = ~0ull;
                tag[i] = ~0u;
            } else if (active[i]) {
                u32 code;
                const u32 t = tag[i];
                key[i] = tail_key(col, rows[TAG_PLACE(t)], skip + 8 * round, descending, code);
                tag[i] = (t & 0xffff0fffu) | (code << 12);
            } else {
                key[i] = 0;
                tag[i] |= INACTIVE << 12;
            }
        }
        __syncthreads();
        bitonic_sort(key, tag, p);
        // Where runs of equal (run, bytes, code) start, and each row's run.
        for (u32 i = threadIdx.x; i < n; i += TIES_BLOCK) {
            const u32 t = tag[i];
            const bool h = i == 0 || (t ^ tag[i - 1]) >> 12 != 0 || key[i] != key[i - 1];
            head[i] = h;
            scan[i] = h ? i : 0;
        }
        __syncthreads();
        block_max_scan(scan, n, s_warp);
        bool any = false;
        for (u32 i = threadIdx.x; i < n; i += TIES_BLOCK) {
            const bool paired = !head[i] || (i + 1 < n && !head[i + 1]);
            const bool a = paired && TAG_CODE(tag[i]) == more;
            active[i] = a;
            any |= a;
            tag[i] = (scan[i] << 16) | (tag[i] & 0xfffu);
        }
        if (!__syncthreads_or(any)) break;
        if (round + 1 == TIES_MAX_ROUNDS) {
            if (threadIdx.x == 0) unfinished[blockIdx.x] = 1;
            return;
        }
    }
    for (u32 i = threadIdx.x; i < n; i += TIES_BLOCK) {
        const TieSeg& s = seg_of(segs, b, i);
        perm[s.start + (i - s.tile_off)] = rows[TAG_PLACE(tag[i])];
    }
}

// ---- large groups: a radix sort of (group, next 8 bytes, bytes left) ----

// A large group: its first sorted position, rows, and its first row among all large groups'.
struct TieGroup {
    u32 start;
    u32 len;
    u32 first;
    u32 pad;
};

// The group that holds row k of all large groups' rows (the last whose first <= k).
__device__ __forceinline__ u32 group_of(const TieGroup* g, u32 count, u32 k) {
    u32 lo = 0, hi = count - 1;
    while (lo < hi) {
        const u32 mid = (lo + hi + 1) / 2;
        if (g[mid].first <= k) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// For each of the m rows of the large groups, its key words, most significant first: the
// group's index, the next 8 bytes from `skip` (two words), the bytes-left code; and the input
// row (perm at its position).
extern "C" __global__ void ties_keys(ByteColumn col, const TieGroup* groups, u32 count, u32 m, const u32* perm,
                                     u32 skip, u32 descending, u32* w0, u32* w1, u32* w2, u32* w3, u32* rows) {
    for (u32 k = blockIdx.x * blockDim.x + threadIdx.x; k < m; k += gridDim.x * blockDim.x) {
        const u32 g = group_of(groups, count, k);
        const u32 row = perm[groups[g].start + (k - groups[g].first)];
        u32 code;
        const u64 w = tail_key(col, row, skip, descending, code);
        w0[k] = g;
        w1[k] = (u32)(w >> 32);
        w2[k] = (u32)w;
        w3[k] = code;
        rows[k] = row;
    }
}

// The sorted rows back at their groups' positions: a group's rows stay together and in order
// after the sort by group first.
extern "C" __global__ void ties_scatter(const TieGroup* groups, u32 count, u32 m, const u32* rows, u32* perm) {
    for (u32 k = blockIdx.x * blockDim.x + threadIdx.x; k < m; k += gridDim.x * blockDim.x) {
        const TieGroup& g = groups[group_of(groups, count, k)];
        perm[g.start + (k - g.first)] = rows[k];
    }
}

// ---- the gathered tails ----

// The groups' rows back in the permutation: the groups were ordered as ranges of `ks`, the
// indices of the gathered tails (group g's at [first, first + len)), and tail k is input row
// krow[k]; group g's sorted positions start at g.start.
extern "C" __global__ void ties_place(const TieGroup* groups, u32 count, u32 m, const u32* ks, const u32* krow,
                                      u32* perm) {
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < m; j += gridDim.x * blockDim.x) {
        const TieGroup& g = groups[group_of(groups, count, j)];
        perm[g.start + (j - g.first)] = krow[ks[j]];
    }
}

// ---- finding the groups ----

// One key word of the sorted rows, as ties_marks reads it: row i's word is p[i & rows], so a
// word that does not vary (rows = 0) is one value; `mask` holds the word's bits that a tie
// compares (0: none).
struct MarkWord {
    const u32* p;
    u32 mask;
    u32 rows;
};

// `nbits` (1 to 32) bits of row i's key from bit `g` (counted from word 0's most significant bit).
__device__ __forceinline__ u32 key_bits(const MarkWord* words, u32 i, u32 g, u32 nbits) {
    const u32 w = g / 32, off = g % 32;
    u64 v = (u64)words[w].p[i & words[w].rows] << 32;
    if (off + nbits > 32) v |= words[w + 1].p[i & words[w + 1].rows];
    return (u32)((v << off) >> (64 - nbits));
}

// For each sorted row i of n: bit i of `agree` when its key equals row i - 1's under every word's
// mask, and bit i of `marked` when its null flag (if has_null: the bit at null_bit) is `present`
// and its len_bits bits at len_bit equal `code` (len_bits 0: when code is not 0). A warp writes
// one word of each bitmap per 32 rows.
extern "C" __global__ void ties_marks(const MarkWord* words, u32 nwords, u32 n, u32 has_null, u32 null_bit,
                                      u32 present, u32 len_bit, u32 len_bits, u32 code, u32* agree, u32* marked) {
    const u32 lane = threadIdx.x % 32;
    const u32 stride = gridDim.x * blockDim.x;
    for (u32 first = (blockIdx.x * blockDim.x + threadIdx.x) - lane; first < n; first += stride) {
        const u32 i = first + lane;
        bool same = false, mark = false;
        if (i < n) {
            same = i > 0;
            for (u32 w = 0; w < nwords && same; w++) {
                const MarkWord k = words[w];
                same = ((k.p[i & k.rows] ^ k.p[(i - 1) & k.rows]) & k.mask) == 0;
            }
            mark = !has_null || key_bits(words, i, null_bit, 1) == present;
            mark = mark && (len_bits == 0 ? code != 0 : key_bits(words, i, len_bit, len_bits) == code);
        }
        const u32 a = __ballot_sync(0xffffffffu, same);
        const u32 m = __ballot_sync(0xffffffffu, mark);
        if (lane == 0) {
            agree[first / 32] = a;
            marked[first / 32] = m;
        }
    }
}
