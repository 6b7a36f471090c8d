/* test_sites.c - the site table (sites.c): one site per stack and device,
 * Python frames kept beside native ones, live accounting, the largest
 * sites, a full table. */
#include <stdint.h>
#include <string.h>

#include "sites.h"
#include "unit.h"

static void test_none_and_junk(void)
{
    const uintptr_t *ips = (const uintptr_t *)1;
    CHECK_EQ_U64(gg_sites_native(GG_SITE_NONE, &ips), 0);
    CHECK(ips == NULL);
    CHECK_EQ_U64(gg_sites_native(0xfffffff0u, &ips), 0);
    CHECK_EQ_U64(gg_sites_python(0xfffffff0u, &ips), 0);
    gg_sites_charge(GG_SITE_NONE, 100, 1);
    gg_sites_charge(0xfffffff0u, 100, 1);
    CHECK(gg_sites_device(GG_SITE_NONE) == -1);
    CHECK_EQ_U64(gg_sites_intern(0, NULL, 0, NULL, 0), GG_SITE_NONE);
}

/* The same native frames with different Python frames are different sites;
 * the Python pairs come back as they went in. */
static void test_python_frames(void)
{
    uintptr_t native[2] = {0x1111, 0x2222};
    uintptr_t py1[4] = {0xc0de0, 12, 0xc0de8, 40}, py2[4] = {0xc0de0, 14, 0xc0de8, 40};
    gg_site a = gg_sites_intern(0, native, 2, py1, 2);
    gg_site b = gg_sites_intern(0, native, 2, py2, 2);
    gg_site c = gg_sites_intern(0, native, 2, NULL, 0);
    gg_site d = gg_sites_intern(0, NULL, 0, py1, 2);
    CHECK(a && b && c && d);
    CHECK(a != b && a != c && b != c && d != a);
    CHECK_EQ_U64(gg_sites_intern(0, native, 2, py1, 2), a);
    const uintptr_t *w;
    CHECK_EQ_U64(gg_sites_python(a, &w), 2);
    CHECK(memcmp(w, py1, sizeof py1) == 0);
    CHECK_EQ_U64(gg_sites_native(a, &w), 2);
    CHECK(memcmp(w, native, sizeof native) == 0);
    CHECK_EQ_U64(gg_sites_native(d, &w), 0);
    CHECK_EQ_U64(gg_sites_python(d, &w), 2);
}

static void test_charge_top(void)
{
    uintptr_t f[3] = { 0x1000, 0x2000, 0x3000 };
    gg_site a = gg_sites_intern(7, f, 1, NULL, 0), b = gg_sites_intern(7, f, 2, NULL, 0),
            c = gg_sites_intern(7, f, 3, NULL, 0), d = gg_sites_intern(8, f, 3, NULL, 0);
    CHECK(a && b && c && d);
    CHECK(a != b && b != c && c != d);
    CHECK_EQ_U64(gg_sites_intern(7, f, 2, NULL, 0), b);
    CHECK(gg_sites_device(d) == 8);

    struct gg_site_usage top[8];
    CHECK_EQ_U64(gg_sites_top(7, top, 8), 0);

    gg_sites_charge(a, 100, 1);
    gg_sites_charge(b, 300, 2);
    gg_sites_charge(c, 200, 1);
    gg_sites_charge(d, 1000, 5);
    gg_sites_charge(c, 50, 1);
    gg_sites_charge(c, -50, -1);

    size_t n = gg_sites_top(7, top, 8);
    CHECK_EQ_U64(n, 3);
    CHECK_EQ_U64(top[0].site, b);
    CHECK_EQ_U64(top[0].bytes, 300);
    CHECK_EQ_U64(top[0].allocs, 2);
    CHECK_EQ_U64(top[1].site, c);
    CHECK_EQ_U64(top[1].bytes, 200);
    CHECK_EQ_U64(top[2].site, a);
    CHECK_EQ_U64(top[2].bytes, 100);

    n = gg_sites_top(7, top, 2);   /* only the two largest */
    CHECK_EQ_U64(n, 2);
    CHECK_EQ_U64(top[0].site, b);
    CHECK_EQ_U64(top[1].site, c);

    n = gg_sites_top(8, top, 8);   /* the other device */
    CHECK_EQ_U64(n, 1);
    CHECK_EQ_U64(top[0].site, d);
    CHECK_EQ_U64(top[0].bytes, 1000);
    CHECK_EQ_U64(top[0].allocs, 5);
    CHECK_EQ_U64(gg_sites_top(9, top, 8), 0);
    CHECK_EQ_U64(gg_sites_top(8, top, 0), 0);

    /* Released memory leaves the list; ties keep the older site first. */
    gg_sites_charge(b, -300, -2);
    gg_sites_charge(a, 100, 0);
    n = gg_sites_top(7, top, 8);
    CHECK_EQ_U64(n, 2);
    CHECK_EQ_U64(top[0].site, a);
    CHECK_EQ_U64(top[1].site, c);

    /* Many sites, few asked for: still the largest, in order. */
    uintptr_t g[2] = { 0x5000, 0 };
    for (uintptr_t i = 1; i <= 200; i++) {
        g[1] = i;
        gg_site s = gg_sites_intern(11, g, 2, NULL, 0);
        gg_sites_charge(s, (int64_t)((i * 37) % 200 + 1), 1);   /* 1..200, each once */
    }
    n = gg_sites_top(11, top, 5);
    CHECK_EQ_U64(n, 5);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ_U64(top[i].bytes, 200 - i);

    gg_sites_charge(a, -200, -1);
    gg_sites_charge(c, -200, -1);
    gg_sites_charge(d, -1000, -5);
}

static void test_full_table(void)
{
    size_t have = gg_sites_count();
    gg_sites_test_limit(have + 2);
    uintptr_t f[2] = { 0x777000, 0 };
    f[1] = 1;
    gg_site s1 = gg_sites_intern(0, f, 2, NULL, 0);
    f[1] = 2;
    gg_site s2 = gg_sites_intern(0, f, 2, NULL, 0);
    f[1] = 3;
    gg_site s3 = gg_sites_intern(0, f, 2, NULL, 0);
    CHECK(s1 != GG_SITE_NONE && s2 != GG_SITE_NONE);
    CHECK_EQ_U64(s3, GG_SITE_NONE);
    CHECK_EQ_U64(gg_sites_count(), have + 2);
    /* A new stack gets no site; known ones still do. */
    f[1] = 1;
    CHECK_EQ_U64(gg_sites_intern(0, f, 2, NULL, 0), s1);
    gg_sites_charge(GG_SITE_NONE, 5, 1);
    gg_sites_test_limit(0);
    f[1] = 3;
    CHECK(gg_sites_intern(0, f, 2, NULL, 0) != GG_SITE_NONE);
    CHECK_EQ_U64(gg_sites_count(), have + 3);
}

int main(void)
{
    RUN(test_none_and_junk);
    RUN(test_python_frames);
    RUN(test_charge_top);
    RUN(test_full_table);
    return unit_done();
}
