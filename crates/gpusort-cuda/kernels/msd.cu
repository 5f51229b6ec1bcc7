// msd.cu — the hybrid MSD radix sort, gpusort's third family beside GRS and SRTS.
//
// GRS and SRTS (Bandyopadhyay & Sahni, "Sorting Large Multifield Records on a GPU", sections V
// and VI) are LSD sorts: every digit of the key costs a pass that reads and writes every moved
// column. Here the rows are first split by their most significant digits into segments small
// enough for one block's shared memory, and each segment is then sorted there on its remaining
// digits, so the payload crosses device memory about twice however long the key is:
//
//   1. partition passes (msd_count_*, a scan of the chunk histograms, msd_scatter_*): the
//      segments still too large are split, all at once, by the next digit (up to 11 bits). A
//      block takes a chunk of one segment, counts its digits; after the scan it walks the
//      chunk's tiles in order, ranks each tile and writes it out through shared memory (the tile
//      rank and tile scatter of GRS/SRTS, common.cuh), so ties keep their input order and the
//      records move as in the paper's direct strategy. msd_subsegments tells the host where
//      each new segment starts.
//   2. the block-local sort (msd_local): one block per batch of small segments loads the batch's
//      remaining key words into shared memory, sorts a 16-bit row index by LSD passes over the
//      remaining digits (and, when the batch holds several segments, by segment last), then
//      moves every column through shared memory in that order: each column is read and written
//      once, coalesced. Many small sorts run in one launch, as in the batched small sorts of
//      BPLG-BMCS (Dieguez, Amor & Doallo).
//
// A partition pass reads its rows from one buffer of each column and writes the other; the
// block-local sort reads a batch from the buffer its last partition pass wrote and writes the
// final buffer (in place when it is the same: a column is wholly in shared memory first).

// ---- partition passes ----

#if !defined(MSD_BINS_B8) || !defined(MSD_BINS_B11) || !defined(MSD_RANK_SMEM_B8) || !defined(MSD_RANK_SMEM_B11) || \
    !defined(LOCAL_BLOCK) || !defined(LOCAL_CAP) || !defined(LOCAL_MAX_WORDS) || !defined(LOCAL_MAX_SEGS) ||     \
    !defined(LANE_SKIP)
#error "defined by the host before the sources (kernels.rs SHARED_CONSTANTS, KernelTuning::defines)"
#endif

// The host sizes dynamic shared memory by these (MSD_RANK_SMEM in kernels.rs).
static_assert(sizeof(RankSmem<MSD_BINS_B8, u32>) == MSD_RANK_SMEM_B8, "RankSmem<256> as the host counts it");
static_assert(sizeof(RankSmem<MSD_BINS_B11, u16>) == MSD_RANK_SMEM_B11, "RankSmem<2048> as the host counts it");

// A chunk of rows of one segment: what one block counts and scatters in a partition pass.
struct MsdChunk {
    u32 start;   // first row
    u32 len;     // rows
    u32 hist;    // index of the chunk's count of digit 0 in the histogram
    u32 stride;  // chunks of its segment: the distance between the counts of digits d and d + 1
    u32 bias;    // the segment's first row minus the rows of the partitioned segments before it
    u32 pad0, pad1, pad2;
};

// The chunk's digit counts, written digit-major per segment: hist[c.hist + d * c.stride].
template <int BINS>
__device__ __forceinline__ void msd_count_impl(const MsdChunk* chunks, const u32* digit_word, u32 shift, u32 mask,
                                               u32* hist) {
    constexpr int COPIES = BINS <= 256 ? WARPS : 1;
    __shared__ u32 h[COPIES][BINS];
    for (u32 i = threadIdx.x; i < COPIES * BINS; i += BLOCK) (&h[0][0])[i] = 0;
    __syncthreads();
    const MsdChunk c = chunks[blockIdx.x];
    u32* mine = h[COPIES == 1 ? 0 : threadIdx.x / 32];
    const u32* src = digit_word + c.start;
    u32 i = threadIdx.x;
    // Eight loads in flight per thread before their counts.
    for (; i + 7 * BLOCK < c.len; i += 8 * BLOCK) {
        u32 v[8];
#pragma unroll
        for (u32 k = 0; k < 8; k++) v[k] = src[i + k * BLOCK];
#pragma unroll
        for (u32 k = 0; k < 8; k++) atomicAdd(&mine[(v[k] >> shift) & mask], 1u);
    }
    for (; i < c.len; i += BLOCK) atomicAdd(&mine[(src[i] >> shift) & mask], 1u);
    __syncthreads();
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) {
        u32 sum = 0;
#pragma unroll
        for (int w = 0; w < COPIES; w++) sum += h[w][b];
        hist[c.hist + (size_t)b * c.stride] = sum;
    }
}

