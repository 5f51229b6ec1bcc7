// onesweep.cu — the one-sweep LSD radix sort of Adinets & Merrill ("Onesweep: A Faster Least
// Significant Digit Radix Sort for GPUs", 2022; CUB's DeviceRadixSort), used here as the
// single-kernel form of SRTS's pass (srts.cu). It is not in Bandyopadhyay & Sahni's paper. SRTS
// reads the digit word of every pass twice (upsweep, then downsweep); one-sweep reads it once
// per pass plus once in all for the counts of every digit position:
//
//   1. onesweep_histogram: one read of the key word counts the digits of up to four 8-bit
//      digit positions at once, into hist[digit position][256];
//   2. onesweep_scan: an exclusive scan of each position's 256 counts: where each digit's rows
//      start in the output of that position's pass (the same for every pass, since a pass only
//      permutes the rows);
//   3. onesweep_pass_b8, once per pass: each block takes the next tile, ranks it (the tile rank
//      of SRTS, common.cuh), finds where each of its digits goes from the tiles before it by
//      decoupled look-back (Merrill & Garland's single-pass scan) instead of an upsweep and a
//      spine, and writes the tile out through shared memory (the tile scatter of SRTS).
//
// Look-back state: one 32-bit word per (tile, digit), the value in the low 30 bits and the flag
// in the top 2: 0 = not yet published, AGGREGATE = the tile's own count of the digit, INCLUSIVE
// = the digit's global position after this tile (its rows included). A value is at most n, so
// n must be below 2^30 rows (the host checks, onesweep.rs `onesweep_plan`, and runs SRTS's three
// kernels otherwise, as it does for digits of up to 4 bits: only a 256-bin pass is compiled).

// From the host: ONESWEEP_VALUE (2^30 - 1, the value bits), ONESWEEP_MAX_DIGITS (digit
// positions one histogram launch counts), ONESWEEP_HIST_IPT (keys per thread loaded before they
// are counted), ONESWEEP_IPT and ONESWEEP_BLOCK (below).
#if !defined(ONESWEEP_VALUE) || !defined(ONESWEEP_MAX_DIGITS) || !defined(ONESWEEP_HIST_IPT) || \
    !defined(ONESWEEP_IPT) || !defined(ONESWEEP_BLOCK)
#error "defined by the host before the sources (kernels.rs SHARED_CONSTANTS, KernelTuning::defines)"
#endif
#define ONESWEEP_AGGREGATE 0x40000000u
#define ONESWEEP_INCLUSIVE 0x80000000u
#define ONESWEEP_FLAGS 0xc0000000u

// ---- 1. the digit counts of every pass in one read ----

// Grid-stride over chunks of BLOCK * ONESWEEP_HIST_IPT keys (launch a persistent grid). Digit i
// (i < digits) of a key is (key >> shift_i) & ((1 << bits_i) - 1), shift_i = byte i of
// `shifts` and bits_i (1 to 8) = byte i of `widths` (for 8-bit digits from bit 0: shifts =
// 0x18100800, widths = 0x08080808; the passes of one word may differ in width, e.g. 6, 6, 5).
// Counts go to per-warp shared counters (32 KB), then once per block to hist[i * 256 + digit]
// by global atomics: hist must be zeroed.
extern "C" __global__ void __launch_bounds__(BLOCK)
    onesweep_histogram(u32 n, const u32* keys, u32 shifts, u32 digits, u32 widths, u32* hist) {
    __shared__ u32 counts[WARPS][ONESWEEP_MAX_DIGITS][256];
    for (u32 i = threadIdx.x; i < WARPS * ONESWEEP_MAX_DIGITS * 256; i += BLOCK) (&counts[0][0][0])[i] = 0;
    __syncthreads();
    u32(*mine)[256] = counts[threadIdx.x / 32];
    u32 sh[ONESWEEP_MAX_DIGITS], mask[ONESWEEP_MAX_DIGITS];
#pragma unroll
    for (u32 i = 0; i < ONESWEEP_MAX_DIGITS; i++) {
        sh[i] = (shifts >> (8 * i)) & 31u;
        mask[i] = (1u << min((widths >> (8 * i)) & 15u, 8u)) - 1u;
    }
    const size_t chunk = (size_t)BLOCK * ONESWEEP_HIST_IPT;
    for (size_t base = (size_t)blockIdx.x * chunk; base < n; base += (size_t)gridDim.x * chunk) {
        // All loads of the chunk in flight before the first count.
        u32 k[ONESWEEP_HIST_IPT];
#pragma unroll
        for (u32 j = 0; j < ONESWEEP_HIST_IPT; j++) {
            const size_t e = base + j * BLOCK + threadIdx.x;
            k[j] = e < n ? keys[e] : 0;
        }
#pragma unroll
        for (u32 j = 0; j < ONESWEEP_HIST_IPT; j++) {
            if (base + j * BLOCK + threadIdx.x >= n) break;
#pragma unroll
            for (u32 i = 0; i < ONESWEEP_MAX_DIGITS; i++) {
                if (i < digits) atomicAdd(&mine[i][(k[j] >> sh[i]) & mask[i]], 1u);
            }
        }
    }
    __syncthreads();
    for (u32 x = threadIdx.x; x < digits * 256; x += BLOCK) {
        u32 sum = 0;
#pragma unroll
        for (u32 w = 0; w < WARPS; w++) sum += (&counts[w][0][0])[x];
        if (sum) atomicAdd(&hist[x], sum);
    }
}

