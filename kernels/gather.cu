// gather.cu — the record moves of the indirect strategy (Bandyopadhyay & Sahni, section III:
// after (key, index) pairs are sorted, "the original records are rearranged by copying
// records ... placing the records into their sorted positions"), and the bit plumbing of
// Arrow's validity bitmaps around the radix passes.
//
//   * gather_w*: out[i] = column[perm[i]] for ByField columns of 1, 2, 4, 8 or 16 bytes;
//   * gather_records: the same for row-major records (Hybrid), a group of threads per record
//     moving 16-, 8- or 4-byte pieces (paper Fig. 6);
//   * gather_bits: a validity bitmap through the permutation, 32 rows per warp ballot;
//   * pack_validity / unpack_validity: up to 32 bitmaps as one u32 lane that moves with the
//     records in every pass (direct strategy), and back.

template <typename T>
__device__ __forceinline__ void gather_impl(u32 n, const T* src, const u32* perm, T* dst) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        dst[i] = src[perm[i]];
    }
}

extern "C" __global__ void gather_w1(u32 n, const u8* src, const u32* perm, u8* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w2(u32 n, const u16* src, const u32* perm, u16* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w4(u32 n, const u32* src, const u32* perm, u32* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w8(u32 n, const u64* src, const u32* perm, u64* dst) { gather_impl(n, src, perm, dst); }
extern "C" __global__ void gather_w16(u32 n, const uint4* src, const u32* perm, uint4* dst) {
    gather_impl(n, src, perm, dst);
}

extern "C" __global__ void gather_records(u32 n, const u8* src, const u32* perm, u8* dst, u32 bytes, u32 piece) {
    const u32 per = bytes / piece;
    const size_t total = (size_t)n * per;
    for (size_t q = (size_t)blockIdx.x * blockDim.x + threadIdx.x; q < total; q += (size_t)gridDim.x * blockDim.x) {
        const size_t i = q / per, p = q - i * per;
        const size_t from = (size_t)perm[i] * bytes + p * piece;
        const size_t to = i * bytes + p * piece;
        if (piece == 16) {
            *reinterpret_cast<uint4*>(dst + to) = *reinterpret_cast<const uint4*>(src + from);
        } else if (piece == 8) {
            *reinterpret_cast<u64*>(dst + to) = *reinterpret_cast<const u64*>(src + from);
        } else {
            *reinterpret_cast<u32*>(dst + to) = *reinterpret_cast<const u32*>(src + from);
        }
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