// The chunk's rows, tile by tile in order, to their places: `offsets` is the exclusive scan of
// the histogram, so c.bias + offsets[c.hist + d * c.stride] is where the chunk's first row of
// digit d goes. Dynamic shared memory: RankSmem, then the scatter's staging (scatter_tile).
template <int BINS, typename C>
__device__ __forceinline__ void msd_scatter_impl(const MsdChunk* chunks, const u32* digit_word, u32 shift, u32 mask,
                                                 const u32* offsets, const Lane* lanes, u32 num_lanes) {
    extern __shared__ __align__(16) u8 msd_smem[];
    RankSmem<BINS, C>& s = *reinterpret_cast<RankSmem<BINS, C>*>(msd_smem);
    u8* stage = msd_smem + ((sizeof(RankSmem<BINS, C>) + 15) & ~(size_t)15);
    const MsdChunk c = chunks[blockIdx.x];
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) s.base[b] = c.bias + offsets[c.hist + (size_t)b * c.stride];
    __syncthreads();
    const Records none = {nullptr, nullptr, 0, 0};
    for (u32 t = 0; t < c.len; t += TILE) {
        const size_t base = (size_t)c.start + t;
        const u32 valid = min((u32)TILE, c.len - t);
        // Staging of the widest lane only: no 4-byte lanes in pairs (stage_bytes 0).
        rank_and_scatter_tile<BINS>(base, valid, digit_word, shift, mask, s, lanes, num_lanes, none, stage, 0);
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK) msd_count_b8(const MsdChunk* chunks, const u32* digit_word,
                                                                 u32 shift, u32 mask, u32* hist) {
    msd_count_impl<MSD_BINS_B8>(chunks, digit_word, shift, mask, hist);
}

extern "C" __global__ void __launch_bounds__(BLOCK) msd_count_b11(const MsdChunk* chunks, const u32* digit_word,
                                                                  u32 shift, u32 mask, u32* hist) {
    msd_count_impl<MSD_BINS_B11>(chunks, digit_word, shift, mask, hist);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 2)
    msd_scatter_b8(const MsdChunk* chunks, const u32* digit_word, u32 shift, u32 mask, const u32* offsets,
                   const Lane* lanes, u32 num_lanes) {
    msd_scatter_impl<MSD_BINS_B8, u32>(chunks, digit_word, shift, mask, offsets, lanes, num_lanes);
}

extern "C" __global__ void __launch_bounds__(BLOCK, 2)
    msd_scatter_b11(const MsdChunk* chunks, const u32* digit_word, u32 shift, u32 mask, const u32* offsets,
                    const Lane* lanes, u32 num_lanes) {
    msd_scatter_impl<MSD_BINS_B11, u16>(chunks, digit_word, shift, mask, offsets, lanes, num_lanes);
}

// A partitioned segment: its first chunk's `hist`, its chunk count (`stride`) and `bias`.
struct MsdSeg {
    u32 hist;
    u32 stride;
    u32 bias;
    u32 pad;
};

// starts[s * bins + d]: the first row of digit d of partitioned segment s after the pass.
extern "C" __global__ void msd_subsegments(const MsdSeg* segs, u32 num_segs, u32 bins, const u32* offsets,
                                           u32* starts) {
    const size_t total = (size_t)num_segs * bins;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const MsdSeg s = segs[i / bins];
        starts[i] = s.bias + offsets[s.hist + (size_t)(i % bins) * s.stride];
    }
}

// ---- block-local sorts ----

// From the host: LOCAL_BLOCK threads a block, batches of at most LOCAL_CAP rows, LOCAL_MAX_WORDS
// key words and LOCAL_MAX_SEGS segments; LANE_SKIP marks a lane the block-local sort leaves
// unwritten (a key word nobody reads afterwards).
#define LOCAL_IPT (LOCAL_CAP / LOCAL_BLOCK)