// ---- 2. the global digit offsets of every pass ----

// One block per digit position (grid = digits): hist[blockIdx.x * 256 + d] becomes the number of
// rows with a smaller digit at that position, i.e. where digit d's rows start after the pass.
// When `constant` is not null, constant[blockIdx.x] is set to 1 if all n rows have one digit at
// that position (some bin counted n) and to 0 otherwise: such a pass would only copy the rows,
// so the host may read these words back (one 16-byte download) and drop the pass, swapping the
// roles of the buffers it would have written (the next pass reads what this one would have
// read). Call it with n > 0.
extern "C" __global__ void __launch_bounds__(BLOCK) onesweep_scan(u32* hist, u32 n, u32* constant) {
    static_assert(BLOCK == 256, "one thread per bin");
    __shared__ u32 s_warp[WARPS];
    u32* h = hist + (size_t)blockIdx.x * 256;
    const u32 v = h[threadIdx.x];
    u32 total;
    h[threadIdx.x] = block_exclusive_scan(v, s_warp, &total);
    const int all_one_bin = __syncthreads_or(v == n);
    if (constant != nullptr && threadIdx.x == 0) constant[blockIdx.x] = all_one_bin ? 1u : 0u;
}

// ---- 3. the pass ----

// Look-back accesses. Each look-back word is written only by its tile's thread for that digit,
// by whole 32-bit stores (0 -> AGGREGATE|count -> INCLUSIVE|prefix), and a reader needs nothing
// but the word itself: flag and value travel in one word, so no other memory is published
// through the flag and no fence or acquire/release pair is needed between them. What is needed
// is that the spin sees other blocks' stores at all and never a torn word: relaxed loads and
// stores at GPU scope (morally strong, single-copy atomic 32-bit accesses, coherent in L2)
// give exactly that, and by coherence a reader that saw a flag never reads an older value of
// that word again. The zeroing of the words (a memset before the launch) is ordered before the
// kernel by the stream.
__device__ __forceinline__ u32 onesweep_load(const u32* p) {
    u32 v;
    asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void onesweep_store(u32* p, u32 v) {
    asm volatile("st.relaxed.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Where the rows of digit d of `tile` start in the output: walk back over the predecessors' words,
// adding AGGREGATE values and going on, adding an INCLUSIVE value (which counts the digit's
// global offset, digit_offsets[d], and every row of the digit up to that tile) and stopping
// there, waiting while a word on the way is unpublished. Tile 0 publishes INCLUSIVE directly, so
// the walk ends. The words of ONESWEEP_LOOKBACK_WINDOW predecessors are loaded at once, so a long
// walk (tiles taken together, none of them inclusive yet) costs one L2 round trip per window
// instead of one per tile; a word loaded before its tile published it is loaded again.
#ifndef ONESWEEP_LOOKBACK_WINDOW
#define ONESWEEP_LOOKBACK_WINDOW 8
#endif
__device__ __forceinline__ u32 onesweep_look_back(const u32* lookback, u32 tile, u32 d) {
    u32 prefix = 0;
    for (u32 t = tile; t > 0;) {  // tiles [0, t) are still to walk
        const u32* w = lookback + (size_t)(t - 1) * 256 + d;  // tile t - 1 - i's word: w[-i * 256]
        u32 v[ONESWEEP_LOOKBACK_WINDOW];
#pragma unroll
        for (u32 i = 0; i < ONESWEEP_LOOKBACK_WINDOW; i++) v[i] = i < t ? onesweep_load(w - i * 256) : 0;
#pragma unroll
        for (u32 i = 0; i < ONESWEEP_LOOKBACK_WINDOW; i++) {
            if (i >= t) break;
            while ((v[i] & ONESWEEP_FLAGS) == 0) v[i] = onesweep_load(w - i * 256);
            prefix += v[i] & ONESWEEP_VALUE;
            if (v[i] & ONESWEEP_INCLUSIVE) return prefix;
        }
        t -= min(t, (u32)ONESWEEP_LOOKBACK_WINDOW);
    }
    return prefix;
}

// Rows per thread of a one-sweep tile (a tile is ONESWEEP_BLOCK * ONESWEEP_IPT rows), apart from
// IPT (SRTS, GRS, MSD): 20 by default, since a larger tile shares the pass's fixed costs
// (barriers, scans, look-back) among more rows (H100, with ONESWEEP_KEEP_WORDS 2: 100M u32 keys
// 2.31 ms against 2.48 at 16; NOTES.md). The host defines it (kernels.rs DEFAULT_ONESWEEP_IPT,
// or GPUSORT_ONESWEEP_IPT).
// Threads of a one-sweep block (ONESWEEP_BLOCK): by default BLOCK, as every other kernel; 384 or
// 512 makes a bigger tile without more registers a thread (kernels.rs: GPUSORT_ONESWEEP_BLOCK).
static_assert(ONESWEEP_BLOCK % 32 == 0 && ONESWEEP_BLOCK >= 256 && ONESWEEP_BLOCK <= 512,
              "whole warps, at least one thread per digit");
// Blocks per SM the pass kernel is compiled for: by default 768 threads' worth (3 blocks of 256,
// like the downsweep; 2 of 384, 1 of 512), so that larger blocks do not squeeze registers into
// spills (kernels.rs: GPUSORT_ONESWEEP_MIN_BLOCKS).
#ifndef ONESWEEP_MIN_BLOCKS
#define ONESWEEP_MIN_BLOCKS (768 / ONESWEEP_BLOCK)
#endif
#define ONESWEEP_TILE (ONESWEEP_BLOCK * ONESWEEP_IPT)
// Where the scatter's digit words come from (each slot needs its row's digit word):
//   0: read again from global memory (L2, most often), between the rank and the look-back;
//   1: kept in registers from the one load (ONESWEEP_IPT more registers a thread);
//   2: kept in shared memory from the one load, in the slots' positions area, free until the
//      scatter.
#ifndef ONESWEEP_KEEP_WORDS
#define ONESWEEP_KEEP_WORDS 2
#endif

// One tile of the pass below, `valid` rows from row `base`; FULL: a whole tile (every tile but
// the last), so that no row needs a bounds test (template, so that both are compiled).
template <bool FULL>
__device__ __forceinline__ void onesweep_tile(u32 tile, size_t base, u32 valid, const u32* digit_word, u32 shift,
                                              u32 mask, const u32* digit_offsets, u32* lookback, const Lane* lanes,
                                              u32 num_lanes, Records recs, RankSmem<256, u32, ONESWEEP_BLOCK>& s,
                                              u8* stage) {
    u32* mine = lookback + (size_t)tile * 256;
    u32 d[ONESWEEP_IPT], pos[ONESWEEP_IPT];
#if ONESWEEP_KEEP_WORDS == 1
    u32 words[ONESWEEP_IPT];
    const u32* p = digit_word + base + tile_elem<ONESWEEP_IPT>(0);  // item j: p[j * 32]
#pragma unroll
    for (u32 j = 0; j < ONESWEEP_IPT; j++) {
        const bool in = FULL || tile_elem<ONESWEEP_IPT>(j) < valid;
        words[j] = in ? p[j * 32] : 0;
        d[j] = in ? (words[j] >> shift) & mask : 256;
    }
#elif ONESWEEP_KEEP_WORDS == 2
    u32* kept = reinterpret_cast<u32*>(stage);
    const u32* p = digit_word + base + tile_elem<ONESWEEP_IPT>(0);  // item j: p[j * 32]
#pragma unroll
    for (u32 j = 0; j < ONESWEEP_IPT; j++) {
        const u32 e = tile_elem<ONESWEEP_IPT>(j);
        const bool in = FULL || e < valid;
        const u32 w = in ? p[j * 32] : 0;
        if (in) kept[e] = w;
        d[j] = in ? (w >> shift) & mask : 256;
    }
#else
    load_digits<256, FULL>(digit_word, base, valid, shift, mask, d);
#endif
    tile_rank<256, ONESWEEP_IPT, u32, ONESWEEP_BLOCK, RANK_FOLD, FULL>(d, pos, s, [&](u32 b, u32 count) {
        const u32 flag = tile == 0 ? ONESWEEP_INCLUSIVE : ONESWEEP_AGGREGATE;
        onesweep_store(mine + b, flag | ((tile == 0 ? digit_offsets[b] : 0u) + count));
    });
#if ONESWEEP_KEEP_WORDS != 0
    u32* sw = reinterpret_cast<u32*>(stage + ONESWEEP_TILE * sizeof(u32));  // slots' digit words
#endif
#if ONESWEEP_KEEP_WORDS == 1
#pragma unroll
    for (u32 j = 0; j < ONESWEEP_IPT; j++) {
        if (FULL || tile_elem<ONESWEEP_IPT>(j) < valid) sw[pos[j]] = words[j];
    }
#elif ONESWEEP_KEEP_WORDS == 2
#pragma unroll
    for (u32 j = 0; j < ONESWEEP_IPT; j++) {
        const u32 e = tile_elem<ONESWEEP_IPT>(j);
        if (FULL || e < valid) sw[pos[j]] = kept[e];
    }
#else
    stage_digit_words<ONESWEEP_BLOCK, FULL>(base, valid, digit_word, pos, stage);
#endif
    for (u32 b = threadIdx.x; b < 256; b += ONESWEEP_BLOCK) {  // one thread per digit
        const u32 start = tile > 0 ? onesweep_look_back(lookback, tile, b) : digit_offsets[b];
        if (tile > 0) onesweep_store(mine + b, ONESWEEP_INCLUSIVE | (start + s.r.bin_count[b]));
        // The scatter's slot k of digit b goes to start + (k - bin start).
        s.base[b] = start - s.r.bin_start[b];
    }
    __syncthreads();
    // Dynamic shared memory: the slots' positions (ONESWEEP_TILE u32), then the staging.
    scatter_staged_tile<256, ONESWEEP_IPT, u32, ONESWEEP_BLOCK, true, FULL>(
        base, valid, shift, mask, pos, s, lanes, num_lanes, recs, stage, dynamic_smem_bytes() - ONESWEEP_TILE * 4);
}

// One LSD pass over an 8-bit digit, with the dynamic shared memory of srts_downsweep_b8 for a
// tile of ONESWEEP_TILE rows. Any grid works: each block takes tiles in turn (atomicAdd on
// tile_counter, so in the order blocks ask, not by blockIdx) until none is left; a persistent
// grid (SMs x resident blocks per SM) saves the start of a block per tile. The look-back cannot
// deadlock whatever the scheduling: a block waits only on tiles taken before its own, each held
// by a running block that is working on it (a block takes its next tile only when done with the
// last) and waits in turn only on tiles before it, down to tile 0, which waits on none. Per tile:
//   * load and rank the tile's digits (the tile rank of common.cuh, with early counts),
//     publishing AGGREGATE|count of each digit as soon as the rank has counted it, before its
//     ballots (tile 0: INCLUSIVE at once);
//   * stage every row's digit word in its slot (ONESWEEP_KEEP_WORDS), before the look-back, so
//     that the two wait together;
//   * one thread per digit looks back over the tiles before for where the tile's rows of the
//     digit start (digit_offsets[d], from onesweep_scan, plus the digit's rows in those tiles),
//     publishes INCLUSIVE|start+count, and puts the start in s.base[d];
//   * scatter every lane through shared memory (scatter_staged_tile, as SRTS).
// tile_counter (1 word) and lookback (num_tiles * 256 words) must be zero at launch: each pass
// needs its own zeroed words (one memset can clear the words of all passes before the first).
// n < 2^30.
extern "C" __global__ void __launch_bounds__(ONESWEEP_BLOCK, ONESWEEP_MIN_BLOCKS)
    onesweep_pass_b8(u32 n, const u32* digit_word, u32 shift, u32 mask, u32 num_tiles, const u32* digit_offsets,
                     u32* tile_counter, u32* lookback, const Lane* lanes, u32 num_lanes, Records recs) {
    __shared__ RankSmem<256, u32, ONESWEEP_BLOCK> s;
    __shared__ u32 s_tile;
    extern __shared__ __align__(16) u8 onesweep_stage[];  // (a name of its own: extern "C" linkage)
    for (;;) {
        // Shared memory is written again only after this barrier: the last tile's scatter may
        // end without one (scatter_staged_tile), and s_tile is not read by it.
        if (threadIdx.x == 0) s_tile = atomicAdd(tile_counter, 1u);
        __syncthreads();
        const u32 tile = s_tile;
        if (tile >= num_tiles) return;  // the whole block
        const size_t base = (size_t)tile * ONESWEEP_TILE;
        const u32 valid = (u32)min((size_t)ONESWEEP_TILE, (size_t)n - base);
        if (valid == ONESWEEP_TILE) {
            onesweep_tile<true>(tile, base, valid, digit_word, shift, mask, digit_offsets, lookback, lanes, num_lanes,
                                recs, s, onesweep_stage);
        } else {
            onesweep_tile<false>(tile, base, valid, digit_word, shift, mask, digit_offsets, lookback, lanes,
                                 num_lanes, recs, s, onesweep_stage);
        }
    }
}
