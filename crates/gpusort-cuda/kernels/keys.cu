// keys.cu — the sort key of fixed-width columns, encoded on the device from the columns a sort
// has uploaded anyway (issue 3's "key encoding of fixed-width types done on the GPU").
//
// Bandyopadhyay & Sahni sort records by a key of 32-bit words (004, section III: the key is the
// field the LSD passes read digit by digit). gpusort's key is the concatenation, most significant
// first, of one field per sort column: [null flag][value bits], the value being the column's
// order-preserving unsigned image ("ordinal") minus the column's minimum (ascending) or the
// maximum minus it (descending), in as many bits as that range needs. The host builds the
// layout (`gpusort::keys`); these kernels do the two passes over the rows it needs:
//
// * key_bounds: the minimum and maximum ordinal of a column's valid rows and their count, so
//   the host can size each field;
// * encode_keys: every key word of every row from the columns, and per word the OR and the AND
//   over all rows (the bits that vary: the radix passes to plan).
//
// A string or binary view column (issue 23's "string keys on the device") is a field too: the
// bytes after the column's common prefix, `prefix` of them zero-padded (inverted when
// descending), then the length capped at prefix + 1 (gpusort::keys::field::BytesField). Its
// statistics (common prefix, lengths) come from the host, which holds the views anyway; the
// values' bytes are read through the views: inline up to 12 bytes, else in the data buffer the
// view names (a table of the buffers' device addresses).
//
// Each thread walks rows with a grid stride and folds what it saw; warps then combine with
// shuffles and one lane per warp updates the totals with atomics.

// From the host: how raw bits map to their ordinal (KIND_UNSIGNED, KIND_SIGNED, KIND_FLOAT:
// gpusort::keys::OrdinalKind) and the most key words encode_keys writes (KEY_MAX_WORDS; the host
// encodes longer keys itself).
#if !defined(KIND_UNSIGNED) || !defined(KIND_SIGNED) || !defined(KIND_FLOAT) || !defined(KIND_VIEW) || !defined(KEY_MAX_WORDS)
#error "defined by the host before the sources (kernels.rs SHARED_CONSTANTS, KernelTuning::defines)"
#endif

__device__ __forceinline__ u64 load_raw(const u8* values, u32 width, size_t i) {
    switch (width) {
    case 1: return values[i];
    case 2: return reinterpret_cast<const u16*>(values)[i];
    case 4: return reinterpret_cast<const u32*>(values)[i];
    default: return reinterpret_cast<const u64*>(values)[i];
    }
}

// The ordinal of row i: unsigned as is, signed with the sign bit flipped, floats in IEEE
// totalOrder (negative values: every bit flipped; others: the sign bit).
__device__ __forceinline__ u64 ordinal_at(const u8* values, u32 width, u32 kind, size_t i) {
    const u64 raw = load_raw(values, width, i);
    const u32 bits = width * 8;
    const u64 sign = 1ull << (bits - 1);
    if (kind == KIND_SIGNED) return raw ^ sign;
    if (kind == KIND_FLOAT) {
        const u64 all = bits == 64 ? ~0ull : ((1ull << bits) - 1);
        return raw ^ ((raw & sign) ? all : sign);
    }
    return raw;
}

__device__ __forceinline__ bool valid_at(const u8* valid, size_t i) {
    return valid == nullptr || ((valid[i >> 3] >> (i & 7)) & 1u);
}

// out[0] = min, out[1] = max ordinal over the valid rows, out[2] += their count. The host sets
// out to {~0, 0, 0} first; with no valid row min > max stays.
extern "C" __global__ void key_bounds(u32 n, const u8* values, const u8* valid, u32 width, u32 kind, u64* out) {
    u64 lo = ~0ull, hi = 0, count = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (!valid_at(valid, i)) continue;
        const u64 v = ordinal_at(values, width, kind, i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        count++;
    }
    for (int d = 16; d > 0; d /= 2) {
        const u64 l = __shfl_xor_sync(FULL_MASK, lo, d);
        const u64 h = __shfl_xor_sync(FULL_MASK, hi, d);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
        count += __shfl_xor_sync(FULL_MASK, count, d);
    }
    if ((threadIdx.x & 31) == 0 && count > 0) {
        atomicMin(&out[0], lo);
        atomicMax(&out[1], hi);
        atomicAdd(&out[2], count);
    }
}

// One key field, as the host laid it out (gpusort::keys::KeyField). 64 bytes.
struct KeyFieldDesc {
    const u8* values;  // the column: `width` bytes per row (views: 16)
    const u8* valid;   // its validity bits (row 0 at bit 0), or null
    u64 min, max;      // ordinal range of the valid rows; views: the buffer table, and
                       // the common prefix (low 32 bits) and prefix bytes (high 32 bits)
    u32 width, kind;
    u32 pos;         // first bit, counted from the most significant bit of word 0 (padding included)
    u32 null_bits;   // 1 when a null flag precedes the value bits
    u32 value_bits;  // 0..64; views: 8 * prefix bytes + length bits
    u32 valid_flag;  // the flag of valid rows (null rows get the other value)
    u32 descending;
    u32 len_base;    // views: the capped length's maximum (descending) or minimum
};

// Byte j of the value of the view at `view` (j < its length).
__device__ __forceinline__ u8 view_byte(const u8* view, const u8* const* buffers, u32 len, u32 j) {
    if (len <= 12) return view[4 + j];
    const u32 buffer = *reinterpret_cast<const u32*>(view + 8);
    const u32 offset = *reinterpret_cast<const u32*>(view + 12);
    return buffers[buffer][offset + j];
}

