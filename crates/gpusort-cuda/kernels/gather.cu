// gather.cu — the record moves of the indirect strategy (Bandyopadhyay & Sahni, section III:
// after (key, index) pairs are sorted, "the original records are rearranged by copying
// records ... placing the records into their sorted positions"), and the bit plumbing of
// Arrow's validity bitmaps around the radix passes.
//
//   * gather_w*: out[i] = column[perm[i]] for ByField columns of 1, 2, 4, 8 or 16 bytes;
//   * gather_records: the same for row-major records (Hybrid), a group of threads per record
//     moving 16-, 8- or 4-byte pieces (paper Fig. 6);
//   * pack_rows / gather_unpack: several ByField columns gathered as one: packed into Hybrid
//     rows, each row fetched once, the columns written back out;
//   * gather_bits: a validity bitmap through the permutation, 32 rows per warp ballot;
//   * pack_validity / unpack_validity: up to 32 bitmaps as one u32 lane that moves with the
//     records in every pass (direct strategy), and back;
//   * copy_ranges: many device-to-device copies in one launch (the columns assembled from the
//     segments the input was uploaded in);
//   * views_block_bytes / views_compact: sorted string or binary views (Arrow's 16-byte
//     views) and their values' bytes laid out anew a block of output rows at a time, each
//     block's out-of-line bytes packed in row order (what Arrow's `gc` does on the host,
//     reading the values at random; here the random reads are the device's).

// Rows each thread gathers at once (GATHER_ROWS, from the host): their index loads, then their
// (random) row loads, are all in flight together before the first store. PACK_ROWS (from the
// host): rows of a pack_rows / gather_unpack block's tile, one per thread.
#if !defined(GATHER_ROWS) || !defined(PACK_ROWS)
#error "defined by the host before the sources (kernels.rs SHARED_CONSTANTS, KernelTuning::defines)"
#endif

// The permutation and the output stream through once (evict-first loads and stores), so that
// the source column, read at random, keeps the L2 cache: a 4-byte column of 10M rows (40 MB)
// fits the H100's 50 MB.
template <typename T>
__device__ __forceinline__ void gather_impl(u32 n, const T* __restrict__ src, const u32* __restrict__ perm,
                                            T* __restrict__ dst) {
    const size_t step = (size_t)gridDim.x * blockDim.x * GATHER_ROWS;
    for (size_t base = (size_t)blockIdx.x * blockDim.x * GATHER_ROWS + threadIdx.x; base < n; base += step) {
        u32 from[GATHER_ROWS];
#pragma unroll
        for (u32 j = 0; j < GATHER_ROWS; j++) {
            const size_t i = base + (size_t)j * blockDim.x;
            from[j] = i < n ? __ldcs(perm + i) : 0u;
        }
        T v[GATHER_ROWS];
#pragma unroll
        for (u32 j = 0; j < GATHER_ROWS; j++) {
            if (base + (size_t)j * blockDim.x < n) v[j] = __ldg(src + from[j]);
        }
#pragma unroll
        for (u32 j = 0; j < GATHER_ROWS; j++) {
            const size_t i = base + (size_t)j * blockDim.x;
            if (i < n) __stcs(dst + i, v[j]);
        }
    }
}

