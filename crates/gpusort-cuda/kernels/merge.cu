// merge.cu — sorted runs merged on the device (issue 24): the runs of an external sort's merge
// step, or any rows the caller knows to be a few sorted runs, finish in a merge pass per
// doubling of the run length instead of a radix pass per digit.
//
// Ajdari et al., "A Version of Parallel Odd-Even Sorting Algorithm Implemented in CUDA Paradigm"
// (seed 003, sections 3 and 4), sort k blocks locally and then run k rounds of odd-even
// merge-split: in round r every block i with i = r (mod 2) is merged with block i + 1, the lower
// half of the merged rows going back to block i and the upper half to block i + 1; after k rounds
// the rows are sorted. Here the blocks are the caller's sorted runs (the local sort is done), and
// a merge-split of two neighbouring runs is one merge of both into the rows they cover (the
// runs keep their sizes, so "lower half" is the first |A| rows of the merge).
//
// The same merge serves the other schedule the host can run (merge.rs `MergeMethod`): a tree
// of merges that pairs runs 0-1, 2-3, ... and halves the run count each round (ceil(log2 k)
// rounds instead of k; the merge-path partitioning of Odeh et al. and Green et al.).
//
// A round is two kernels over a table of pairs (A, B) — A at row `start`, `a` rows, B right
// after it, `b` rows (0 for a run that has no partner this round and is copied) — cut into
// tiles of MERGE_TILE output rows:
//
// * merge_partition: for each tile, the rows of A among the pair's first d merged rows
//   (d the tile's first output row): a binary search along the diagonal d of the merge path,
//   taking A before B on equal keys (the merge is stable: A holds earlier rows).
// * merge_tiles: a block per tile loads the tile's rows of A and of B (bounded by the two
//   splits) into shared memory, each thread finds its own diagonal in them and merges
//   MERGE_IPT rows, writing where each output row comes from; then the block writes the key
//   words and the row index of the tile's output, coalesced.
//
// Keys are ByField words, word 0 most significant (the words that vary), each in an array of
// its own, compared word by word; the row index travels with them (`iota`: the first round
// takes the row's position instead of reading an index).

// MERGE_BLOCK (threads of a merge block), MERGE_IPT (rows a thread merges) and MERGE_MAX_WORDS
// come from the host (kernels.rs SHARED_CONSTANTS).
#if !defined(MERGE_BLOCK) || !defined(MERGE_IPT) || !defined(MERGE_MAX_WORDS)
#error "MERGE_BLOCK, MERGE_IPT and MERGE_MAX_WORDS come from the host"
#endif
#define MERGE_TILE (MERGE_BLOCK * MERGE_IPT)

// The key words of a round's input or output, passed by value.
struct MergeWords {
    u32* w[MERGE_MAX_WORDS];
};

// One pair of a round: A at rows [start, start + a), B at [start + a, start + a + b); its tiles
// are [tile0, tile0 + ceil((a + b) / MERGE_TILE)).
struct MergePair {
    u32 start, a, b, tile0;
};

