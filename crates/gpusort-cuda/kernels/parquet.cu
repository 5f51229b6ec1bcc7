// parquet.cu — Parquet data pages decoded on the GPU into Arrow's layout (issue 20: the reading
// phase of the `gpusort` tool; kernels/NOTES.md, "Parquet decode on the GPU: the plan", step 3).
// Not from the papers: the sort's input is read here, before Bandyopadhyay & Sahni's ByField
// columns exist. The pages were decompressed on the device first (nvCOMP, nvcomp.rs); the host
// says where each page lies and what it holds (ParquetPage below). Flat columns only: a column
// is required (no levels) or optional with definition levels of 0 and 1.
//
// * parquet_plain_views: byte arrays stored PLAIN (a 4-byte little-endian length, then the
//   bytes, value after value) as Arrow views of 16 bytes: the length, then the bytes themselves
//   when there are at most 12, else their first 4, a buffer index and the offset of the bytes in
//   that buffer. The views point into the decompressed pages: no byte is copied. One block takes
//   a region (a dictionary page of byte arrays, or a PLAIN data page's values) a chunk of shared
//   memory at a time; one thread walks the chunk's lengths, since each says where the next value
//   starts, and the block writes the views.
// * parquet_decode: one block a data page, in tiles of PARQUET_TILE values. The definition
//   levels and the dictionary indices are the RLE / bit-packed hybrid: a run header (ULEB128;
//   low bit 1: (header >> 1) groups of 8 values bit-packed, LSB first; 0: (header >> 1) copies
//   of one value of ceil(bit width / 8) bytes). Thread 0 reads the headers of the runs that cover
//   the tile into a table in shared memory; each thread then finds its value's run by binary
//   search and reads it. A tile's levels say which rows hold values; a block scan numbers them,
//   and each valid row takes its value: a PLAIN value from the page, or a dictionary entry
//   (fixed width: read from the dictionary page; byte arrays: the entry's view). Fixed-width
//   values are widened or narrowed to the column's Arrow width on the way (INT32 to 8, 16 or
//   128 bits, INT64 to 128, with the sign where it has one). Null rows get zeros and a clear bit
//   in the column's validity, which a warp sets 32 rows at a time with atomicOr (pages begin at
//   any row, so two blocks may share a word).
//
// Corrupt pages (a header or bits past the page's end, an index outside the dictionary, a level
// above 1, a bit width above 32) stop their block and leave an error code and the page's index
// in `error[0..2]` for the host, which fails the read.

#if !defined(PARQUET_BLOCK) || !defined(PARQUET_TILE) || !defined(PARQUET_VIEWS_BLOCK) || !defined(PARQUET_VIEWS_CHUNK) || !defined(PARQUET_PLAIN) || !defined(PARQUET_DICT) || \
    !defined(PARQUET_V1_LEVELS) || !defined(PARQUET_OPTIONAL)
#error "the Parquet decoder's constants come from the host (kernels.rs SHARED_CONSTANTS)"
#endif

#define PARQUET_ITEMS (PARQUET_TILE / PARQUET_BLOCK)

// Error codes (kernels.rs ParquetError's).
#define PQ_ERR_HEADER 1u      // a run header or an RLE value past the end of its bytes
#define PQ_ERR_BITS 2u        // bit-packed values past the end of their bytes
#define PQ_ERR_DICT 3u        // a dictionary index outside the dictionary
#define PQ_ERR_PLAIN 4u       // PLAIN values past the end of the page
#define PQ_ERR_WIDTH 5u       // a bit width above 32
#define PQ_ERR_LEVEL 6u       // a definition level above 1
#define PQ_ERR_LEVELS_LEN 7u  // a v1 page's levels longer than the page

// The view of a value a PLAIN region does not hold (its bytes ended first): parquet_decode fails
// a row that takes it. An optional column's page holds fewer values than rows, a number its
// host does not know; its region ends where the bytes do.
#define PQ_MISSING_VIEW 0xffffffffu