extern "C" __global__ void gather_w1(u32 n, const u8* src, const u32* perm, u8* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w2(u32 n, const u16* src, const u32* perm, u16* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w4(u32 n, const u32* src, const u32* perm, u32* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w8(u32 n, const u64* src, const u32* perm, u64* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w16(u32 n, const uint4* src, const u32* perm, uint4* dst) {
    gather_impl(n, src, perm, dst);
}

// Records of `bytes` bytes moved in `piece`-byte pieces (type P), GATHER_ROWS pieces per thread
// in flight.
template <typename P>
__device__ __forceinline__ void gather_pieces(u32 n, const u8* __restrict__ src, const u32* __restrict__ perm,
                                              u8* __restrict__ dst, u32 bytes) {
    const u32 per = bytes / sizeof(P);
    const size_t total = (size_t)n * per;
    const size_t step = (size_t)gridDim.x * blockDim.x * GATHER_ROWS;
    for (size_t base = (size_t)blockIdx.x * blockDim.x * GATHER_ROWS + threadIdx.x; base < total; base += step) {
        P v[GATHER_ROWS];
#pragma unroll
        for (u32 j = 0; j < GATHER_ROWS; j++) {
            const size_t q = base + (size_t)j * blockDim.x;
            if (q < total) {
                const size_t i = q / per, p = q - i * per;
                v[j] = __ldg(reinterpret_cast<const P*>(src + (size_t)perm[i] * bytes) + p);
            }
        }
#pragma unroll
        for (u32 j = 0; j < GATHER_ROWS; j++) {
            const size_t q = base + (size_t)j * blockDim.x;
            if (q < total) __stcs(reinterpret_cast<P*>(dst) + q, v[j]);
        }
    }
}

extern "C" __global__ void gather_records(u32 n, const u8* src, const u32* perm, u8* dst, u32 bytes, u32 piece) {
    if (piece == 16) {
        gather_pieces<uint4>(n, src, perm, dst, bytes);
    } else if (piece == 8) {
        gather_pieces<u64>(n, src, perm, dst, bytes);
    } else {
        gather_pieces<u32>(n, src, perm, dst, bytes);
    }
}

// ---- ByField columns gathered through rows (the paper's Hybrid layout, made on the fly) ----
//
// A gather of one narrow column reads a 32-byte sector for every 4-byte value it keeps, so
// gathering m ByField columns one by one costs m random sector reads per row. pack_rows first
// lays a group of columns out as row-major rows of up to 128 bytes (coalesced reads and
// writes through shared memory); gather_unpack then fetches each row once through the
// permutation, in 16-byte pieces, and writes every column of the group back out coalesced.

// One column of a packed group: its values, their width, and their byte offset in a row.
struct PackColumn {
    u64 ptr;
    u32 width;
    u32 offset;
};

// Columns whose values a pack_rows thread loads before it stores the first into the tile.
#define PACK_INFLIGHT 8

// Value `i` of column c, in the low bytes of a 16-byte register.
__device__ __forceinline__ uint4 load_value(const PackColumn& c, size_t i) {
    uint4 v = make_uint4(0, 0, 0, 0);
    switch (c.width) {
        case 1: v.x = reinterpret_cast<const u8*>(c.ptr)[i]; break;
        case 2: v.x = reinterpret_cast<const u16*>(c.ptr)[i]; break;
        case 4: v.x = reinterpret_cast<const u32*>(c.ptr)[i]; break;
        case 8: {
            const uint2 w = reinterpret_cast<const uint2*>(c.ptr)[i];
            v.x = w.x;
            v.y = w.y;
            break;
        }
        default: v = reinterpret_cast<const uint4*>(c.ptr)[i]; break;
    }
    return v;
}

// Stores the low c.width bytes of v at p.
__device__ __forceinline__ void store_value(const PackColumn& c, u8* p, uint4 v) {
    switch (c.width) {
        case 1: *p = (u8)v.x; break;
        case 2: *reinterpret_cast<u16*>(p) = (u16)v.x; break;
        case 4: *reinterpret_cast<u32*>(p) = v.x; break;
        case 8: *reinterpret_cast<uint2*>(p) = make_uint2(v.x, v.y); break;
        default: *reinterpret_cast<uint4*>(p) = v; break;
    }
}

// The group's column table, copied into shared memory after the tile (dynamic shared memory of
// PACK_ROWS * row_bytes + 16 * num_cols bytes), so that each tile reads it from there.
__device__ __forceinline__ const PackColumn* pack_columns_to_smem(u8* tile, u32 row_bytes, const PackColumn* cols,
                                                                 u32 num_cols) {
    PackColumn* sc = reinterpret_cast<PackColumn*>(tile + PACK_ROWS * row_bytes);
    for (u32 k = threadIdx.x; k < num_cols; k += PACK_ROWS) sc[k] = cols[k];
    __syncthreads();
    return sc;
}

// rows[i * row_bytes + offset of c ..] = row i of column c, for the n rows; row_bytes is a
// multiple of 16 and each offset a multiple of its column's width. Each thread takes one row of
// the tile and loads PACK_INFLIGHT columns' values before it stores the first into the tile, so
// that a warp has that many coalesced loads in flight (one at a time left the kernel waiting on
// DRAM latency: ~2.2 TB/s on the H100).
extern "C" __global__ void __launch_bounds__(PACK_ROWS)
    pack_rows(u32 n, const PackColumn* cols, u32 num_cols, u32 row_bytes, u8* rows) {
    extern __shared__ __align__(16) u8 tile[];
    const PackColumn* sc = pack_columns_to_smem(tile, row_bytes, cols, num_cols);
    for (size_t first = (size_t)blockIdx.x * PACK_ROWS; first < n; first += (size_t)gridDim.x * PACK_ROWS) {
        const u32 count = (u32)min((size_t)PACK_ROWS, n - first);
        if (threadIdx.x < count) {
            u8* row = tile + threadIdx.x * row_bytes;
            for (u32 k0 = 0; k0 < num_cols; k0 += PACK_INFLIGHT) {
                uint4 v[PACK_INFLIGHT];
#pragma unroll
                for (u32 j = 0; j < PACK_INFLIGHT; j++) {
                    if (k0 + j < num_cols) v[j] = load_value(sc[k0 + j], first + threadIdx.x);
                }
#pragma unroll
                for (u32 j = 0; j < PACK_INFLIGHT; j++) {
                    if (k0 + j < num_cols) store_value(sc[k0 + j], row + sc[k0 + j].offset, v[j]);
                }
            }
        }
        __syncthreads();
        const uint4* from = reinterpret_cast<const uint4*>(tile);
        uint4* to = reinterpret_cast<uint4*>(rows + first * row_bytes);
        for (u32 q = threadIdx.x; q < count * row_bytes / 16; q += PACK_ROWS) to[q] = from[q];
        __syncthreads();
    }
}

// Row i of every column of the group = row perm[i] of `rows`, for i < n (dynamic shared memory
// as pack_rows).
extern "C" __global__ void __launch_bounds__(PACK_ROWS)
    gather_unpack(u32 n, const u8* rows, u32 row_bytes, const u32* perm, const PackColumn* cols, u32 num_cols) {
    extern __shared__ __align__(16) u8 tile[];
    const PackColumn* sc = pack_columns_to_smem(tile, row_bytes, cols, num_cols);
    constexpr u32 INFLIGHT = 4;
    const u32 per = row_bytes / 16;
    for (size_t first = (size_t)blockIdx.x * PACK_ROWS; first < n; first += (size_t)gridDim.x * PACK_ROWS) {
        const u32 count = (u32)min((size_t)PACK_ROWS, n - first);
        const u32 pieces = count * per;
        uint4* to = reinterpret_cast<uint4*>(tile);
        for (u32 q0 = threadIdx.x; q0 < pieces; q0 += INFLIGHT * PACK_ROWS) {
            uint4 v[INFLIGHT];
#pragma unroll
            for (u32 j = 0; j < INFLIGHT; j++) {
                const u32 q = q0 + j * PACK_ROWS;
                if (q < pieces) {
                    const u32 r = q / per, p = q - r * per;
                    v[j] = __ldg(reinterpret_cast<const uint4*>(rows + (size_t)__ldg(perm + first + r) * row_bytes) + p);
                }
            }
#pragma unroll
            for (u32 j = 0; j < INFLIGHT; j++) {
                const u32 q = q0 + j * PACK_ROWS;
                if (q < pieces) to[q] = v[j];
            }
        }
        __syncthreads();
        if (threadIdx.x < count) {
            const u8* row = tile + threadIdx.x * row_bytes;
            for (u32 k = 0; k < num_cols; k++) {
                const PackColumn c = sc[k];
                const size_t i = first + threadIdx.x;
                switch (c.width) {
                    case 1: __stcs(reinterpret_cast<u8*>(c.ptr) + i, row[c.offset]); break;
                    case 2: __stcs(reinterpret_cast<u16*>(c.ptr) + i, *reinterpret_cast<const u16*>(row + c.offset)); break;
                    case 4: __stcs(reinterpret_cast<u32*>(c.ptr) + i, *reinterpret_cast<const u32*>(row + c.offset)); break;
                    case 8: __stcs(reinterpret_cast<u64*>(c.ptr) + i, *reinterpret_cast<const u64*>(row + c.offset)); break;
                    default:
                        __stcs(reinterpret_cast<uint4*>(c.ptr) + i, *reinterpret_cast<const uint4*>(row + c.offset));
                        break;
                }
            }
        }
        __syncthreads();
    }
}

__device__ __forceinline__ u32 bit_at(const u8* bits, u64 i) { return (bits[i >> 3] >> (i & 7)) & 1u; }

// out bit i = bit (offset + perm[i]) of `bits`; `out` holds ceil(n / 32) words. Launched with a
// multiple of 32 threads so whole warps vote.
extern "C" __global__ void gather_bits(u32 n, const u8* bits, u32 offset, const u32* perm, u32* out) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < ((size_t)n + 31) / 32 * 32; i += stride) {
        const u32 b = i < n ? bit_at(bits, (u64)offset + perm[i]) : 0u;
        const u32 word = __ballot_sync(FULL_MASK, b);
        if ((threadIdx.x & 31) == 0) out[i / 32] = word;
    }
}

// A validity bitmap to pack: its bytes and the bit offset of row 0.
struct Bitmap {
    const u8* bits;
    u32 offset;
    u32 pad;
};

// words[i] bit j = validity of row i in bitmaps[j] (j < count <= 32).
extern "C" __global__ void pack_validity(u32 n, const Bitmap* bitmaps, u32 count, u32* words) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        u32 w = 0;
        for (u32 j = 0; j < count; j++) w |= bit_at(bitmaps[j].bits, (u64)bitmaps[j].offset + i) << j;
        words[i] = w;
    }
}