// The remaining digits of segments finalized at one partition depth: the key words to load
// (lane indices) and `num_digits` digits at digit_table[digits..], least significant first,
// each `slot | shift << 8 | bits << 16` (slot: which loaded word; bits <= 8).
struct LocalPlan {
    u32 num_words;
    u32 words[LOCAL_MAX_WORDS];
    u32 num_digits;
    u32 digits;
    u32 pad;
};

// A batch: consecutive segments of one depth, `len` <= LOCAL_CAP rows from `start`. With
// `segs` > 1 the segments start at seg_starts[seg_first..seg_first + segs] (relative to
// `start`). The rows are in buffer `src` of every lane: lanes[src * num_lanes + l].
struct LocalBatch {
    u32 start;
    u32 len;
    u32 segs;
    u32 seg_first;
    u32 plan;
    u32 src;
    u32 pad0, pad1;
};

__device__ __forceinline__ u32 local_elem(u32 j) {
    return (threadIdx.x / 32) * (LOCAL_IPT * 32) + j * 32 + (threadIdx.x % 32);
}

// The segment of batch row x: the last i with s_segs[i] <= x.
__device__ __forceinline__ u32 segment_of(const u32* s_segs, u32 segs, u32 x) {
    u32 lo = 0, hi = segs;  // s_segs[lo] <= x < s_segs[hi]
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (s_segs[mid] <= x) lo = mid; else hi = mid;
    }
    return lo;
}

// One lane through shared memory: the batch's rows (value `part` of SCALE values of T per row)
// are loaded whole into `area`, then row k of the output is row perm[k] of the batch.
template <typename T, int SCALE>
__device__ __forceinline__ void local_move(const Lane& lane, u32 start, u32 len, const u16* perm, u8* area, u32 part) {
    constexpr u32 GROUP = 8;  // loads in flight per thread
    T* st = reinterpret_cast<T*>(area);
    const T* src = reinterpret_cast<const T*>(lane.src) + (size_t)start * SCALE + part;
#pragma unroll
    for (u32 g = 0; g < LOCAL_IPT; g += GROUP) {
        T v[GROUP];
#pragma unroll
        for (u32 j = 0; j < GROUP; j++) {
            const u32 e = threadIdx.x + (g + j) * LOCAL_BLOCK;
            if (e < len) v[j] = src[e * SCALE];
        }
#pragma unroll
        for (u32 j = 0; j < GROUP; j++) {
            const u32 e = threadIdx.x + (g + j) * LOCAL_BLOCK;
            if (e < len) st[e] = v[j];
        }
    }
    __syncthreads();
    T* dst = reinterpret_cast<T*>(lane.dst) + (size_t)start * SCALE + part;
#pragma unroll
    for (u32 j = 0; j < LOCAL_IPT; j++) {
        const u32 k = threadIdx.x + j * LOCAL_BLOCK;
        if (k < len) dst[k * SCALE] = st[perm[k]];
    }
    __syncthreads();
}