// One data page of a column (the host's ParquetPage, 88 bytes).
struct ParquetPage {
    const u8* data;      // the page decompressed: v1: [4-byte length, levels] when PARQUET_V1_LEVELS, then values
    const u8* levels;    // v2 pages of optional columns: the definition levels; else unused
    const u8* dict;      // PARQUET_DICT: the dictionary's values (fixed width) or views (byte arrays);
                         // PLAIN byte arrays: this page's views (parquet_plain_views)
    u8* out;             // the column's values, out_width bytes a row
    u32* validity;       // the column's validity bits (zeroed by the host), or null: required
    u64 row;             // the output row of the page's first value
    u32 data_len;        // bytes of `data`
    u32 levels_len;      // bytes of `levels`
    u32 num_values;      // rows of the page, nulls included
    u32 dict_len;        // entries of `dict`
    u32 encoding;        // PARQUET_PLAIN or PARQUET_DICT
    u32 flags;           // PARQUET_OPTIONAL, PARQUET_V1_LEVELS
    u32 in_width;        // bytes of a PLAIN value: 4 or 8; 0: byte arrays (16-byte views)
    u32 out_width;       // bytes of an output value: 1, 2, 4, 8 or 16
    u32 sign;            // widen with the sign
    u32 pad;
};
static_assert(sizeof(ParquetPage) == 88, "kernels.rs ParquetPage");

// A run of the hybrid encoding as a tile meets it: values from tile position `first` on, the
// first of them the run's value number `base`. `bits` is the offset of a bit-packed run's data
// from the stream's start, or ~0u for an RLE run of `value`.
struct HybridRun {
    u32 first;
    u32 value;
    u32 bits;
    u32 base;
};

// Where thread 0 is in one hybrid stream between tiles.
struct HybridCursor {
    const u8* start;
    u32 len;
    u32 pos;     // the next header's offset
    u32 width;   // bits a value
    u32 left;    // values left in the current run
    u32 taken;   // values of the current run already met
    u32 value;   // the current RLE run's value
    u32 bits;    // the current bit-packed run's offset, or ~0u
};

__device__ __forceinline__ HybridCursor hybrid_cursor(const u8* start, u32 len, u32 width) {
    HybridCursor c;
    c.start = start;
    c.len = len;
    c.pos = 0;
    c.width = width;
    c.left = 0;
    c.taken = 0;
    c.value = 0;
    c.bits = ~0u;
    return c;
}

// The next run header of `c`: false (and an error code) where the bytes end first.
__device__ __forceinline__ bool hybrid_next_run(HybridCursor& c, u32* code) {
    u64 header = 0;
    u32 shift = 0;
    for (;;) {
        if (c.pos >= c.len || shift > 35) {
            *code = PQ_ERR_HEADER;
            return false;
        }
        const u8 b = c.start[c.pos++];
        header |= (u64)(b & 0x7f) << shift;
        shift += 7;
        if (!(b & 0x80)) break;
    }
    c.taken = 0;
    if (header & 1) {
        const u64 groups = header >> 1;
        const u64 bytes = groups * c.width;
        c.left = (u32)min(groups * 8, (u64)0xffffffffu);
        c.bits = c.pos;
        // A last run cut short is found when a value past the bytes is read.
        c.pos = (u32)min((u64)c.pos + bytes, (u64)c.len);
    } else {
        const u32 nbytes = (c.width + 7) / 8;
        if (c.pos + nbytes > c.len) {
            *code = PQ_ERR_HEADER;
            return false;
        }
        u32 v = 0;
        for (u32 i = 0; i < nbytes; i++) v |= (u32)c.start[c.pos + i] << (8 * i);
        c.pos += nbytes;
        c.left = (u32)min(header >> 1, (u64)0xffffffffu);
        c.value = c.width < 32 ? v & ((1u << c.width) - 1) : v;
        c.bits = ~0u;
    }
    return true;
}

