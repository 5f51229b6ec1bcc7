// common.cuh — what every kernel family of gpusort shares: integer types, the lane table that
// says which columns a radix pass moves, block scans, and the two tile steps that GRS and SRTS
// have in common (Bandyopadhyay & Sahni, "Sorting Large Multifield Records on a GPU"):
//
// * the tile rank (GRS phase 1, SRTS phase 3): each element's stable position among the
//   tile's elements ordered by digit, computed per warp (the lanes with equal digits found by
//   one ballot per digit bit) and per-warp digit counters, then combined across warps and
//   digits with scans;
// * the tile scatter (GRS phase 3, SRTS phase 3): every moved column goes through shared memory
//   in the tile's sorted order, so that the writes of consecutive threads land on consecutive
//   addresses (paper Fig. 4 for ByField); row-major records (Hybrid) are moved in the tile's
//   sorted order by groups of threads in 16-, 8- or 4-byte pieces (paper Fig. 6).
//
// The one-sweep pass (onesweep.cu) and the MSD sorts (msd.cu) use the same two steps. Compiled
// by NVRTC together with every other kernel source; nothing here is a kernel.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// BLOCK (threads of a sort block), IPT (rows per thread of a tile) and the LANE_* flags below
// are shared with the host, which defines them before this file.
#if !defined(BLOCK) || !defined(IPT) || !defined(LANE_IOTA) || !defined(LANE_DIGIT) || !defined(LANE_PAIR)
#error "defined by the host before the sources (kernels.rs SHARED_CONSTANTS, KernelTuning::defines)"
#endif

#define FULL_MASK 0xffffffffu
#define WARPS (BLOCK / 32)
#define TILE (BLOCK * IPT)

// A column moved by a radix pass, or gathered: `width` bytes per row (1, 2, 4, 8 or 16).
// Its flags: with LANE_IOTA the source is the row index itself (a u32 lane that starts as 0, 1,
// 2...); LANE_DIGIT: the lane is the key word the pass's digit comes from, staged once, with the
// digits; LANE_PAIR: the lane and the next are plain 4-byte columns that the scatter moves as a
// pair when its staging has 8 bytes a row (stage_lane_pair; the host sets it, lanes.rs
// `mark_lane_pairs`).
struct Lane {
    const u8* src;
    u8* dst;
    u32 width;
    u32 flags;
};

// Row-major records moved with the keys (the Hybrid layout): `bytes` per record.
struct Records {
    const u8* src;
    u8* dst;
    u32 bytes;
    u32 piece;  // 16, 8 or 4: the unit one thread moves (0: no records)
};

__device__ __forceinline__ u32 lanemask_lt() {
    u32 m;
    asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
    return m;
}

// Element of the tile held as item j by this thread: warp w owns elements
// [w * ITEMS * 32, (w + 1) * ITEMS * 32), taken 32 at a time, so tile order is (warp, item,
// lane) and global loads of one item are coalesced. The tile helpers below take their items per
// thread from the size of their arrays: IPT for GRS and SRTS, ONESWEEP_IPT for one sweep.
template <int ITEMS = IPT>
__device__ __forceinline__ u32 tile_elem(u32 j) {
    return (threadIdx.x / 32) * (ITEMS * 32) + j * 32 + (threadIdx.x % 32);
}

// Exclusive scan of one value per thread over a block of THREADS threads (thread order); every
// thread gets the block total in *total. All threads of the block must call it; `s_warp` holds
// THREADS / 32 words.
template <int THREADS = BLOCK>
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* s_warp, u32* total) {
    constexpr u32 NW = THREADS / 32;
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    u32 x = v;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 w = lane < NW ? s_warp[lane] : 0;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(FULL_MASK, w, o);
            if (lane >= o) w += y;
        }
        if (lane < NW) s_warp[lane] = w;
    }
    __syncthreads();
    const u32 prefix = (warp > 0 ? s_warp[warp - 1] : 0) + x - v;
    *total = s_warp[NW - 1];
    __syncthreads();
    return prefix;
}

