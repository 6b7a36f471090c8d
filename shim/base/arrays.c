/* arrays.c - layer 1: the device bytes of CUDA arrays (see arrays.h). */
#include "arrays.h"

#include <cuda.h>

bool gg_array_bytes(uint64_t w, uint64_t h, uint64_t d, uint64_t elem, unsigned flags,
                    unsigned levels, uint64_t *out)
{
    bool layered = (flags & (GG_ARRAY_LAYERED | GG_ARRAY_CUBEMAP)) != 0;
    if (w == 0 || levels == 0 || elem == 0)
        return false;
    if (h == 0 && d != 0 && !(flags & GG_ARRAY_LAYERED))
        return false; /* a depth needs a height, unless it counts layers */
    if ((flags & GG_ARRAY_CUBEMAP) &&
        (w != h || d == 0 || ((flags & GG_ARRAY_LAYERED) ? d % 6 != 0 : d != 6)))
        return false;
    /* No more levels than halvings of the largest extent that is halved. */
    uint64_t big = w > h ? w : h;
    if (!layered && d > big)
        big = d;
    unsigned most = 1;
    while (big >>= 1)
        most++;
    if (levels > most)
        return false;
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t lw = w >> l, lh = h == 0 ? 1 : h >> l, ld = d == 0 ? 1 : layered ? d : d >> l, b;
        lw = lw ? lw : 1;
        lh = lh ? lh : 1;
        ld = ld ? ld : 1;
        if (__builtin_mul_overflow(lw, lh, &b) || __builtin_mul_overflow(b, ld, &b) ||
            __builtin_mul_overflow(b, elem, &b) || __builtin_add_overflow(total, b, &total))
            return false;
    }
    if (total > UINT64_MAX - 511)
        return false;
    *out = flags & (GG_ARRAY_SPARSE | GG_ARRAY_DEFERRED) ? 0 : (total + 511) & ~(uint64_t)511;
    return true;
}

uint64_t gg_array_format_bytes(int format, unsigned ch)
{
    unsigned size, fixed = 0;
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: size = 1; break;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: size = 2; break;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: size = 4; break;
    /* The normalized formats say their channel count in their name. */
    case CU_AD_FORMAT_UNORM_INT8X1: case CU_AD_FORMAT_SNORM_INT8X1: size = 1, fixed = 1; break;
    case CU_AD_FORMAT_UNORM_INT8X2: case CU_AD_FORMAT_SNORM_INT8X2: size = 1, fixed = 2; break;
    case CU_AD_FORMAT_UNORM_INT8X4: case CU_AD_FORMAT_SNORM_INT8X4: size = 1, fixed = 4; break;
    case CU_AD_FORMAT_UNORM_INT16X1: case CU_AD_FORMAT_SNORM_INT16X1: size = 2, fixed = 1; break;
    case CU_AD_FORMAT_UNORM_INT16X2: case CU_AD_FORMAT_SNORM_INT16X2: size = 2, fixed = 2; break;
    case CU_AD_FORMAT_UNORM_INT16X4: case CU_AD_FORMAT_SNORM_INT16X4: size = 2, fixed = 4; break;
    default: return 0; /* block-compressed, YUV: sized by rules of their own */
    }
    if ((ch != 1 && ch != 2 && ch != 4) || (fixed && ch != fixed))
        return 0;
    return (uint64_t)size * ch;
}

uint64_t gg_array_channel_bytes(int x, int y, int z, int w)
{
    unsigned n = !y ? 1 : !z ? 2 : 4;
    if ((x != 8 && x != 16 && x != 32) || (n == 1 && (z || w)) || (n == 2 && w) ||
        (n == 4 && !w) || (n >= 2 && y != x) || (n == 4 && (z != x || w != x)))
        return 0;
    return (uint64_t)n * (unsigned)x / 8;
}
