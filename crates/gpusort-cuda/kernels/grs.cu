// grs.cu — GRS, the GPU radix sort for multifield records of Bandyopadhyay & Sahni
// ("Sorting Large Multifield Records on a GPU", section VI; details in "GRS - GPU Radix Sort
// For Multifield Records", sections III and VI). One LSD pass over a digit of a key word is
// three phases:
//
//   1. grs_rank: per tile, the histogram of the digit and each element's rank among the
//      tile's elements with the same digit (kept in 16 bits: a tile has at most 65536 rows);
//   2. scan_*: an exclusive scan of the tile histograms laid out digit-major, which gives each
//      (digit, tile) its first global position;
//   3. grs_scatter: per tile, records are placed by rank in shared memory, sorted by digit
//      within the tile, and written out coalesced (every moved column: direct strategy keys
//      and payload, or keys and row index for the indirect strategy).
//
// Templates are instantiated for 16 bins (digits of up to 4 bits, the paper's) and 256 bins
// (up to 8 bits).

template <int BINS>
__device__ __forceinline__ void grs_rank_impl(u32 n, const u32* digit_word, u32 shift, u32 mask, u16* ranks,
                                              u32* hist, u32 num_tiles) {
    __shared__ RankSmem<BINS> s;
    const u32 tile = blockIdx.x;
    const size_t base = (size_t)tile * TILE;
    const u32 valid = (u32)min((size_t)TILE, (size_t)n - base);
    u32 d[IPT], pos[IPT];
    load_digits<BINS>(digit_word, base, valid, shift, mask, d);
    tile_rank<BINS, IPT, u32, BLOCK, false>(d, pos, s);  // (folded, it took 75 registers, not 63)
#pragma unroll
    for (u32 j = 0; j < IPT; j++) {
        const u32 e = tile_elem(j);
        if (e < valid) ranks[base + e] = (u16)(pos[j] - s.r.bin_start[d[j]]);
    }
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) hist[(size_t)b * num_tiles + tile] = s.r.bin_count[b];
}

template <int BINS>
__device__ __forceinline__ void grs_scatter_impl(u32 n, const u32* digit_word, u32 shift, u32 mask,
                                                 const u16* ranks, const u32* hist, const u32* offsets,
                                                 u32 num_tiles, const Lane* lanes, u32 num_lanes, Records recs) {
    __shared__ RankSmem<BINS> s;
    extern __shared__ __align__(16) u8 stage[];
    const u32 tile = blockIdx.x;
    const size_t base = (size_t)tile * TILE;
    const u32 valid = (u32)min((size_t)TILE, (size_t)n - base);
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) {
        s.r.bin_count[b] = hist[(size_t)b * num_tiles + tile];
        s.base[b] = offsets[(size_t)b * num_tiles + tile];
    }
    __syncthreads();
    scan_bins<BINS, BLOCK>(s.r.bin_count, s.r.bin_start, s.r.scan);
    u32 pos[IPT];
#pragma unroll
    for (u32 j = 0; j < IPT; j++) {
        const u32 e = tile_elem(j);
        pos[j] = e < valid ? s.r.bin_start[(digit_word[base + e] >> shift) & mask] + ranks[base + e] : 0;
    }
    // Dynamic shared memory: the slots' positions (TILE u32), then the staging.
    scatter_tile<BINS>(base, valid, digit_word, shift, mask, pos, s, lanes, num_lanes, recs, stage,
                       dynamic_smem_bytes() - TILE * 4);
}

extern "C" __global__ void __launch_bounds__(BLOCK) grs_rank_b4(u32 n, const u32* digit_word, u32 shift, u32 mask,
                                                                u16* ranks, u32* hist, u32 num_tiles) {
    grs_rank_impl<16>(n, digit_word, shift, mask, ranks, hist, num_tiles);
}

extern "C" __global__ void __launch_bounds__(BLOCK) grs_rank_b8(u32 n, const u32* digit_word, u32 shift, u32 mask,
                                                                u16* ranks, u32* hist, u32 num_tiles) {
    grs_rank_impl<256>(n, digit_word, shift, mask, ranks, hist, num_tiles);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 2)
    grs_scatter_b4(u32 n, const u32* digit_word, u32 shift, u32 mask, const u16* ranks, const u32* hist,
                   const u32* offsets, u32 num_tiles, const Lane* lanes, u32 num_lanes, Records recs) {
    grs_scatter_impl<16>(n, digit_word, shift, mask, ranks, hist, offsets, num_tiles, lanes, num_lanes, recs);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 2)
    grs_scatter_b8(u32 n, const u32* digit_word, u32 shift, u32 mask, const u16* ranks, const u32* hist,
                   const u32* offsets, u32 num_tiles, const Lane* lanes, u32 num_lanes, Records recs) {
    grs_scatter_impl<256>(n, digit_word, shift, mask, ranks, hist, offsets, num_tiles, lanes, num_lanes, recs);
}

// GRS phase 2: the exclusive scan of the (digit-major) tile histograms, for any length, in
// three launches: per-chunk sums, a one-block scan of the sums, and a scan of each chunk from
// its scanned sum. A chunk is TILE values.

extern "C" __global__ void __launch_bounds__(BLOCK) scan_reduce(const u32* data, u32 n, u32* chunk_sums) {
    __shared__ u32 s_warp[WARPS];
    const size_t base = (size_t)blockIdx.x * TILE;
    u32 sum = 0;
    for (u32 i = threadIdx.x; i < TILE; i += BLOCK) {
        if (base + i < n) sum += data[base + i];
    }
    u32 total;
    block_exclusive_scan(sum, s_warp, &total);
    if (threadIdx.x == 0) chunk_sums[blockIdx.x] = total;
}

extern "C" __global__ void __launch_bounds__(BLOCK) scan_spine(u32* data, u32 n) {
    single_block_exclusive_scan(data, n, 0);
}

extern "C" __global__ void __launch_bounds__(BLOCK) scan_down(const u32* data, u32 n, const u32* chunk_prefix,
                                                              u32* out) {
    __shared__ u32 s_warp[WARPS];
    const size_t base = (size_t)blockIdx.x * TILE;
    // Each thread scans IPT consecutive values of the chunk.
    u32 v[IPT];
    u32 sum = 0;
#pragma unroll
    for (u32 j = 0; j < IPT; j++) {
        const size_t i = base + threadIdx.x * IPT + j;
        v[j] = i < n ? data[i] : 0;
        sum += v[j];
    }
    u32 total;
    u32 run = block_exclusive_scan(sum, s_warp, &total) + chunk_prefix[blockIdx.x];
#pragma unroll
    for (u32 j = 0; j < IPT; j++) {
        const size_t i = base + threadIdx.x * IPT + j;
        if (i < n) out[i] = run;
        run += v[j];
    }
}