// Thread 0: the runs of `c` covering its next `count` values into `runs`; returns how many
// (0 with `*code` set where the stream ends first).
__device__ u32 hybrid_fill(HybridCursor& c, u32 count, HybridRun* runs, u32* code) {
    u32 n = 0, t = 0;
    while (t < count) {
        if (c.left == 0) {
            if (!hybrid_next_run(c, code)) return 0;
            continue;
        }
        const u32 take = min(c.left, count - t);
        runs[n].first = t;
        runs[n].value = c.value;
        runs[n].bits = c.bits;
        runs[n].base = c.taken;
        n++;
        t += take;
        c.left -= take;
        c.taken += take;
    }
    return n;
}

// Value `t` of the tile (t < the count filled), from the `nruns` runs of `runs`; false where its
// bits lie past the stream's bytes.
__device__ __forceinline__ bool hybrid_get(const u8* start, u32 len, u32 width, const HybridRun* runs, u32 nruns,
                                           u32 t, u32* out) {
    u32 lo = 0, hi = nruns;  // the last run with first <= t
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (runs[mid].first <= t)
            lo = mid;
        else
            hi = mid;
    }
    const HybridRun r = runs[lo];
    if (r.bits == ~0u) {
        *out = r.value;
        return true;
    }
    if (width == 0) {
        *out = 0;
        return true;
    }
    const u64 bit = (u64)(r.base + (t - r.first)) * width;
    const u64 at = r.bits + (bit >> 3);
    const u32 shift = (u32)(bit & 7);
    const u32 need = (shift + width + 7) / 8;
    if (at + need > len) return false;
    u64 w = 0;
    for (u32 i = 0; i < need; i++) w |= (u64)start[at + i] << (8 * i);
    *out = (u32)((w >> shift) & ((1ull << width) - 1));
    return true;
}

// Bytes [at, at + n) of `p` as a little-endian integer (n <= 8).
__device__ __forceinline__ u64 load_le(const u8* p, u32 n) {
    u64 v = 0;
    for (u32 i = 0; i < n; i++) v |= (u64)p[i] << (8 * i);
    return v;
}

// A fixed-width value of `in_width` bytes written as `out_width` bytes at `out`.
__device__ __forceinline__ void store_fixed(const u8* src, u32 in_width, u32 out_width, bool sign, u8* out) {
    const u64 raw = load_le(src, in_width);
    u64 v = raw;
    if (in_width == 4 && sign) v = (u64)(long long)(int)(u32)raw;
    switch (out_width) {
        case 1: *out = (u8)v; break;
        case 2: *(u16*)out = (u16)v; break;
        case 4: *(u32*)out = (u32)v; break;
        case 8: *(u64*)out = v; break;
        default: {
            const u64 high = (sign && (long long)v < 0) ? ~0ull : 0ull;
            ((u64*)out)[0] = v;
            ((u64*)out)[1] = high;
        }
    }
}

__device__ __forceinline__ void store_zero(u32 out_width, u8* out) {
    switch (out_width) {
        case 1: *out = 0; break;
        case 2: *(u16*)out = 0; break;
        case 4: *(u32*)out = 0; break;
        case 8: *(u64*)out = 0; break;
        default: *(uint4*)out = make_uint4(0, 0, 0, 0);
    }
}

// Records the first error: its code and the page's index.
__device__ __forceinline__ void report(u32* error, u32 code, u32 page) {
    if (atomicCAS(error, 0u, code) == 0u) error[1] = page;
}

// Shared state of a parquet_decode block.
struct DecodeShared {
    HybridRun level_runs[PARQUET_TILE];
    HybridRun value_runs[PARQUET_TILE];
    u32 warp_sums[PARQUET_BLOCK / 32];
    u32 nlevel_runs, nvalue_runs, code;
};