// The lanes of the warp holding the same label as this lane: one ballot per label bit (and one
// for `valid`, unless ALL_VALID says that every lane is), which is much faster than
// __match_any_sync on recent GPUs. Written in PTX: the compiler's own code for
// `bit ? vote : ~vote` tested each bit twice, seven instructions a bit and 40% of the one-sweep
// pass's instructions (ncu, H100); this is under three (ptxas sets seven bits' predicates with
// one R2P, then a ballot, a predicated complement and half a three-input and a bit).
template <int BITS, bool ALL_VALID = false>
__device__ __forceinline__ u32 match_peers(u32 label, bool valid) {
    u32 peers = FULL_MASK;
    if (!ALL_VALID) {
        peers = __ballot_sync(FULL_MASK, valid);
        if (!valid) peers = ~peers;
    }
    // Bit b's lanes: those whose bit b equals this lane's; two bits an and (one three-input LOP3;
    // the compiler splits a & b & c into two).
#pragma unroll
    for (int b = 0; b < BITS; b += 2) {
        u32 same[2] = {FULL_MASK, FULL_MASK};
#pragma unroll
        for (int i = 0; i < 2 && b + i < BITS; i++) {
            asm volatile(
                "{\n\t.reg .pred p;\n\t.reg .b32 t;\n\t"
                "and.b32 t, %1, %2;\n\t"
                "setp.ne.u32 p, t, 0;\n\t"
                "vote.sync.ballot.b32 %0, p, 0xffffffff;\n\t"
                "@!p not.b32 %0, %0;\n\t}"
                : "=r"(same[i])
                : "r"(label), "r"(1u << (b + i)));
        }
        asm("lop3.b32 %0, %1, %2, %3, 0x80;" : "=r"(peers) : "r"(peers), "r"(same[0]), "r"(same[1]));
    }
    return peers;
}

// log2 of a power of two bin count.
template <int BINS>
struct Log2 {
    static const int value = BINS <= 1 ? 0 : 1 + Log2<BINS / 2>::value;
};
template <>
struct Log2<1> {
    static const int value = 0;
};

// Exclusive scan of `count[0..BINS)` into `start[0..BINS)` by a block of THREADS threads, each
// taking consecutive bins. Ends with a barrier.
template <int BINS, int THREADS>
__device__ __forceinline__ void scan_bins(const u32* count, u32* start, u32* s_warp) {
    constexpr int PER = (BINS + THREADS - 1) / THREADS;
    u32 v[PER];
    u32 sum = 0;
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const u32 b = threadIdx.x * PER + i;
        v[i] = b < BINS ? count[b] : 0;
        sum += v[i];
    }
    u32 total;
    u32 run = block_exclusive_scan<THREADS>(sum, s_warp, &total);
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const u32 b = threadIdx.x * PER + i;
        if (b < BINS) start[b] = run;
        run += v[i];
    }
    __syncthreads();
}

// What the block rank keeps in shared memory: per-warp counters (type C: u16 where counts stay
// below 65536), the block's count and first position of each digit, and scan scratch.
template <int BINS, int THREADS, typename C>
struct RankShared {
    __align__(16) C warp_counts[THREADS / 32][BINS + 1];  // the extra bin takes invalid items
    u32 bin_count[BINS];
    u32 bin_start[BINS];
    u32 scan[32];
};

struct NoCounts {
    __device__ void operator()(u32, u32) const {}
};

