/* test_maps.c - VMM mappings, address -> (handle, size) (maps.c). */
#include "maps.h"
#include "unit.h"

static void test_add_take(void)
{
    gg_maps_reset();
    struct gg_mapping m = {0x7f0000000000, 2 << 20, 0x111}, out, old;
    bool had;
    CHECK(gg_maps_add(&m, &old, &had) && !had);
    CHECK_EQ_U64(gg_maps_count(), 1);
    CHECK(!gg_maps_take(0x7f0000001000, &out)); /* not where one starts */
    CHECK(gg_maps_take(0x7f0000000000, &out));
    CHECK_EQ_U64(out.key, 0x111);
    CHECK_EQ_U64(out.size, 2 << 20);
    CHECK(!gg_maps_take(0x7f0000000000, &out));
    struct gg_mapping zero = {0, 1, 1};
    CHECK(!gg_maps_add(&zero, &old, &had));
}

static void test_replace_and_grow(void)
{
    gg_maps_reset();
    struct gg_mapping m = {0x1000, 4096, 1}, n = {0x1000, 8192, 2}, out;
    bool had;
    gg_maps_add(&m, &out, &had);
    CHECK(gg_maps_add(&n, &out, &had) && had);
    CHECK_EQ_U64(out.key, 1);
    for (uintptr_t i = 1; i <= 5000; i++) {
        struct gg_mapping k = {0x100000000 + i * 4096, 4096, i};
        CHECK(gg_maps_add(&k, &out, &had) && !had);
    }
    CHECK_EQ_U64(gg_maps_count(), 5001);
    for (uintptr_t i = 1; i <= 5000; i += 2)
        CHECK(gg_maps_take(0x100000000 + i * 4096, &out) && out.key == i);
    for (uintptr_t i = 2; i <= 5000; i += 2)
        CHECK(gg_maps_take(0x100000000 + i * 4096, &out) && out.key == i);
    CHECK_EQ_U64(gg_maps_count(), 1);
}

int main(void)
{
    RUN(test_add_take);
    RUN(test_replace_and_grow);
    return unit_done();
}