// Thread 0: where the page's levels and values start; a code where the page is too short.
__device__ __forceinline__ u32 page_streams(const ParquetPage& p, const u8** levels, u32* levels_len,
                                            const u8** values, u32* values_len) {
    *levels = p.levels;
    *levels_len = p.levels_len;
    *values = p.data;
    *values_len = p.data_len;
    if (p.flags & PARQUET_V1_LEVELS) {
        if (p.data_len < 4) return PQ_ERR_LEVELS_LEN;
        const u32 n = (u32)load_le(p.data, 4);
        if (n > p.data_len - 4) return PQ_ERR_LEVELS_LEN;
        *levels = p.data + 4;
        *levels_len = n;
        *values = p.data + 4 + n;
        *values_len = p.data_len - 4 - n;
    }
    return 0;
}

// One block a page of `pages`; see the file's top.
extern "C" __global__ void __launch_bounds__(PARQUET_BLOCK)
    parquet_decode(const ParquetPage* __restrict__ pages, u32* error) {
    __shared__ DecodeShared s;
    __shared__ const u8* s_levels;
    __shared__ const u8* s_values;
    __shared__ u32 s_levels_len, s_values_len, s_width;
    const u32 page = blockIdx.x;
    const ParquetPage p = pages[page];
    const bool optional = (p.flags & PARQUET_OPTIONAL) != 0;
    const bool dict = p.encoding == PARQUET_DICT;
    HybridCursor lc, vc;  // thread 0's
    if (threadIdx.x == 0) {
        u32 code = page_streams(p, &s_levels, &s_levels_len, &s_values, &s_values_len);
        s_width = 0;
        if (!code && dict) {
            // The values begin with the indices' bit width.
            if (s_values_len < 1) {
                code = PQ_ERR_HEADER;
            } else {
                s_width = s_values[0];
                if (s_width > 32) code = PQ_ERR_WIDTH;
            }
        }
        lc = hybrid_cursor(s_levels, s_levels_len, 1);
        vc = hybrid_cursor(s_values + (dict ? 1 : 0), s_values_len - (dict && s_values_len ? 1 : 0), s_width);
        s.code = code;
    }
    __syncthreads();
    if (s.code) {
        if (threadIdx.x == 0) report(error, s.code, page);
        return;
    }
    const u8* values = s_values;
    const u32 values_len = s_values_len, width = s_width;
    const u32 lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    u32 value_base = 0;
    for (u32 tile = 0; tile < p.num_values; tile += PARQUET_TILE) {
        const u32 count = min((u32)PARQUET_TILE, p.num_values - tile);
        if (threadIdx.x == 0 && optional) {
            u32 code = 0;
            s.nlevel_runs = hybrid_fill(lc, count, s.level_runs, &code);
            if (code) s.code = code;
        }
        __syncthreads();
        if (s.code) break;
        // Each thread's rows: t = j * PARQUET_BLOCK + threadIdx.x.
        bool valid[PARQUET_ITEMS];
        u32 bad = 0;
#pragma unroll
        for (u32 j = 0; j < PARQUET_ITEMS; j++) {
            const u32 t = j * PARQUET_BLOCK + threadIdx.x;
            valid[j] = t < count;
            if (optional && t < count) {
                u32 level = 0;
                if (!hybrid_get(s_levels, s_levels_len, 1, s.level_runs, s.nlevel_runs, t, &level)) bad = PQ_ERR_BITS;
                if (level > 1) bad = PQ_ERR_LEVEL;
                valid[j] = level == 1;
            }
        }
        // Number the valid rows in tile order.
        u32 before[PARQUET_ITEMS], total = 0;
#pragma unroll
        for (u32 j = 0; j < PARQUET_ITEMS; j++) {
            u32 sum;
            before[j] = total + block_exclusive_scan<PARQUET_BLOCK>(valid[j] ? 1u : 0u, s.warp_sums, &sum);
            total += sum;
        }
        if (bad) atomicMax(&s.code, bad);
        if (threadIdx.x == 0 && dict) {
            u32 code = 0;
            s.nvalue_runs = total ? hybrid_fill(vc, total, s.value_runs, &code) : 0;
            if (code) atomicMax(&s.code, code);
        }
        __syncthreads();
        if (s.code) break;
#pragma unroll
        for (u32 j = 0; j < PARQUET_ITEMS; j++) {
            const u32 t = j * PARQUET_BLOCK + threadIdx.x;
            const u64 row = p.row + tile + t;
            if (t < count) {
                u8* out = p.out + row * p.out_width;
                if (!valid[j]) {
                    store_zero(p.out_width, out);
                } else {
                    u32 index = value_base + before[j];
                    if (dict) {
                        if (!hybrid_get(values + 1, values_len - 1, width, s.value_runs, s.nvalue_runs, before[j],
                                        &index)) {
                            bad = PQ_ERR_BITS;
                        } else if (index >= p.dict_len) {
                            bad = PQ_ERR_DICT;
                        }
                    }
                    if (bad) {
                        store_zero(p.out_width, out);
                    } else if (p.in_width == 0) {
                        // Byte arrays: the dictionary's view, or this page's own.
                        const uint4 view = index < p.dict_len ? ((const uint4*)p.dict)[index]
                                                              : make_uint4(PQ_MISSING_VIEW, 0, 0, 0);
                        if (view.x == PQ_MISSING_VIEW) {
                            bad = PQ_ERR_PLAIN;
                            store_zero(p.out_width, out);
                        } else {
                            *(uint4*)out = view;
                        }
                    } else if (dict) {
                        store_fixed(p.dict + (u64)index * p.in_width, p.in_width, p.out_width, p.sign, out);
                    } else if ((u64)(index + 1) * p.in_width > values_len) {
                        bad = PQ_ERR_PLAIN;
                        store_zero(p.out_width, out);
                    } else {
                        store_fixed(values + (u64)index * p.in_width, p.in_width, p.out_width, p.sign, out);
                    }
                }
            }
            if (p.validity) {
                // The warp's 32 rows are consecutive: one word of bits, or two where the page's
                // rows do not start on a word.
                const u32 bits = __ballot_sync(FULL_MASK, t < count && valid[j]);
                if (lane == 0 && bits) {
                    const u64 first = p.row + tile + j * PARQUET_BLOCK + warp * 32;
                    const u32 shift = (u32)(first & 31);
                    atomicOr(p.validity + (first >> 5), bits << shift);
                    if (shift && (bits >> (32 - shift))) atomicOr(p.validity + (first >> 5) + 1, bits >> (32 - shift));
                }
            }
        }
        if (bad) atomicMax(&s.code, bad);
        value_base += total;
        __syncthreads();
        if (s.code) break;
    }
    if (threadIdx.x == 0 && s.code) report(error, s.code, page);
}