// Per digit b < BINS <= THREADS (thread b): the sum of the warps' counts of b (published at once
// by on_counts(b, sum)), the scan of the sums across digits (s.bin_count, s.bin_start), then
// each warp's counter of b becomes where that warp's rows of b start in the block (bin start +
// the warps before). The counts are read twice rather than held in registers across the scan.
// Ends with a barrier.
template <int BINS, int THREADS, typename C, typename OnCounts>
__device__ __forceinline__ void fold_warp_starts(RankShared<BINS, THREADS, C>& s, OnCounts on_counts) {
    static_assert(BINS <= THREADS, "one digit a thread");
    constexpr u32 NW = THREADS / 32;
    const u32 b = threadIdx.x;
    u32 sum = 0;
    if (b < BINS) {
#pragma unroll
        for (u32 w = 0; w < NW; w++) sum += s.warp_counts[w][b];
        s.bin_count[b] = sum;
        on_counts(b, sum);
    }
    u32 total;
    const u32 start = block_exclusive_scan<THREADS>(b < BINS ? sum : 0u, s.scan, &total);
    if (b < BINS) {
        s.bin_start[b] = start;
        u32 run = start;
#pragma unroll
        for (u32 w = 0; w < NW; w++) {
            const u32 c = s.warp_counts[w][b];
            s.warp_counts[w][b] = (C)run;
            run += c;
        }
    }
    __syncthreads();
}

// The block rank (GRS phase 1, SRTS phase 3, the one-sweep pass, and the block-local sorts of
// msd.cu). Item j of a thread is element (warp, j, lane) of the block: warp w owns elements
// [w * ITEMS * 32, (w + 1) * ITEMS * 32), taken 32 at a time. On entry dp[j] is the item's digit
// (BINS for items past the end); on return it is the item's position in the block's stable
// order by digit (for valid items), and s.bin_count / s.bin_start hold the digit counts and
// their exclusive prefix. FULL says that every item is valid (a whole tile): no validity ballot
// or test. on_counts(b, count) is called by the thread that sums digit b's count, as soon as it
// has it (before the scan): the one-sweep pass publishes its counts there.
//
// Per warp, the lanes holding the same digit are found by one ballot per digit bit
// (match_peers); the first of them adds their number to the warp's counter of the digit, which
// gives every item its rank among the warp's items of that digit. Three ways to combine that
// with the other warps and digits:
// * early counts (EARLY: FOLD, one digit a thread and u32 counters; as CUB's one-sweep rank):
//   the warps' counts first, by a shared atomic an item; then the per-digit sums (published),
//   the scan and the warps' starts (fold_warp_starts); then the ballots, which find each item's
//   final position at once. Successors of a one-sweep tile find its counts before its ballots
//   rather than after, and no pass over the items is left after the ballots.
// * late fold (FOLD, one digit a thread, u16 counters): the ballots first (the rank within the
//   warp waits in the high 16 bits beside the digit), then fold_warp_starts, then each item
//   reads its warp's start: one shared read an item.
// * otherwise: per digit the exclusive prefix over warps, a scan of the digits (scan_bins), then
//   each item reads its bin start and its warp's prefix: two shared reads an item.
// RANK_FOLD (default 1; GPUSORT_RANK_FOLD) sets FOLD for the one-sweep pass (early counts) and
// the MSD local sort (late fold); GRS's rank and SRTS's downsweep (rank_and_scatter_tile) keep
// two reads (folded, they took more registers: 75 instead of 63, and spills).
#ifndef RANK_FOLD
#define RANK_FOLD 1
#endif
template <int BINS, int THREADS, int ITEMS, typename C, bool FOLD = RANK_FOLD, bool FULL = false,
          typename OnCounts = NoCounts>
