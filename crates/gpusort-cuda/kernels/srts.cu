// srts.cu — SRTS, Merrill & Grimshaw's radix sort as extended to multifield records by
// Bandyopadhyay & Sahni ("Sorting Large Multifield Records on a GPU", section V). A fixed grid
// of persistent blocks each owns a contiguous run of tiles; one LSD pass over a digit is:
//
//   1. srts_upsweep (bottom-level reduction): each block counts the digits of its tiles;
//   2. srts_spine (top-level scan): one block scans the block counts, laid out digit-major,
//      into each (digit, block)'s first global position;
//   3. srts_downsweep (bottom-level scan): each block walks its tiles in order, ranks every
//      tile's elements, sorts the tile by digit in shared memory (the local scatter), writes
//      it out coalesced, and carries its running digit offsets to the next tile. Records move
//      here, in the last phase only (direct strategy), or only keys and row index (indirect).
//
// The digit counting of the upsweep is a shared-memory atomic per element into per-warp
// counters. Templates are instantiated for 16 bins (digits of up to 4 bits, the paper's) and 256 bins
// (up to 8 bits).
//
// The engine runs these three kernels only where it cannot run the pass as one sweep: when
// every digit has 5 to 8 bits and there are fewer than 2^30 rows, each pass is onesweep.cu's
// onesweep_pass_b8 instead (Adinets & Merrill's one-sweep pass with decoupled look-back): the
// downsweep's tile rank and scatter, with each tile's digit offsets found by looking back over
// the tiles before it rather than from an upsweep and a spine, and the digit counts of every
// pass from one histogram read of each key word. At 100M u32 keys on the H100 the upsweep and
// the spine cost ~0.19 ms of each ~1.03 ms pass (the upsweep reads the key word a second time);
// the one-sweep pass measured 0.88 ms (scripts/prototypes/proto_onesweep.py, NOTES.md "v8").
// Digits of up to 4 bits (16 bins) and n >= 2^30 (the look-back words hold 30-bit values) keep
// the three-kernel pass.

template <int BINS>
__device__ __forceinline__ void srts_upsweep_impl(u32 n, const u32* digit_word, u32 shift, u32 mask,
                                                  u32 tiles_per_block, u32 num_tiles, u32* block_counts) {
    __shared__ u32 counts[WARPS][BINS];
    for (u32 i = threadIdx.x; i < WARPS * BINS; i += BLOCK) (&counts[0][0])[i] = 0;
    __syncthreads();
    const u32 warp = threadIdx.x / 32;
    const u32 first = blockIdx.x * tiles_per_block;
    const u32 last = min(num_tiles, first + tiles_per_block);
    for (u32 tile = first; tile < last; tile++) {
        const size_t base = (size_t)tile * TILE;
        const u32 valid = (u32)min((size_t)TILE, (size_t)n - base);
        u32 d[IPT];
#pragma unroll
        for (u32 j = 0; j < IPT; j++) {
            const u32 e = j * BLOCK + threadIdx.x;
            d[j] = e < valid ? (digit_word[base + e] >> shift) & mask : BINS;
        }
#pragma unroll
        for (u32 j = 0; j < IPT; j++) {
            if (d[j] < BINS) atomicAdd(&counts[warp][d[j]], 1u);
        }
    }
    __syncthreads();
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) {
        u32 sum = 0;
#pragma unroll
        for (u32 w = 0; w < WARPS; w++) sum += counts[w][b];
        block_counts[(size_t)b * gridDim.x + blockIdx.x] = sum;
    }
}

template <int BINS>
__device__ __forceinline__ void srts_downsweep_impl(u32 n, const u32* digit_word, u32 shift, u32 mask,
                                                    u32 tiles_per_block, u32 num_tiles, const u32* block_offsets,
                                                    const Lane* lanes, u32 num_lanes, Records recs) {
    __shared__ RankSmem<BINS> s;
    extern __shared__ __align__(16) u8 stage[];
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) s.base[b] = block_offsets[(size_t)b * gridDim.x + blockIdx.x];
    __syncthreads();
    const u32 first = blockIdx.x * tiles_per_block;
    const u32 last = min(num_tiles, first + tiles_per_block);
    for (u32 tile = first; tile < last; tile++) {
        const size_t base = (size_t)tile * TILE;
        const u32 valid = (u32)min((size_t)TILE, (size_t)n - base);
        // Dynamic shared memory: the slots' positions (TILE u32), then the staging.
        rank_and_scatter_tile<BINS>(base, valid, digit_word, shift, mask, s, lanes, num_lanes, recs, stage,
                                    dynamic_smem_bytes() - TILE * 4);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) srts_upsweep_b4(u32 n, const u32* digit_word, u32 shift, u32 mask,
                                                                    u32 tiles_per_block, u32 num_tiles,
                                                                    u32* block_counts) {
    srts_upsweep_impl<16>(n, digit_word, shift, mask, tiles_per_block, num_tiles, block_counts);
}

extern "C" __global__ void __launch_bounds__(BLOCK) srts_upsweep_b8(u32 n, const u32* digit_word, u32 shift, u32 mask,
                                                                    u32 tiles_per_block, u32 num_tiles,
                                                                    u32* block_counts) {
    srts_upsweep_impl<256>(n, digit_word, shift, mask, tiles_per_block, num_tiles, block_counts);
}

extern "C" __global__ void __launch_bounds__(BLOCK) srts_spine(u32* block_counts, u32 len) {
    single_block_exclusive_scan(block_counts, len, 0);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 3)
    srts_downsweep_b4(u32 n, const u32* digit_word, u32 shift, u32 mask, u32 tiles_per_block, u32 num_tiles,
                      const u32* block_offsets, const Lane* lanes, u32 num_lanes, Records recs) {
    srts_downsweep_impl<16>(n, digit_word, shift, mask, tiles_per_block, num_tiles, block_offsets, lanes, num_lanes,
                            recs);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 3)
    srts_downsweep_b8(u32 n, const u32* digit_word, u32 shift, u32 mask, u32 tiles_per_block, u32 num_tiles,
                      const u32* block_offsets, const Lane* lanes, u32 num_lanes, Records recs) {
    srts_downsweep_impl<256>(n, digit_word, shift, mask, tiles_per_block, num_tiles, block_offsets, lanes, num_lanes,
                             recs);
}