// Bits [from, from + take) of row i's view field (take <= 32; the field's null flag included),
// as the low `take` bits. `ok`: the row is valid.
__device__ u32 view_field_bits(const KeyFieldDesc& d, size_t i, bool ok, u32 from, u32 take) {
    const u32 lcp = (u32)d.max, prefix = (u32)(d.max >> 32);
    const u32 pbits = 8 * prefix, lbits = d.value_bits - pbits;
    const u32 to = from + take;
    u64 out = 0;
    // The null flag: field bit 0.
    if (d.null_bits && from == 0) {
        const u32 flag = ok ? d.valid_flag : 1u - d.valid_flag;
        out |= (u64)flag << (take - 1);
    }
    if (!ok) return (u32)out;  // a null row's value bits are zero
    const u8* view = d.values + 16 * i;
    const u32 len = *reinterpret_cast<const u32*>(view);
    const u32 tail = len > lcp ? len - lcp : 0;
    const u8* const* buffers = reinterpret_cast<const u8* const*>(d.min);
    // The prefix bytes: field bits [nb, nb + pbits).
    const u32 nb = d.null_bits;
    const u32 a = from > nb ? from : nb, b = to < nb + pbits ? to : nb + pbits;
    if (a < b) {
        const u32 first = (a - nb) / 8, last = (b - nb - 1) / 8;  // at most 5 bytes
        const u8 invert = d.descending ? 0xFF : 0;
        u64 v = 0;
        for (u32 j = first; j <= last; j++) {
            const u8 byte = j < tail ? view_byte(view, buffers, len, lcp + j) : 0;
            v = (v << 8) | (u8)(byte ^ invert);
        }
        const u32 below = nb + 8 * (last + 1) - b;  // bits of the last byte past b
        const u64 bits = (v >> below) & ((1ull << (b - a)) - 1);
        out |= bits << (to - b);
    }
    // The capped length: field bits [nb + pbits, nb + pbits + lbits).
    const u32 c = from > nb + pbits ? from : nb + pbits, e = to < nb + pbits + lbits ? to : nb + pbits + lbits;
    if (c < e) {
        const u32 capped = tail < prefix + 1 ? tail : prefix + 1;
        const u64 l = d.descending ? d.len_base - capped : capped - d.len_base;
        const u32 below = nb + pbits + lbits - e;
        out |= ((l >> below) & ((1ull << (e - c)) - 1)) << (to - e);
    }
    return (u32)out;
}

// words[w][i] for every row i and key word w < nwords; varying[2w] |= OR and varying[2w + 1] &= AND
// of word w over all rows (the host sets them to 0 and ~0 first).
extern "C" __global__ void encode_keys(
    u32 n, const KeyFieldDesc* fields, u32 nfields, u32* const* words, u32 nwords, u32* varying) {
    // Word by word, each over all of this thread's rows: the word's OR and AND stay in two
    // registers (arrays of them indexed by the word lived in local memory, two local accesses
    // a word and row) and its first field is found once. A field is read once a word it
    // overlaps, as when the rows were the outer loop.
    u32 f = 0;
    for (u32 w = 0; w < nwords; w++) {
        const u32 word_lo = 32 * w, word_hi = 32 * w + 32;
        // Fields lie in key order: skip those that end before this word; stop at one that
        // starts after it (the last overlapping field may go on into the next word).
        while (f < nfields && fields[f].pos + fields[f].null_bits + fields[f].value_bits <= word_lo) f++;
        u32 ors = 0, ands = ~0u;
        for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
            u32 acc = 0;
            for (u32 g = f; g < nfields && fields[g].pos < word_hi; g++) {
                const KeyFieldDesc& d = fields[g];
                const u32 bits = d.null_bits + d.value_bits;
                if (bits == 0) continue;
                const bool ok = valid_at(d.valid, i);
                if (d.kind == KIND_VIEW) {
                    const u32 s = d.pos > word_lo ? d.pos : word_lo;
                    const u32 e = d.pos + bits < word_hi ? d.pos + bits : word_hi;
                    acc |= view_field_bits(d, i, ok, s - d.pos, e - s) << (word_hi - e);
                    continue;
                }
                u64 v = 0;
                if (ok && d.value_bits > 0) {
                    const u64 o = ordinal_at(d.values, d.width, d.kind, i);
                    v = d.descending ? d.max - o : o - d.min;
                }
                const u64 flag = d.null_bits ? (ok ? d.valid_flag : 1u - d.valid_flag) : 0;
                // The field as a number of `bits` <= 65 bits: (hi, lo).
                const u64 lo = d.value_bits == 64 ? v : ((flag << d.value_bits) | v);
                const u64 hi = d.value_bits == 64 ? flag : 0;
                // Its bits that fall in this word: [s, e) in key positions.
                const u32 s = d.pos > word_lo ? d.pos : word_lo;
                const u32 e = d.pos + bits < word_hi ? d.pos + bits : word_hi;
                const u32 r = d.pos + bits - e;  // field bits below e
                const u64 shifted = r == 0 ? lo : r < 64 ? (lo >> r) | (hi << (64 - r)) : hi >> (r - 64);
                const u32 take = e - s;
                const u64 chunk = shifted & (take == 64 ? ~0ull : ((1ull << take) - 1));
                acc |= (u32)(chunk << (word_hi - e));
            }
            words[w][i] = acc;
            ors |= acc;
            ands &= acc;
        }
        for (int d = 16; d > 0; d /= 2) {
            ors |= __shfl_xor_sync(FULL_MASK, ors, d);
            ands &= __shfl_xor_sync(FULL_MASK, ands, d);
        }
        if ((threadIdx.x & 31) == 0) {
            atomicOr(&varying[2 * w], ors);
            atomicAnd(&varying[2 * w + 1], ands);
        }
    }
}