__device__ __forceinline__ void rank_items(u32 (&dp)[ITEMS], RankShared<BINS, THREADS, C>& s,
                                           OnCounts on_counts = OnCounts()) {
    static_assert(BINS < 65536 && 32 * ITEMS < 65536, "digit and warp rank share a word");
    static_assert(sizeof(C) >= 4 || THREADS * ITEMS <= 65536, "a block position fits the counters");
    constexpr u32 NW = THREADS / 32;
    constexpr bool EARLY = FOLD && BINS <= THREADS && sizeof(C) == 4;
    constexpr u32 WORDS = sizeof(s.warp_counts) / 4;
    u32* counters = reinterpret_cast<u32*>(&s.warp_counts[0][0]);
    if constexpr (WORDS % 4 == 0) {
        for (u32 i = threadIdx.x; i < WORDS / 4; i += THREADS) reinterpret_cast<uint4*>(counters)[i] = uint4{0, 0, 0, 0};
    } else {
        for (u32 i = threadIdx.x; i < WORDS; i += THREADS) counters[i] = 0;
    }
    __syncthreads();
    C* wc = s.warp_counts[threadIdx.x / 32];
    if constexpr (EARLY) {
#pragma unroll
        for (u32 j = 0; j < ITEMS; j++) {
            if (FULL || dp[j] < BINS) atomicAdd(&wc[dp[j]], 1u);
        }
        __syncthreads();
        fold_warp_starts<BINS, THREADS>(s, on_counts);
    }
    const u32 lt = lanemask_lt();
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) {
        const u32 d = dp[j];
        const u32 peers = match_peers<Log2<BINS>::value, FULL>(d, FULL || d < BINS);
        const u32 before = __popc(peers & lt);
        const u32 seen = wc[d];
        __syncwarp();
        if (before == 0) wc[d] = (C)(seen + __popc(peers));
        __syncwarp();
        dp[j] = EARLY ? seen + before : d | (seen + before) << 16;
    }
    if constexpr (EARLY) return;
    __syncthreads();
    if constexpr (FOLD && BINS <= THREADS) {
        fold_warp_starts<BINS, THREADS>(s, on_counts);
#pragma unroll
        for (u32 j = 0; j < ITEMS; j++) {
            const u32 d = dp[j] & 0xffff, r = dp[j] >> 16;
            dp[j] = FULL || d < BINS ? r + wc[d] : r;
        }
    } else {
        // Per digit: exclusive prefix over warps, and the block's count.
        for (u32 b = threadIdx.x; b < BINS; b += THREADS) {
            u32 sum = 0;
#pragma unroll
            for (u32 w = 0; w < NW; w++) {
                const u32 c = s.warp_counts[w][b];
                s.warp_counts[w][b] = (C)sum;
                sum += c;
            }
            s.bin_count[b] = sum;
            on_counts(b, sum);
        }
        __syncthreads();
        scan_bins<BINS, THREADS>(s.bin_count, s.bin_start, s.scan);
#pragma unroll
        for (u32 j = 0; j < ITEMS; j++) {
            const u32 d = dp[j] & 0xffff, r = dp[j] >> 16;
            dp[j] = d < BINS ? r + s.bin_start[d] + wc[d] : r;
        }
    }
}

// Shared memory of the tile rank and scatter for digits of up to BINS values, by a block of
// THREADS threads: the rank's, and where the tile's elements of each digit go globally. The tile
// helpers below take their block size from it (BLOCK for GRS, SRTS and MSD; ONESWEEP_BLOCK for
// one sweep).
template <int BINS, typename C = u32, int THREADS = BLOCK>
struct RankSmem {
    RankShared<BINS, THREADS, C> r;
    u32 base[BINS];
};

// The tile rank of GRS, SRTS and the one-sweep pass: rank_items over a tile of THREADS threads x
// ITEMS items.
template <int BINS, int ITEMS, typename C, int THREADS, bool FOLD = RANK_FOLD, bool FULL = false,
          typename OnCounts = NoCounts>
__device__ __forceinline__ void tile_rank(const u32 (&d)[ITEMS], u32 (&pos)[ITEMS], RankSmem<BINS, C, THREADS>& s,
                                          OnCounts on_counts = OnCounts()) {
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) pos[j] = d[j];
    rank_items<BINS, THREADS, ITEMS, C, FOLD, FULL>(pos, s.r, on_counts);
}

// Loads the digits of the tile at `base` (`valid` elements; all of them if FULL) in item order.
template <int BINS, bool FULL = false, int ITEMS>
__device__ __forceinline__ void load_digits(const u32* digit_word, size_t base, u32 valid, u32 shift, u32 mask,
                                            u32 (&d)[ITEMS]) {
    const u32* p = digit_word + base + tile_elem<ITEMS>(0);  // item j: p[j * 32]
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) {
        const u32 e = tile_elem<ITEMS>(j);
        d[j] = FULL || e < valid ? (p[j * 32] >> shift) & mask : BINS;
    }
}