// A region of PLAIN byte arrays (the host's ViewRegion, 40 bytes): `count` values at most in
// `len` bytes at `data` (a v1 page's levels first where `flags` has PARQUET_V1_LEVELS), their
// views to `views`; long values' views say buffer `buffer` and their offsets from `base`.
struct ViewRegion {
    const u8* data;
    u8* views;
    u64 base;
    u32 len;
    u32 count;
    u32 buffer;
    u32 flags;
};
static_assert(sizeof(ViewRegion) == 40, "kernels.rs ViewRegion");

// The view of the `n` bytes at `bytes` (offset `at` from the region's base).
__device__ __forceinline__ uint4 make_view(const u8* bytes, u32 n, u32 buffer, u32 at) {
    uint4 view = make_uint4(n, 0, 0, 0);
    if (n <= 12) {
        u32 w[3] = {0, 0, 0};
        for (u32 k = 0; k < n; k++) w[k / 4] |= (u32)bytes[k] << (8 * (k % 4));
        view.y = w[0];
        view.z = w[1];
        view.w = w[2];
    } else {
        view.y = (u32)load_le(bytes, 4);
        view.z = buffer;
        view.w = at;
    }
    return view;
}

// Shared state of a parquet_plain_views block.
struct ViewsShared {
    u8 chunk[PARQUET_VIEWS_CHUNK];
    u32 start[PARQUET_VIEWS_CHUNK / 4];  // each value found in the chunk: where its bytes start
    u32 len[PARQUET_VIEWS_CHUNK / 4];
    const u8* data;
    u32 data_len, found, walked, cut;
};

