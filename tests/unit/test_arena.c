/* test_arena.c - process-lifetime memory and interned strings (arena.c). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "arena.h"
#include "unit.h"

static void test_alloc(void)
{
    struct gg_arena a = GG_ARENA_INIT(2);
    char *p = gg_arena_alloc(&a, 10, 1), *q = gg_arena_alloc(&a, 8, 8);
    CHECK(p && q);
    CHECK(((uintptr_t)q & 7) == 0);
    CHECK(q >= p + 10);
    CHECK(gg_arena_alloc(&a, 0, 1) == NULL);
    CHECK(gg_arena_alloc(&a, GG_ARENA_CHUNK + 1, 1) == NULL);
    /* two chunks at most: the third request that does not fit fails */
    CHECK(gg_arena_alloc(&a, GG_ARENA_CHUNK - 8, 1) != NULL);
    CHECK(gg_arena_alloc(&a, GG_ARENA_CHUNK - 8, 1) == NULL);
    CHECK_EQ_U64(gg_arena_footprint(&a), 2 * GG_ARENA_CHUNK);
    memset(p, 1, 10); /* it is writable */
}

static void test_intern(void)
{
    static struct gg_strings t = GG_STRINGS_INIT(4, 16, 32);
    const char *a = gg_strings_intern(&t, "libc.so.6"), *b = gg_strings_intern(&t, "libc.so.6");
    const char *c = gg_strings_intern(&t, "libcuda.so.1");
    CHECK(a && a == b);
    CHECK(c && c != a);
    CHECK_STR(c, "libcuda.so.1");
    char buf[4] = {'x', 'y', 'z', 0};
    const char *d = gg_strings_intern(&t, buf);
    buf[0] = 'q';
    CHECK_STR(d, "xyz"); /* a copy */
    /* cut at max_len - 1 */
    const char *e = gg_strings_intern(&t, "0123456789012345678901234567890123456789");
    CHECK_EQ_U64(strlen(e), 31);
    /* a full index still copies */
    for (int i = 0; i < 20; i++) {
        char s[8];
        snprintf(s, sizeof s, "s%d", i);
        CHECK_STR(gg_strings_intern(&t, s), s);
    }
}

int main(void)
{
    RUN(test_alloc);
    RUN(test_intern);
    return unit_done();
}