// Lane values go from global memory to their slots in shared memory by cp.async (sm_80 and
// later) where a value is 4 or 8 bytes: the copy needs no register, so every item's copy of a
// lane is in flight at once, and the thread waits once, before the barrier that ends the
// staging. Plain loads and stores cannot do that: a lane's pointers come from its table, so the
// compiler cannot tell them from shared memory and keeps each load behind the previous item's
// shared store (one load in flight a thread; on the H100 the passes that moved lanes spent half
// their time there), and holding the values in registers first spills the one-sweep pass.
template <typename T>
__device__ constexpr bool lane_copies_async() {
#if __CUDA_ARCH__ >= 800
    return sizeof(T) == 4 || sizeof(T) == 8;
#else
    return false;
#endif
}

// The cp.async of item J and of those after it: from global address p0 + J * 32 * SCALE values
// (one register and an immediate offset, so that the items' addresses take no registers of
// their own) to shared address s0 + pos[J] * sizeof(T).
template <typename T, int SCALE, bool FULL, int ITEMS, int J = 0>
__device__ __forceinline__ void lane_copy_items(const T* p0, u32 s0, u32 valid, const u32 (&pos)[ITEMS]) {
    if constexpr (J < ITEMS) {
        if (FULL || tile_elem<ITEMS>(J) < valid) {
            asm volatile("cp.async.ca.shared.global [%0], [%1+%2], %3;" ::"r"(s0 + pos[J] * (u32)sizeof(T)), "l"(p0),
                         "n"(J * 32 * SCALE * sizeof(T)), "n"(sizeof(T))
                         : "memory");
        }
        lane_copy_items<T, SCALE, FULL, ITEMS, J + 1>(p0, s0, valid, pos);
    }
}

// The tile's rows of one lane (SCALE values of T a row, of which src points at the one to move)
// to their slots s[pos[j]]. With WAIT, the thread's copies are complete on return (the caller
// puts a barrier after); without, a later call with WAIT waits for them too.
template <typename T, int SCALE, bool FULL, bool WAIT = true, int ITEMS>
__device__ __forceinline__ void lane_to_slots(const T* src, size_t base, u32 valid, const u32 (&pos)[ITEMS], T* s) {
    if constexpr (lane_copies_async<T>()) {
        lane_copy_items<T, SCALE, FULL>(src + (base + tile_elem<ITEMS>(0)) * SCALE, (u32)__cvta_generic_to_shared(s),
                                        valid, pos);
        if constexpr (WAIT) asm volatile("cp.async.wait_all;" ::: "memory");
    } else {
#pragma unroll
        for (u32 j = 0; j < ITEMS; j++) {
            const u32 e = tile_elem<ITEMS>(j);
            if (FULL || e < valid) s[pos[j]] = src[(base + e) * SCALE];
        }
    }
}

// One lane through shared memory: rows of the tile in item order go to their slots, then each
// thread writes its slots (k = threadIdx.x + i * THREADS) to their global positions gdst[k].
// A row is SCALE values of T, of which value `part` moves (16-byte rows move as two 8-byte
// halves, each copied by cp.async).
template <typename T, int SCALE, int THREADS, bool FULL, int ITEMS>
__device__ __forceinline__ void stage_lane(const Lane& lane, size_t base, u32 valid, const u32 (&pos)[ITEMS],
                                           const u32* gdst, u8* stage, u32 part) {
    T* s = reinterpret_cast<T*>(stage);
    lane_to_slots<T, SCALE, FULL>(reinterpret_cast<const T*>(lane.src) + part, base, valid, pos, s);
    __syncthreads();
    T* dst = reinterpret_cast<T*>(lane.dst) + part;
#pragma unroll
    for (u32 i = 0; i < ITEMS; i++) {
        const u32 k = threadIdx.x + i * THREADS;
        if (FULL || k < valid) dst[(size_t)gdst[k] * SCALE] = s[k];
    }
    __syncthreads();
}

