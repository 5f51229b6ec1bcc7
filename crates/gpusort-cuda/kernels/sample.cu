// sample.cu — sample sort of records, the paper's comparison sort (Bandyopadhyay & Sahni,
// "Sorting Large Multifield Records on a GPU", section IV, after the GPU sample sort of
// Leischner, Osipov & Sanders).
//
// The paper's four phases, for all segments of one level at once:
//   1. sample_splitters: a block per segment draws SAMPLE_SIZE keys at pseudo-random rows of the
//      segment, sorts them in shared memory (a bitonic sorting network, as the paper sorts its
//      sample with odd-even merge sort) and keeps every SAMPLE_OVERSAMPLE-th as a splitter;
//   2. sample_classify: a block per chunk of a segment loads the segment's splitters into shared
//      memory, finds each row's bucket by binary search (the implicit search tree of the paper),
//      writes it and counts the chunk's buckets;
//   3. the exclusive scan of the counts (grs.cu's scan), laid out as msd.cu's partition passes
//      lay theirs, so that
//   4. msd.cu's partition scatter moves every row, directly (every column) or indirectly (key
//      words and row index), to its bucket: stably, tile by tile through shared memory.
//
// A row goes to bucket 2i when i splitters are below its key and the next is above it, and to
// bucket 2i + 1 when it equals splitter i: SAMPLE_SPLITTERS splitters make 2 * SAMPLE_SPLITTERS
// + 1 <= 256 buckets. A bucket of keys equal to a splitter is sorted already, so heavy
// duplicates end at the first level that samples them. The other buckets still larger than
// one block are split again by splitters of their own; then every bucket is sorted in shared
// memory by msd.cu's block-local sort on the whole key (the paper's quicksort of small buckets;
// a block-local radix sort here, which keeps ties in input order).
//
// Keys are up to LOCAL_MAX_WORDS 32-bit words (w0 most significant), compared in order.

#if !defined(SAMPLE_SPLITTERS) || !defined(SAMPLE_OVERSAMPLE) || !defined(SAMPLE_SIZE) || !defined(LOCAL_MAX_WORDS)
#error "defined by the host before the sources (kernels.rs SHARED_CONSTANTS, KernelTuning::defines)"
#endif

static_assert((SAMPLE_SIZE & (SAMPLE_SIZE - 1)) == 0, "the bitonic network sorts a power of two");
static_assert((SAMPLE_SPLITTERS + 1) * SAMPLE_OVERSAMPLE == SAMPLE_SIZE, "splitters are evenly spaced");
static_assert(((SAMPLE_SPLITTERS + 1) & SAMPLE_SPLITTERS) == 0, "the search tree is full");
static_assert(2 * SAMPLE_SPLITTERS + 1 <= 256, "buckets fit msd_scatter_b8");

// The key words of a level, each in the buffer the level reads (the host's `SampleWords`); the
// kernels take how many there are beside it.
struct SampleKey {
    const u32* w0;
    const u32* w1;
    const u32* w2;
    const u32* w3;
};

// Word k of row r (k < LOCAL_MAX_WORDS = 4: a switch, so the struct stays in registers).
__device__ __forceinline__ u32 key_word(const SampleKey& key, u32 k, size_t r) {
    switch (k) {
        case 0: return key.w0[r];
        case 1: return key.w1[r];
        case 2: return key.w2[r];
        default: return key.w3[r];
    }
}

// A segment of the level: its first row and rows.
struct SampleSeg {
    u32 start;
    u32 len;
};

// As msd.cu's MsdChunk, the host's one chunk table for both (`seg`: msd.cu's pad0).
struct SampleChunk {
    u32 start;
    u32 len;
    u32 hist;
    u32 stride;
    u32 bias;
    u32 seg;  // the chunk's segment in the level's splitter table
    u32 pad1, pad2;
};

// Row i of the sample of a segment of `len` rows: a hash of (segment, i) scaled to the rows.
__device__ __forceinline__ u32 sample_row(u32 seg, u32 i, u32 len) {
    u32 h = i * 0x9e3779b9u ^ (seg + 0x7f4a7c15u) * 0x85ebca6bu;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    return (u32)(((u64)h * len) >> 32);
}

// Whether sample a's key is below sample b's (words stored word-major, SAMPLE_SIZE apart).
__device__ __forceinline__ bool sample_less(const u32* s, u32 words, u32 a, u32 b) {
#pragma unroll
    for (u32 k = 0; k < LOCAL_MAX_WORDS; k++) {
        if (k >= words) break;
        const u32 x = s[k * SAMPLE_SIZE + a], y = s[k * SAMPLE_SIZE + b];
        if (x != y) return x < y;
    }
    return false;
}