// Dynamic shared memory: `key_area` bytes (LOCAL_CAP rows of each loaded key word, reused as
// the staging of the other lanes: at least LOCAL_CAP * min(widest lane, 8) bytes), then two
// index arrays of LOCAL_CAP u16.
extern "C" __global__ void __launch_bounds__(LOCAL_BLOCK, 2)
    msd_local(const LocalBatch* batches, const LocalPlan* plans, const u32* digit_table, const u32* seg_starts,
              const Lane* lanes, u32 num_lanes, u32 key_area) {
    extern __shared__ __align__(16) u8 local_smem[];
    __shared__ RankShared<256, LOCAL_BLOCK, u16> rs;
    __shared__ u32 s_segs[LOCAL_MAX_SEGS + 1];
    const LocalBatch b = batches[blockIdx.x];
    const LocalPlan* plan = plans + b.plan;
    const u32 num_words = plan->num_words;
    const Lane* from = lanes + (size_t)b.src * num_lanes;
    u32* kw = reinterpret_cast<u32*>(local_smem);
    u16* in = reinterpret_cast<u16*>(local_smem + key_area);
    u16* out = in + LOCAL_CAP;

    // The remaining key words and the identity order.
    for (u32 r = 0; r < num_words; r++) {
        const u32* src = reinterpret_cast<const u32*>(from[plan->words[r]].src) + b.start;
#pragma unroll
        for (u32 g = 0; g < LOCAL_IPT; g += 8) {
            u32 v[8];
#pragma unroll
            for (u32 j = 0; j < 8; j++) {
                const u32 e = threadIdx.x + (g + j) * LOCAL_BLOCK;
                if (e < b.len) v[j] = src[e];
            }
#pragma unroll
            for (u32 j = 0; j < 8; j++) {
                const u32 e = threadIdx.x + (g + j) * LOCAL_BLOCK;
                if (e < b.len) kw[r * LOCAL_CAP + e] = v[j];
            }
        }
    }
    for (u32 e = threadIdx.x; e < b.len; e += LOCAL_BLOCK) in[e] = (u16)e;
    if (b.segs > 1) {
        for (u32 i = threadIdx.x; i < b.segs; i += LOCAL_BLOCK) s_segs[i] = seg_starts[b.seg_first + i];
        if (threadIdx.x == 0) s_segs[b.segs] = b.len;
    }
    __syncthreads();

    // LSD passes over the remaining digits, then (several segments) over the segment.
    const u32 passes = plan->num_digits + (b.segs > 1 ? 1 : 0);
    for (u32 p = 0; p < passes; p++) {
        const bool seg_pass = p == plan->num_digits;
        u32 slot = 0, shift = 0, mask = 0;
        if (!seg_pass) {
            const u32 dg = digit_table[plan->digits + p];
            slot = dg & 0xff;
            shift = (dg >> 8) & 0xff;
            mask = (1u << (dg >> 16)) - 1;
        }
        const u32* word = kw + slot * LOCAL_CAP;
        u32 dp[LOCAL_IPT];
#pragma unroll
        for (u32 j = 0; j < LOCAL_IPT; j++) {
            const u32 e = local_elem(j);
            if (e < b.len) {
                const u32 x = in[e];
                dp[j] = seg_pass ? segment_of(s_segs, b.segs, x) : (word[x] >> shift) & mask;
            } else {
                dp[j] = 256;
            }
        }
        rank_items<256, LOCAL_BLOCK, LOCAL_IPT, u16>(dp, rs);
#pragma unroll
        for (u32 j = 0; j < LOCAL_IPT; j++) {
            const u32 e = local_elem(j);
            if (e < b.len) out[dp[j]] = in[e];
        }
        __syncthreads();
        u16* t = in;
        in = out;
        out = t;
    }
    const u16* perm = in;

    // Key words that are in shared memory go out from there first; then every other lane is
    // staged through the key area.
    for (u32 l = 0; l < num_lanes; l++) {
        const Lane lane = from[l];
        if (lane.flags & LANE_SKIP) continue;
        for (u32 r = 0; r < num_words; r++) {
            if (plan->words[r] != l) continue;
            u32* dst = reinterpret_cast<u32*>(lane.dst) + b.start;
            for (u32 k = threadIdx.x; k < b.len; k += LOCAL_BLOCK) dst[k] = kw[r * LOCAL_CAP + perm[k]];
        }
    }
    __syncthreads();
    for (u32 l = 0; l < num_lanes; l++) {
        const Lane lane = from[l];
        if (lane.flags & LANE_SKIP) continue;
        bool loaded = false;
        for (u32 r = 0; r < num_words; r++) loaded |= plan->words[r] == l;
        if (loaded) continue;
        if (lane.flags & LANE_IOTA) {
            u32* dst = reinterpret_cast<u32*>(lane.dst) + b.start;
            for (u32 k = threadIdx.x; k < b.len; k += LOCAL_BLOCK) dst[k] = b.start + perm[k];
            continue;
        }
        switch (lane.width) {
            case 1: local_move<u8, 1>(lane, b.start, b.len, perm, local_smem, 0); break;
            case 2: local_move<u16, 1>(lane, b.start, b.len, perm, local_smem, 0); break;
            case 4: local_move<u32, 1>(lane, b.start, b.len, perm, local_smem, 0); break;
            case 8: local_move<u64, 1>(lane, b.start, b.len, perm, local_smem, 0); break;
            default:
                local_move<u64, 2>(lane, b.start, b.len, perm, local_smem, 0);
                local_move<u64, 2>(lane, b.start, b.len, perm, local_smem, 1);
                break;
        }
    }
}