// The row index lane of the first pass: the value is the element's own index.
template <int THREADS, bool FULL, int ITEMS>
__device__ __forceinline__ void stage_iota(const Lane& lane, size_t base, u32 valid, const u32 (&pos)[ITEMS],
                                           const u32* gdst, u8* stage) {
    u32* s = reinterpret_cast<u32*>(stage);
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) {
        const u32 e = tile_elem<ITEMS>(j);
        if (FULL || e < valid) s[pos[j]] = (u32)(base + e);
    }
    __syncthreads();
    u32* dst = reinterpret_cast<u32*>(lane.dst);
#pragma unroll
    for (u32 i = 0; i < ITEMS; i++) {
        const u32 k = threadIdx.x + i * THREADS;
        if (FULL || k < valid) dst[gdst[k]] = s[k];
    }
    __syncthreads();
}

// Two 4-byte lanes through shared memory at once (staging of 8 bytes a row): the loads of both
// before one barrier, the stores of both before the next, so a pair costs the barriers of one
// lane.
template <int THREADS, bool FULL, int ITEMS>
__device__ __forceinline__ void stage_lane_pair(const Lane& a, const Lane& b, size_t base, u32 valid,
                                                const u32 (&pos)[ITEMS], const u32* gdst, u8* stage) {
    u32* sa = reinterpret_cast<u32*>(stage);
    u32* sb = sa + THREADS * ITEMS;
    const u32* pa = reinterpret_cast<const u32*>(a.src);
    const u32* pb = reinterpret_cast<const u32*>(b.src);
    lane_to_slots<u32, 1, FULL, false>(pa, base, valid, pos, sa);  // both lanes' copies in flight
    lane_to_slots<u32, 1, FULL>(pb, base, valid, pos, sb);
    __syncthreads();
    u32* da = reinterpret_cast<u32*>(a.dst);
    u32* db = reinterpret_cast<u32*>(b.dst);
#pragma unroll
    for (u32 i = 0; i < ITEMS; i++) {
        const u32 k = threadIdx.x + i * THREADS;
        if (FULL || k < valid) {
            const u32 g = gdst[k];
            da[g] = sa[k];
            db[g] = sb[k];
        }
    }
    __syncthreads();
}