// Phase 1: SAMPLE_SPLITTERS splitters of each segment, word-major:
// splitters[(seg * words + k) * SAMPLE_SPLITTERS + j]. Dynamic shared memory: SAMPLE_SIZE words
// of each key word, then SAMPLE_SIZE u16 sample indices.
extern "C" __global__ void __launch_bounds__(BLOCK)
    sample_splitters(const SampleSeg* segs, SampleKey key, u32 words, u32* splitters) {
    extern __shared__ __align__(16) u8 sample_smem[];
    u32* s = reinterpret_cast<u32*>(sample_smem);
    u16* ord = reinterpret_cast<u16*>(s + (size_t)words * SAMPLE_SIZE);
    const SampleSeg seg = segs[blockIdx.x];
    for (u32 i = threadIdx.x; i < SAMPLE_SIZE; i += BLOCK) {
        const size_t r = (size_t)seg.start + sample_row(blockIdx.x, i, seg.len);
#pragma unroll
        for (u32 k = 0; k < LOCAL_MAX_WORDS; k++) {
            if (k >= words) break;
            s[k * SAMPLE_SIZE + i] = key_word(key, k, r);
        }
        ord[i] = (u16)i;
    }
    __syncthreads();
    // Bitonic sort of the indices by their keys.
    for (u32 size = 2; size <= SAMPLE_SIZE; size <<= 1) {
        for (u32 stride = size / 2; stride > 0; stride >>= 1) {
            for (u32 t = threadIdx.x; t < SAMPLE_SIZE / 2; t += BLOCK) {
                const u32 lo = 2 * t - (t & (stride - 1));
                const u32 hi = lo + stride;
                const bool up = (lo & size) == 0;
                const u16 a = ord[lo], b = ord[hi];
                if (sample_less(s, words, b, a) == up) {
                    ord[lo] = b;
                    ord[hi] = a;
                }
            }
            __syncthreads();
        }
    }
    u32* out = splitters + (size_t)blockIdx.x * words * SAMPLE_SPLITTERS;
    for (u32 j = threadIdx.x; j < SAMPLE_SPLITTERS; j += BLOCK) {
        const u32 at = ord[(j + 1) * SAMPLE_OVERSAMPLE - 1];
#pragma unroll
        for (u32 k = 0; k < LOCAL_MAX_WORDS; k++) {
            if (k >= words) break;
            out[k * SAMPLE_SPLITTERS + j] = s[k * SAMPLE_SIZE + at];
        }
    }
}

// Phase 2: the bucket of every row of each chunk (written at the row, for the scatter) and the
// chunk's bucket counts, laid out as msd_count's: hist[c.hist + b * c.stride]. A segment's
// `depth[seg]` (1 to 7) is how far down the search tree its rows go: 2^depth - 1 of its
// splitters, evenly spaced, split it, so a segment a little larger than a block is cut into a
// few buckets, not 255.
extern "C" __global__ void __launch_bounds__(BLOCK)
    sample_classify(const SampleChunk* chunks, SampleKey key, u32 words, const u32* splitters, const u32* depth,
                    u32* bucket, u32* hist) {
    constexpr u32 BINS = 256;
    __shared__ u32 h[WARPS][BINS];
    __shared__ u32 sp[LOCAL_MAX_WORDS][SAMPLE_SPLITTERS];
    const SampleChunk c = chunks[blockIdx.x];
    for (u32 i = threadIdx.x; i < WARPS * BINS; i += BLOCK) (&h[0][0])[i] = 0;
    const u32* mine_sp = splitters + (size_t)c.seg * words * SAMPLE_SPLITTERS;
    for (u32 i = threadIdx.x; i < words * SAMPLE_SPLITTERS; i += BLOCK) (&sp[0][0])[i] = mine_sp[i];
    __syncthreads();
    u32* mine = h[threadIdx.x / 32];
    // The subset's spacing: its splitters are sp[k * gap - 1], k = 1 .. 2^depth - 1.
    const u32 gap = (SAMPLE_SPLITTERS + 1) >> depth[c.seg];
    for (u32 i = threadIdx.x; i < c.len; i += BLOCK) {
        const size_t r = (size_t)c.start + i;
        u32 w[LOCAL_MAX_WORDS];
#pragma unroll
        for (u32 k = 0; k < LOCAL_MAX_WORDS; k++) w[k] = k < words ? key_word(key, k, r) : 0;
        // pos: gap x the subset's splitters below the key (the implicit tree, root at the middle).
        u32 pos = 0;
#pragma unroll
        for (u32 step = (SAMPLE_SPLITTERS + 1) / 2; step > 0; step >>= 1) {
            if (step < gap) break;
            const u32 j = pos + step - 1;
            bool below = false;  // splitter j < key
#pragma unroll
            for (u32 k = 0; k < LOCAL_MAX_WORDS; k++) {
                if (k >= words) break;
                const u32 x = sp[k][j];
                if (x != w[k]) {
                    below = x < w[k];
                    break;
                }
            }
            if (below) pos += step;
        }
        // The next splitter of the subset, which the key may equal.
        const u32 next = pos + gap - 1;
        bool equal = next < SAMPLE_SPLITTERS;
#pragma unroll
        for (u32 k = 0; k < LOCAL_MAX_WORDS; k++) {
            if (k >= words) break;
            if (equal) equal = sp[k][next < SAMPLE_SPLITTERS ? next : 0] == w[k];
        }
        const u32 b = 2 * (pos / gap) + (equal ? 1 : 0);
        bucket[r] = b;
        atomicAdd(&mine[b], 1u);
    }
    __syncthreads();
    for (u32 b = threadIdx.x; b < BINS; b += BLOCK) {
        u32 sum = 0;
#pragma unroll
        for (u32 x = 0; x < WARPS; x++) sum += h[x][b];
        hist[c.hist + (size_t)b * c.stride] = sum;
    }
}