// out (a bitmap of ceil(n / 32) words) bit i = bit `bit` of words[i].
extern "C" __global__ void unpack_validity(u32 n, const u32* words, u32 bit, u32* out) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < ((size_t)n + 31) / 32 * 32; i += stride) {
        const u32 b = i < n ? (words[i] >> bit) & 1u : 0u;
        const u32 word = __ballot_sync(FULL_MASK, b);
        if ((threadIdx.x & 31) == 0) out[i / 32] = word;
    }
}

extern "C" __global__ void iota(u32 n, u32* out) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        out[i] = (u32)i;
    }
}

// copy_ranges: ranges[3 r], ranges[3 r + 1], ranges[3 r + 2] are the source, destination and
// byte count of copy r; blockIdx.y picks copies, the x blocks share each one. 16-byte moves
// where both ends are 16-byte aligned, bytes for the rest.
extern "C" __global__ void copy_ranges(const u64* __restrict__ ranges, u32 count) {
    const size_t tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (u32 r = blockIdx.y; r < count; r += gridDim.y) {
        const u8* src = (const u8*)ranges[3 * r];
        u8* dst = (u8*)ranges[3 * r + 1];
        const size_t bytes = ranges[3 * r + 2];
        const size_t vectors = (((size_t)src | (size_t)dst) & 15) == 0 ? bytes / 16 : 0;
        const uint4* s4 = (const uint4*)src;
        uint4* d4 = (uint4*)dst;
        for (size_t i = tid; i < vectors; i += stride) {
            d4[i] = s4[i];
        }
        for (size_t i = vectors * 16 + tid; i < bytes; i += stride) {
            dst[i] = src[i];
        }
    }
}