// Bytes of dynamic shared memory of the running kernel.
__device__ __forceinline__ u32 dynamic_smem_bytes() {
    u32 v;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

// The tile scatter, once each slot's digit word is staged (scatter_tile below). Needs s.base
// (global position of the tile's first element of each digit; with BASE_MINUS_START, that minus
// s.r.bin_start, mod 2^32, which saves a shared read a row), s.r.bin_start, and each item's
// slot pos[j]. `smem` is dynamic shared memory: TILE u32 for the slots' global positions, then
// `stage_bytes` (at least TILE * the widest lane up to 8 bytes, at least 4) of staging, whose
// first TILE u32 hold the digit word of every slot on entry (TILE = THREADS * ITEMS). A lane
// the host marked LANE_PAIR moves with the next one as a pair (stage_lane_pair) when the staging
// has 8 bytes a row; lanes.rs marks pairs (lsd.rs) and gives the staging 8 bytes a row only while its
// pairing knob is on. When the digit word is all that
// moves (a keys-only pass), the slots' positions are not stored and the scatter ends without a
// barrier, returning false: the caller must then put one between it and its next write to
// shared memory (or to s.base); otherwise it ends with one and returns true.
template <int BINS, int ITEMS, typename C, int THREADS, bool BASE_MINUS_START = false, bool FULL = false>
__device__ __forceinline__ bool scatter_staged_tile(size_t base, u32 valid, u32 shift, u32 mask,
                                                    const u32 (&pos)[ITEMS], RankSmem<BINS, C, THREADS>& s,
                                                    const Lane* lanes, u32 num_lanes, Records recs, u8* smem,
                                                    u32 stage_bytes) {
    u32* gdst = reinterpret_cast<u32*>(smem);
    u8* stage = smem + THREADS * ITEMS * sizeof(u32);
    // Every slot's global position, from its digit word; the digit word's own lane (if it
    // moves) is written from here.
    const u32* sw = reinterpret_cast<const u32*>(stage);
    u32* digit_dst = nullptr;
    for (u32 l = 0; l < num_lanes; l++) {
        if (lanes[l].flags & LANE_DIGIT) digit_dst = reinterpret_cast<u32*>(lanes[l].dst);
    }
    const bool more = num_lanes > (digit_dst ? 1u : 0u) || recs.piece != 0;  // the same in the whole block
#pragma unroll
    for (u32 i = 0; i < ITEMS; i++) {
        const u32 k = threadIdx.x + i * THREADS;
        if (FULL || k < valid) {
            const u32 word = sw[k];
            const u32 dk = (word >> shift) & mask;
            const u32 g = s.base[dk] + k - (BASE_MINUS_START ? 0u : s.r.bin_start[dk]);
            if (more) gdst[k] = g;
            if (digit_dst) digit_dst[g] = word;
        }
    }
    if (!more) return false;
    __syncthreads();
    const bool pairs = stage_bytes >= THREADS * ITEMS * 8u;
    for (u32 l = 0; l < num_lanes; l++) {
        const Lane lane = lanes[l];
        if (lane.flags & LANE_DIGIT) continue;
        if (lane.flags & LANE_IOTA) {
            stage_iota<THREADS, FULL>(lane, base, valid, pos, gdst, stage);
            continue;
        }
        if (pairs && (lane.flags & LANE_PAIR) && l + 1 < num_lanes) {
            stage_lane_pair<THREADS, FULL>(lane, lanes[l + 1], base, valid, pos, gdst, stage);
            l++;
            continue;
        }
        switch (lane.width) {
            case 1: stage_lane<u8, 1, THREADS, FULL>(lane, base, valid, pos, gdst, stage, 0); break;
            case 2: stage_lane<u16, 1, THREADS, FULL>(lane, base, valid, pos, gdst, stage, 0); break;
            case 4: stage_lane<u32, 1, THREADS, FULL>(lane, base, valid, pos, gdst, stage, 0); break;
            case 8: stage_lane<u64, 1, THREADS, FULL>(lane, base, valid, pos, gdst, stage, 0); break;
            default:
                stage_lane<u64, 2, THREADS, FULL>(lane, base, valid, pos, gdst, stage, 0);
                stage_lane<u64, 2, THREADS, FULL>(lane, base, valid, pos, gdst, stage, 1);
                break;
        }
    }
    if (recs.piece == 0) return true;
    // Records, in slot order (so that consecutive groups write consecutive records): a group of
    // threads per record moves it piece by piece (paper Fig. 6), reading it from its row in the
    // tile.
    u16* slot_from = reinterpret_cast<u16*>(stage);
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) {
        const u32 e = tile_elem<ITEMS>(j);
        if (FULL || e < valid) slot_from[pos[j]] = (u16)e;
    }
    __syncthreads();
    const u32 per = recs.bytes / recs.piece;
    const u32 total = valid * per;
    for (u32 q = threadIdx.x; q < total; q += THREADS) {
        const u32 k = q / per, p = q - k * per;
        const size_t from = (base + slot_from[k]) * (size_t)recs.bytes + (size_t)p * recs.piece;
        const size_t to = (size_t)gdst[k] * recs.bytes + (size_t)p * recs.piece;
        if (recs.piece == 16) {
            *reinterpret_cast<uint4*>(recs.dst + to) = *reinterpret_cast<const uint4*>(recs.src + from);
        } else if (recs.piece == 8) {
            *reinterpret_cast<u64*>(recs.dst + to) = *reinterpret_cast<const u64*>(recs.src + from);
        } else {
            *reinterpret_cast<u32*>(recs.dst + to) = *reinterpret_cast<const u32*>(recs.src + from);
        }
    }
    __syncthreads();
    return true;
}