// One block a region of `regions` (see the file's top): the block copies the next
// PARQUET_VIEWS_CHUNK bytes into shared memory, thread 0 walks the lengths there (the walk is
// serial: from global memory each step waited for the last one's load, ~40 ms for a dictionary
// of 40K strings on the H200), and the block writes the views found. A value longer than a
// chunk is taken alone, its length read from global memory. A value cut by the region's end is
// an error (PQ_ERR_PLAIN, with the region's index).
extern "C" __global__ void __launch_bounds__(PARQUET_VIEWS_BLOCK)
    parquet_plain_views(const ViewRegion* __restrict__ regions, u32* error) {
    __shared__ ViewsShared s;
    const u32 r = blockIdx.x;
    const ViewRegion g = regions[r];
    if (threadIdx.x == 0) {
        ParquetPage p;
        p.data = g.data;
        p.data_len = g.len;
        p.levels = nullptr;
        p.levels_len = 0;
        p.flags = g.flags;
        const u8* levels;
        u32 levels_len;
        s.cut = page_streams(p, &levels, &levels_len, &s.data, &s.data_len);
    }
    __syncthreads();
    if (s.cut) {
        if (threadIdx.x == 0) report(error, s.cut, r);
        return;
    }
    const u8* data = s.data;
    const u32 len = s.data_len;
    uint4* views = (uint4*)g.views;
    u32 pos = 0, i = 0;  // bytes walked, values found (the same in every thread)
    while (i < g.count && pos < len) {
        const u32 chunk = min((u32)PARQUET_VIEWS_CHUNK, len - pos);
        for (u32 b = threadIdx.x; b < chunk; b += blockDim.x) s.chunk[b] = data[pos + b];
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 at = 0, k = 0;
            while (i + k < g.count && at + 4 <= chunk) {
                const u32 n = (u32)load_le(s.chunk + at, 4);
                if (n > chunk - at - 4) break;
                s.start[k] = pos + at + 4;
                s.len[k] = n;
                k++;
                at += 4 + n;
            }
            if (k == 0) {
                // A value longer than a chunk (or cut by the region's end).
                const u32 n = len - pos >= 4 ? (u32)load_le(data + pos, 4) : ~0u;
                if (len - pos >= 4 && n <= len - pos - 4) {
                    s.start[0] = pos + 4;
                    s.len[0] = n;
                    k = 1;
                    at = 4 + n;
                } else {
                    s.cut = PQ_ERR_PLAIN;
                }
            }
            s.found = k;
            s.walked = at;
        }
        __syncthreads();
        if (s.cut) break;
        const u32 found = s.found;
        for (u32 k = threadIdx.x; k < found; k += blockDim.x) {
            const u32 at = s.start[k];
            views[i + k] = make_view(data + at, s.len[k], g.buffer, (u32)((u64)(data + at) - g.base));
        }
        i += found;
        pos += s.walked;
        __syncthreads();
    }
    if (threadIdx.x == 0 && s.cut) report(error, PQ_ERR_PLAIN, r);
    for (u32 k = i + threadIdx.x; k < g.count; k += blockDim.x) views[k] = make_uint4(PQ_MISSING_VIEW, 0, 0, 0);
}
