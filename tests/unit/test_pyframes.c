/* Unit tests for pyframes.c: line tables and strings decoded from hand-built
 * bytes (expectations checked against co_lines() of code objects carrying
 * the same tables), a process without Python, and the guards, against fake
 * interpreters (tests/pyframes/fakepy.c) whose layouts and frame chains are
 * wrong on purpose, each in a child process (the layout is checked once per
 * process). Real interpreters: tests/e2e/test_pyframes.py. */
#include "pyframes.h"
#include "unit.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- 3.11+ location table ----------------------------------------------- */

/* firstlineno 10. co_lines(): (0,2,12) (2,6,12) (6,8,13) (8,14,10)
 * (14,16,None) (16,32,110) (32,34,112) */
static const uint8_t LT311[] = {
    0xE8, 0x04,                   /* 13 no columns, 1 unit, +2 */
    0x81, 0x05,                   /* 0 short form, 2 units */
    0xD8, 0x03, 0x07,             /* 11 one line +1, 1 unit */
    0xF2, 0x07, 0x00, 0x01, 0x02, /* 14 long form, 3 units, -3 */
    0xF8,                         /* 15 no location, 1 unit */
    0xEF, 0x48, 0x03,             /* 13, 8 units, +100 (two-byte varint) */
    0xE0, 0x00, 0x01,             /* 12 one line +2, 1 unit */
};

static void test_line_311(void)
{
    static const int addr[] = { -2, 0, 1, 2, 4, 6, 8, 12, 14, 16, 30, 32, 34, 1000 };
    static const int line[] = { 10, 12, 12, 12, 12, 13, 10, 10, -1, 110, 110, 112, -1, -1 };
    for (size_t i = 0; i < sizeof addr / sizeof addr[0]; i++)
        CHECK_EQ_U64(gg_py_line_311(LT311, sizeof LT311, 10, addr[i]), line[i]);
    CHECK_EQ_U64(gg_py_line_311(LT311, 0, 10, 0), -1);
    CHECK_EQ_U64(gg_py_line_311(NULL, 0, 10, -2), 10);
}

static void test_line_311_corrupt(void)
{
    /* Cut inside the two-byte varint: no answer, and no read past the end
     * (each cut is its own heap block, so ASan sees any overread). */
    for (size_t cut = 0; cut < sizeof LT311; cut++) {
        uint8_t *t = malloc(cut ? cut : 1);
        memcpy(t, LT311, cut);
        int l = gg_py_line_311(t, cut, 10, 16);
        CHECK(cut >= 16 ? l == 110 : l == -1);
        free(t);
    }
    /* Not at an entry start, a varint that never ends, all zeros. */
    static const uint8_t junk1[] = { 0x05, 0x81 };
    static const uint8_t junk2[] = { 0xE8, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F };
    static const uint8_t zeros[16] = { 0 };
    CHECK_EQ_U64(gg_py_line_311(junk1, sizeof junk1, 1, 0), -1);
    CHECK_EQ_U64(gg_py_line_311(junk2, sizeof junk2, 1, 0), -1);
    CHECK_EQ_U64(gg_py_line_311(zeros, sizeof zeros, 1, 4), -1);
}

/* ---- 3.10 line table ---------------------------------------------------- */

/* firstlineno 5. co_lines(): (0,6,6) (6,10,9) (10,12,None) (12,16,6)
 * (16,271,6) (271,281,133); the empty (0, +2) pair carries its delta. */
static const uint8_t LT310[] = { 6, 1, 0, 2, 4, 1, 2, 0x80, 4, 0xFD, 255, 0, 10, 127 };

static void test_line_310(void)
{
    static const int addr[] = { -2, 0, 5, 6, 9, 10, 12, 16, 270, 271, 280, 281 };
    static const int line[] = { 5, 6, 6, 9, 9, -1, 6, 6, 6, 133, 133, -1 };
    for (size_t i = 0; i < sizeof addr / sizeof addr[0]; i++)
        CHECK_EQ_U64(gg_py_line_310(LT310, sizeof LT310, 5, addr[i]), line[i]);
    /* An odd length ignores the half pair; a cut table covers less. */
    CHECK_EQ_U64(gg_py_line_310(LT310, 3, 5, 2), 6);
    CHECK_EQ_U64(gg_py_line_310(LT310, 3, 5, 6), -1);
    CHECK_EQ_U64(gg_py_line_310(LT310, 0, 5, 0), -1);
}

