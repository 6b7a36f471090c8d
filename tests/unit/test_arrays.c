/* test_arrays.c - the device bytes of CUDA arrays (arrays.c), against the
 * rule the test rig's driver charges (tests/fake/README.md, "Arrays"),
 * written out here independently: every level's extent times the element,
 * rounded up to 512 at the end. */
#include <cuda.h>

#include "arrays.h"
#include "unit.h"

/* The rule, the plain way. */
static uint64_t expect(uint64_t w, uint64_t h, uint64_t d, uint64_t elem, unsigned levels,
                       int layered)
{
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t lw = w >> l ? w >> l : 1;
        uint64_t lh = !h ? 1 : h >> l ? h >> l : 1;
        uint64_t ld = !d ? 1 : layered ? d : d >> l ? d >> l : 1;
        total += lw * lh * ld * elem;
    }
    return (total + 511) / 512 * 512;
}

static uint64_t bytes(uint64_t w, uint64_t h, uint64_t d, uint64_t elem, unsigned flags,
                      unsigned levels)
{
    uint64_t out = 12345;
    return gg_array_bytes(w, h, d, elem, flags, levels, &out) ? out : 0;
}

static void test_extents(void)
{
    CHECK_EQ_U64(bytes(1000, 0, 0, 1, 0, 1), 1024);                 /* 1-D, rounded */
    CHECK_EQ_U64(bytes(1000, 3, 0, 16, 0, 1), expect(1000, 3, 0, 16, 1, 0));
    CHECK_EQ_U64(bytes(100, 100, 10, 4, 0, 1), expect(100, 100, 10, 4, 1, 0));
    CHECK_EQ_U64(bytes(16, 0, 6, 1, GG_ARRAY_LAYERED, 1), expect(16, 0, 6, 1, 1, 1));
    CHECK_EQ_U64(bytes(16, 16, 6, 16, GG_ARRAY_CUBEMAP, 1), expect(16, 16, 6, 16, 1, 1));
    CHECK_EQ_U64(bytes(16, 16, 12, 4, GG_ARRAY_CUBEMAP | GG_ARRAY_LAYERED, 1),
                 expect(16, 16, 12, 4, 1, 1));
    /* mip levels halve, at least 1; a layered array keeps its layers */
    CHECK_EQ_U64(bytes(1024, 1024, 0, 4, 0, 11), 5592576);
    CHECK_EQ_U64(bytes(64, 32, 16, 4, 0, 7), expect(64, 32, 16, 4, 7, 0));
    CHECK_EQ_U64(bytes(64, 32, 16, 4, GG_ARRAY_LAYERED, 6), expect(64, 32, 16, 4, 6, 1));
    CHECK_EQ_U64(bytes(8, 4, 2, 1, 0, 4), expect(8, 4, 2, 1, 4, 0));
    /* sparse and deferred arrays hold nothing of their own */
    CHECK_EQ_U64(bytes(1000, 1000, 0, 4, GG_ARRAY_SPARSE, 1), 0);
    uint64_t out = 1;
    CHECK(gg_array_bytes(1000, 1000, 0, 4, GG_ARRAY_DEFERRED, 1, &out) && out == 0);
}

static void test_what_the_driver_rejects(void)
{
    uint64_t out, big = 1ull << 32;
    CHECK(!gg_array_bytes(0, 1, 0, 1, 0, 1, &out));                  /* no width */
    CHECK(!gg_array_bytes(16, 0, 6, 1, 0, 1, &out));                 /* depth, no height */
    CHECK(!gg_array_bytes(16, 16, 5, 1, GG_ARRAY_CUBEMAP, 1, &out)); /* 5 faces */
    CHECK(!gg_array_bytes(16, 8, 6, 1, GG_ARRAY_CUBEMAP, 1, &out));  /* not square */
    CHECK(!gg_array_bytes(16, 16, 8, 1, GG_ARRAY_CUBEMAP | GG_ARRAY_LAYERED, 1, &out));
    CHECK(!gg_array_bytes(1024, 1024, 0, 1, 0, 12, &out));           /* 11 levels at most */
    CHECK(gg_array_bytes(1024, 1024, 0, 1, 0, 11, &out));
    CHECK(!gg_array_bytes(1, 1, 0, 1, 0, 0, &out));                  /* no level */
    CHECK(!gg_array_bytes(1, 1, 0, 0, 0, 1, &out));                  /* no element size */
    /* every overflow: of the product, of the sum, of the rounding */
    CHECK(!gg_array_bytes(big, big, big, 16, 0, 1, &out));
    CHECK(!gg_array_bytes(big, big, 1, 16, 0, 1, &out));
    CHECK(!gg_array_bytes(UINT64_MAX, 0, 0, 1, 0, 1, &out));
    CHECK(!gg_array_bytes(UINT64_MAX / 2 + 1, 0, 0, 2, 0, 1, &out));
    CHECK(gg_array_bytes(1ull << 30, 1ull << 28, 0, 16, 0, 1, &out) && out == 1ull << 62);
}

static void test_formats(void)
{
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_UNSIGNED_INT8, 1), 1);
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_SIGNED_INT16, 2), 4);
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_HALF, 4), 8);
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_FLOAT, 4), 16);
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_FLOAT, 3), 0);         /* 1, 2 or 4 */
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_UNORM_INT8X4, 4), 4);
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_UNORM_INT8X4, 1), 0);  /* says its own */
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_SNORM_INT16X2, 2), 4);
    CHECK_EQ_U64(gg_array_format_bytes(CU_AD_FORMAT_BC1_UNORM, 4), 0);     /* not sized here */
    /* runtime channel descriptors: 1, 2 or 4 channels of one size */
    CHECK_EQ_U64(gg_array_channel_bytes(8, 0, 0, 0), 1);
    CHECK_EQ_U64(gg_array_channel_bytes(16, 16, 0, 0), 4);
    CHECK_EQ_U64(gg_array_channel_bytes(32, 32, 32, 32), 16);
    CHECK_EQ_U64(gg_array_channel_bytes(8, 8, 8, 0), 0);    /* three channels */
    CHECK_EQ_U64(gg_array_channel_bytes(8, 16, 0, 0), 0);   /* mixed sizes */
    CHECK_EQ_U64(gg_array_channel_bytes(12, 0, 0, 0), 0);
    CHECK_EQ_U64(gg_array_channel_bytes(0, 0, 0, 0), 0);
    CHECK_EQ_U64(gg_array_channel_bytes(-8, 0, 0, 0), 0);
}

int main(void)
{
    RUN(test_extents);
    RUN(test_what_the_driver_rejects);
    RUN(test_formats);
    return unit_done();
}