// Arrow's view: length, 4-byte prefix, then (values over 12 bytes) the data buffer's index and
// the value's offset in it; as a uint4, x y z w. A row not valid (`valid` bit clear) counts as
// an empty value: its view may name any buffer.
__device__ __forceinline__ bool view_is_long(const uint4& v, const u32* valid, size_t i) {
    return v.x > 12 && (valid == nullptr || (valid[i >> 5] >> (i & 31) & 1u));
}

// A block of output rows is scanned in tiles of at most `tile_rows` rows, a thread block a
// tile (a block of a million rows scanned by one thread block took ~4 ms a column): tile t is
// the (t % tiles_per_block)-th tile of output block t / tiles_per_block, and ends at its block's
// end. Tiles of one block are in row order, so the block's bytes are its tiles' one after
// another.
__device__ __forceinline__ u32 view_tiles_per_block(u32 block_rows, u32 tile_rows) {
    return (block_rows + tile_rows - 1) / tile_rows;
}

__device__ __forceinline__ size_t view_tile_of(size_t row, u32 block_rows, u32 tile_rows) {
    const size_t b = row / block_rows;
    return b * view_tiles_per_block(block_rows, tile_rows) + (row - b * block_rows) / tile_rows;
}

// views_block_bytes: rows [0, rows) of `views` in blocks of `block_rows` rows, in tiles of
// `tile_rows` (see above), a thread block a tile (blockDim.x a multiple of 32): each long
// value's offset among its tile's out-of-line bytes (offsets[i]; 0 for the others) and each
// tile's out-of-line bytes in all (tile_bytes[t]). The host lays the tiles out one after
// another from these.
extern "C" __global__ void views_block_bytes(const uint4* __restrict__ views, const u32* __restrict__ valid, u32 rows,
                                             u32 block_rows, u32 tile_rows, u32* __restrict__ offsets,
                                             u64* __restrict__ tile_bytes) {
    __shared__ u64 warp_sums[32];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const u32 per_block = view_tiles_per_block(block_rows, tile_rows);
    const size_t block_first = (size_t)(blockIdx.x / per_block) * block_rows;
    const size_t first = block_first + (size_t)(blockIdx.x % per_block) * tile_rows;
    const size_t end = min(min((size_t)rows, block_first + block_rows), first + tile_rows);
    u64 running = 0;
    for (size_t base = first; base < end; base += blockDim.x) {
        const size_t i = base + threadIdx.x;
        u64 len = 0;
        if (i < end) {
            const uint4 v = views[i];
            len = view_is_long(v, valid, i) ? v.x : 0;
        }
        u64 x = len;
#pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            const u64 y = __shfl_up_sync(0xffffffffu, x, d);
            if (lane >= d) x += y;
        }
        if (lane == 31) warp_sums[warp] = x;
        __syncthreads();
        if (warp == 0) {
            u64 w = lane < warps ? warp_sums[lane] : 0;
#pragma unroll
            for (u32 d = 1; d < 32; d <<= 1) {
                const u64 y = __shfl_up_sync(0xffffffffu, w, d);
                if (lane >= d) w += y;
            }
            if (lane < warps) warp_sums[lane] = w;
        }
        __syncthreads();
        const u64 before = (warp ? warp_sums[warp - 1] : 0) + x - len;
        // A block over 4 GiB is refused by the host (a view's offset is 32 bits).
        if (i < end) offsets[i] = (u32)(running + before);
        running += warp_sums[warps - 1];
        __syncthreads();
    }
    if (threadIdx.x == 0) tile_bytes[blockIdx.x] = running;
}