// The digit word of every item to its slot in the staging area of scatter_staged_tile, read
// again from `digit_word`. No barrier: the caller puts one before scatter_staged_tile.
template <int THREADS, bool FULL, int ITEMS>
__device__ __forceinline__ void stage_digit_words(size_t base, u32 valid, const u32* digit_word,
                                                  const u32 (&pos)[ITEMS], u8* smem) {
    u32* sw = reinterpret_cast<u32*>(smem + THREADS * ITEMS * sizeof(u32));
    const u32* p = digit_word + base + tile_elem<ITEMS>(0);  // item j: p[j * 32]
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) {
        const u32 e = tile_elem<ITEMS>(j);
        if (FULL || e < valid) sw[pos[j]] = p[j * 32];
    }
}

// The tile scatter: stage_digit_words, then scatter_staged_tile (whose return value it returns).
template <int BINS, int ITEMS, typename C, int THREADS>
__device__ __forceinline__ bool scatter_tile(size_t base, u32 valid, const u32* digit_word, u32 shift, u32 mask,
                                             const u32 (&pos)[ITEMS], RankSmem<BINS, C, THREADS>& s,
                                             const Lane* lanes, u32 num_lanes, Records recs, u8* smem,
                                             u32 stage_bytes) {
    stage_digit_words<THREADS, false>(base, valid, digit_word, pos, smem);
    __syncthreads();
    return scatter_staged_tile<BINS>(base, valid, shift, mask, pos, s, lanes, num_lanes, recs, smem, stage_bytes);
}

// In-place exclusive scan of `n` values by one block of BLOCK threads: each thread scans a
// contiguous chunk, chunk totals are scanned across the block, then chunks are rewritten.
__device__ __forceinline__ void single_block_exclusive_scan(u32* data, u32 n, u32 carry_in) {
    __shared__ u32 s_warp[WARPS];
    const u32 per = (n + BLOCK - 1) / BLOCK;
    const u32 lo = min(n, threadIdx.x * per), hi = min(n, lo + per);
    // Independent partial sums, so that many loads are in flight at once.
    u32 part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    u32 i = lo;
    for (; i + 8 <= hi; i += 8) {
#pragma unroll
        for (u32 k = 0; k < 8; k++) part[k] += data[i + k];
    }
    for (; i < hi; i++) part[0] += data[i];
    u32 sum = 0;
#pragma unroll
    for (u32 k = 0; k < 8; k++) sum += part[k];
    u32 total;
    u32 run = block_exclusive_scan(sum, s_warp, &total) + carry_in;
    for (u32 i = lo; i < hi; i++) {
        const u32 v = data[i];
        data[i] = run;
        run += v;
    }
}

// One tile of a scatter pass (SRTS phase 3, the MSD partition scatter): its digits loaded and
// ranked, its rows moved to their bins' next places (s.base), and s.base advanced past them.
template <int BINS, typename C>
__device__ __forceinline__ void rank_and_scatter_tile(size_t base, u32 valid, const u32* digit_word, u32 shift,
                                                      u32 mask, RankSmem<BINS, C>& s, const Lane* lanes,
                                                      u32 num_lanes, Records recs, u8* stage, u32 stage_bytes) {
    u32 d[IPT], pos[IPT];
    load_digits<BINS>(digit_word, base, valid, shift, mask, d);
    tile_rank<BINS, IPT, C, BLOCK, false>(d, pos, s);
    // s.base is read by the scatter up to its end.
    if (!scatter_tile<BINS>(base, valid, digit_word, shift, mask, pos, s, lanes, num_lanes, recs, stage, stage_bytes)) {
        __syncthreads();
    }
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) s.base[b] += s.r.bin_count[b];
    __syncthreads();
}