/* ---- strings ------------------------------------------------------------ */

static void test_utf8(void)
{
    char out[64];
    static const uint8_t latin1[] = { 'c', 0xE9, 0xFF, 0 };
    CHECK_EQ_U64(gg_py_utf8(1, latin1, 4, out, sizeof out), 6);
    CHECK_STR(out, "c\xC3\xA9\xC3\xBF?");           /* NUL becomes '?' */

    static const uint16_t ucs2[] = { 0x6587, 0x4EF6, 0xD800, 'x' };
    gg_py_utf8(2, ucs2, 4, out, sizeof out);
    CHECK_STR(out, "\xE6\x96\x87\xE4\xBB\xB6\xEF\xBF\xBDx"); /* lone surrogate: U+FFFD */

    static const uint32_t ucs4[] = { 0x1F600, 0x110000, 0xDFFF, 'a' };
    gg_py_utf8(4, ucs4, 4, out, sizeof out);
    CHECK_STR(out, "\xF0\x9F\x98\x80\xEF\xBF\xBD\xEF\xBF\xBD" "a");

    /* Cut at a character boundary: 5 bytes of room hold one 4-byte char. */
    CHECK_EQ_U64(gg_py_utf8(4, ucs4, 4, out, 5), 4);
    CHECK_STR(out, "\xF0\x9F\x98\x80");
    CHECK_EQ_U64(gg_py_utf8(4, ucs4, 4, out, 4), 0);
    CHECK_STR(out, "");
    CHECK_EQ_U64(gg_py_utf8(1, "abc", 3, out, 1), 0);
}

static void test_str_state(void)
{
    bool ascii;
    /* interned 1, kind 1, compact, ascii, ready (3.10/3.11 bit 7) */
    uint32_t s = 1 | 1 << 2 | 1 << 5 | 1 << 6 | 1 << 7;
    CHECK_EQ_U64(gg_py_str_kind(s, true, &ascii), 1);
    CHECK(ascii);
    CHECK_EQ_U64(gg_py_str_kind(s & ~(1u << 7), true, &ascii), 0);  /* not ready */
    CHECK_EQ_U64(gg_py_str_kind(s & ~(1u << 7), false, &ascii), 1); /* 3.12: no such bit */
    CHECK_EQ_U64(gg_py_str_kind(2 << 2 | 1 << 5, false, &ascii), 2);
    CHECK(!ascii);
    CHECK_EQ_U64(gg_py_str_kind(4 << 2 | 1 << 5, false, &ascii), 4);
    CHECK_EQ_U64(gg_py_str_kind(4 << 2, false, &ascii), 0);          /* not compact */
    CHECK_EQ_U64(gg_py_str_kind(3 << 2 | 1 << 5, false, &ascii), 0); /* no such kind */
    CHECK_EQ_U64(gg_py_str_kind(0 << 2 | 1 << 5, false, &ascii), 0); /* wchar kind */
    CHECK_EQ_U64(gg_py_str_kind(2 << 2 | 1 << 5 | 1 << 6, false, &ascii), 0);
}

/* ---- a process without Python ------------------------------------------- */

static void test_no_python(void)
{
    struct gg_py_raw raw[4];
    struct gg_py_frame f;
    CHECK_EQ_U64(gg_py_capture(raw, 4), 0);
    CHECK_EQ_U64(gg_py_state(), GG_PY_ABSENT);
    CHECK_STR(gg_py_status(), "no Python in this process");
    CHECK(gg_py_take_error() == NULL);
    raw[0] = (struct gg_py_raw){ 4096, 0, 0 };
    CHECK(!gg_py_resolve(&raw[0], false, &f));
    CHECK_STR(f.file, "?");
    CHECK_EQ_U64(f.line, 0);
}

int main(void)
{
    RUN(test_line_311);
    RUN(test_line_311_corrupt);
    RUN(test_line_310);
    RUN(test_utf8);
    RUN(test_str_state);
    RUN(test_no_python);
    return unit_done();
}