// views_compact: the views of rows [0, rows) rewritten for their block's own buffer (index 0,
// offset tile_in_block[tile] + offsets[i]; short and invalid values as they are, invalid long
// ones emptied) into out_views, and each long value's bytes copied from buffers[index] + offset
// to out_bytes + tile_base[tile] + offsets[i] (tiles as views_block_bytes cuts them;
// tile_in_block: where a tile's bytes start in its block's, tile_base: in out_bytes). A warp
// takes 32 rows and copies their values one after another, 32 lanes a value.
extern "C" __global__ void views_compact(const uint4* __restrict__ views, const u32* __restrict__ valid, u32 rows,
                                         u32 block_rows, u32 tile_rows, const u32* __restrict__ offsets,
                                         const u64* __restrict__ tile_base, const u32* __restrict__ tile_in_block,
                                         const u64* __restrict__ buffers, uint4* __restrict__ out_views,
                                         u8* __restrict__ out_bytes) {
    const u32 lane = threadIdx.x & 31;
    const size_t warp = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const size_t warps = ((size_t)gridDim.x * blockDim.x) >> 5;
    for (size_t base = warp * 32; base < rows; base += warps * 32) {
        const size_t mine = base + lane;
        uint4 v = make_uint4(0, 0, 0, 0);
        u32 to = 0;
        bool long_value = false;
        if (mine < rows) {
            v = views[mine];
            long_value = view_is_long(v, valid, mine);
            uint4 out = v;
            if (long_value) {
                const size_t tile = view_tile_of(mine, block_rows, tile_rows);
                to = offsets[mine];
                out.z = 0;
                out.w = tile_in_block[tile] + to;
            } else if (v.x > 12) {
                out = make_uint4(0, 0, 0, 0);
            }
            out_views[mine] = out;
        }
        const unsigned longs = __ballot_sync(0xffffffffu, long_value);
        for (unsigned left = longs; left; left &= left - 1) {
            const u32 r = __ffs(left) - 1;
            const u32 len = __shfl_sync(0xffffffffu, v.x, r);
            const u32 buffer = __shfl_sync(0xffffffffu, v.z, r);
            const u32 offset = __shfl_sync(0xffffffffu, v.w, r);
            const u32 at = __shfl_sync(0xffffffffu, to, r);
            const size_t row = base + r;
            const u8* src = reinterpret_cast<const u8*>(buffers[buffer]) + offset;
            u8* dst = out_bytes + tile_base[view_tile_of(row, block_rows, tile_rows)] + at;
            for (u32 k = lane; k < len; k += 32) dst[k] = src[k];
        }
    }
}