// The pair that tile `t` belongs to: the last whose first tile is at most t.
__device__ __forceinline__ u32 pair_of(const MergePair* pairs, u32 npairs, u32 t) {
    u32 lo = 0, hi = npairs - 1;
    while (lo < hi) {
        const u32 mid = (lo + hi + 1) / 2;
        if (pairs[mid].tile0 <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The loops over key words are unrolled to MERGE_MAX_WORDS with a break: a word array picked by
// an index the compiler cannot fold makes it copy the kernel's pointer parameters into local
// memory, a copy per thread (measured: ~1.6 GB of local-memory traffic a round of 100M rows,
// more than the round's own reads and writes; kernels/NOTES.md).

// Whether global row x's key is below row y's.
__device__ __forceinline__ bool key_less(const MergeWords& k, u32 nwords, size_t x, size_t y) {
#pragma unroll
    for (u32 w = 0; w < MERGE_MAX_WORDS; w++) {
        if (w >= nwords) break;
        const u32 a = k.w[w][x], b = k.w[w][y];
        if (a != b) return a < b;
    }
    return false;
}

// splits[t]: the rows of A among the first d merged rows of tile t's pair, d = the tile's first
// output row in the pair. One thread a tile.
extern "C" __global__ void merge_partition(MergeWords keys, u32 nwords, const MergePair* pairs, u32 npairs,
                                           u32 ntiles, u32* splits) {
    const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= ntiles) return;
    const MergePair p = pairs[pair_of(pairs, npairs, t)];
    const u32 d = (t - p.tile0) * MERGE_TILE;
    u32 lo = d > p.b ? d - p.b : 0, hi = min(d, p.a);
    const size_t a0 = p.start, b0 = (size_t)p.start + p.a;
    while (lo < hi) {
        const u32 mid = (lo + hi) / 2;
        // A[mid] is among the first d rows unless B[d - 1 - mid] is below it (ties: A first).
        if (!key_less(keys, nwords, b0 + (d - 1 - mid), a0 + mid)) lo = mid + 1; else hi = mid;
    }
    splits[t] = lo;
}

// Whether shared row x's key is below shared row y's (words MERGE_TILE apart).
__device__ __forceinline__ bool tile_less(const u32* s, u32 nwords, u32 x, u32 y) {
    for (u32 w = 0; w < nwords; w++) {
        const u32 a = s[w * MERGE_TILE + x], b = s[w * MERGE_TILE + y];
        if (a != b) return a < b;
    }
    return false;
}

// One tile of a round's merges (see the top). Shared memory: (nwords + 1) * MERGE_TILE words
// (the key words and row indices of the tile's rows of A, then of B) and MERGE_TILE u16 (where
// each output row comes from).
extern "C" __global__ void __launch_bounds__(MERGE_BLOCK) merge_tiles(MergeWords in, MergeWords out, u32 nwords,
                                                                      const u32* idx_in, u32* idx_out, u32 iota,
                                                                      const MergePair* pairs, u32 npairs,
                                                                      const u32* splits) {
    extern __shared__ u32 smem[];
    u32* s_idx = smem + nwords * MERGE_TILE;
    u16* s_from = reinterpret_cast<u16*>(s_idx + MERGE_TILE);
    const u32 t = blockIdx.x;
    const MergePair p = pairs[pair_of(pairs, npairs, t)];
    const u32 total = p.a + p.b;
    const u32 d0 = (t - p.tile0) * MERGE_TILE;
    const u32 d1 = min(d0 + MERGE_TILE, total);
    const u32 i0 = splits[t];
    const u32 i1 = d1 == total ? p.a : splits[t + 1];
    const u32 j0 = d0 - i0, j1 = d1 - i1;
    const u32 na = i1 - i0, len = d1 - d0;
    const size_t a0 = (size_t)p.start + i0, b0 = (size_t)p.start + p.a + j0;
    for (u32 x = threadIdx.x; x < len; x += MERGE_BLOCK) {
        const size_t src = x < na ? a0 + x : b0 + (x - na);
#pragma unroll
        for (u32 w = 0; w < MERGE_MAX_WORDS; w++) {
            if (w >= nwords) break;
            smem[w * MERGE_TILE + x] = in.w[w][src];
        }
        s_idx[x] = iota ? (u32)src : idx_in[src];
    }
    __syncthreads();
    // This thread's diagonal in the tile, then its MERGE_IPT rows merged (B's rows are at
    // shared rows na + j).
    const u32 nb = len - na;
    const u32 d = min(threadIdx.x * MERGE_IPT, len);
    u32 lo = d > nb ? d - nb : 0, hi = min(d, na);
    while (lo < hi) {
        const u32 mid = (lo + hi) / 2;
        if (!tile_less(smem, nwords, na + (d - 1 - mid), mid)) lo = mid + 1; else hi = mid;
    }
    u32 i = lo, j = d - lo;
    const u32 end = min(d + MERGE_IPT, len);
    // The heads' most significant words stay in registers: a step loads only the word of the
    // row that replaces the one taken, and reads the others only when those words tie.
    u32 ha = i < na ? smem[i] : 0, hb = j < nb ? smem[na + j] : 0;
    for (u32 o = d; o < end; o++) {
        const bool take_a =
            i < na && (j >= nb || ha < hb || (ha == hb && !tile_less(smem, nwords, na + j, i)));
        s_from[o] = (u16)(take_a ? i : na + j);
        if (take_a) {
            i++;
            if (i < na) ha = smem[i];
        } else {
            j++;
            if (j < nb) hb = smem[na + j];
        }
    }
    __syncthreads();
    const size_t o0 = (size_t)p.start + d0;
    for (u32 x = threadIdx.x; x < len; x += MERGE_BLOCK) {
        const u32 from = s_from[x];
#pragma unroll
        for (u32 w = 0; w < MERGE_MAX_WORDS; w++) {
            if (w >= nwords) break;
            out.w[w][o0 + x] = smem[w * MERGE_TILE + from];
        }
        idx_out[o0 + x] = s_idx[from];
    }
}
