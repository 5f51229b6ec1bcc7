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
//   the rows reversed (stable, as no two keys are equal). The first ORDER_SCAN_MAX_DESCENTS
//   descents also record where they are: with no more than that, the rows are that many + 1
//   ascending runs, which the host merges (merge.cu, seed 003) instead of sorting. A warp that
//   sees both a descent and an ascent (or an equal pair) once more descents than that are
//   recorded raises a flag that stops every thread.
// * reverse_rows: rows i and n - 1 - i swapped in place for i < n / 2 (key words, columns and
//   Hybrid records alike, `width` bytes a row);
// * reverse_iota: the permutation of reversed rows, n - 1 - i.
//
// Each thread walks rows with a grid stride; order_scan's warps combine their counts with
// shuffles and one lane per warp adds them to the totals.

// The most key words order_scan compares (a longer key takes the radix passes unscanned); the
// host defines it (kernels.rs SHARED_CONSTANTS).
#if !defined(ORDER_SCAN_MAX_WORDS) || !defined(ORDER_SCAN_MAX_DESCENTS)
#error "ORDER_SCAN_MAX_WORDS and ORDER_SCAN_MAX_DESCENTS come from the host"
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
        // an ascent or an equal pair, past the descents recorded, or another warp said so.
        const bool any_desc = __any_sync(FULL_MASK, desc > 0);
        const bool any_other = __any_sync(FULL_MASK, asc > 0 || eq > 0);
        if (any_desc && any_other && over) {
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

// Rows i and n - 1 - i of `data` swapped for every i < n / 2; rows of `width` bytes, moved as
// words when `width` is a multiple of 4 (the buffers are allocation-aligned).
extern "C" __global__ void reverse_rows(u8* data, u32 n, u32 width) {
    const size_t half = n / 2;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < half; i += (size_t)gridDim.x * blockDim.x) {
        u8* a = data + i * width;
        u8* b = data + (n - 1 - i) * (size_t)width;
        if (width % 4 == 0) {
            u32* wa = reinterpret_cast<u32*>(a);
            u32* wb = reinterpret_cast<u32*>(b);
            for (u32 k = 0; k < width / 4; k++) {
                const u32 t = wa[k];
                wa[k] = wb[k];
                wb[k] = t;
            }
        } else {
            for (u32 k = 0; k < width; k++) {
                const u8 t = a[k];
                a[k] = b[k];
                b[k] = t;
            }
        }
    }
}

extern "C" __global__ void reverse_iota(u32 n, u32* out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = n - 1 - (u32)i;
    }
}
