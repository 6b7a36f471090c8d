/* Unit tests for pyframes.c: line tables and strings decoded from hand-built
 * bytes (expectations checked against co_lines() of code objects carrying
 * the same tables), a process without Python, and the guards, against fake
 * interpreters (tests/pyframes/fakepy.c) whose layouts and frame chains are
 * wrong on purpose, each in a child process (the layout is checked once per
 * process). Real interpreters: tests/e2e/test_pyframes.py. */
#include "pyframes.h"
#include "unit.h"
#include "../pyframes/fakepy.h"

#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
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
    CHECK(gg_py_resolve(&raw[0], 1, false, &f) == 0);
    CHECK_STR(f.file, "?");
    CHECK_EQ_U64(f.line, 0);
}

/* ---- the guards, against fake interpreters ------------------------------- */

static char fake_dir[PATH_MAX];
static void *fake;                       /* the fake's handle, in the child */

static void fake_call(const char *name)
{
    void (*f)(void) = (void (*)(void))dlsym(fake, name);
    CHECK(f != NULL);
    if (f)
        f();
}

/* Run body in a child that loaded a fake interpreter set up as `scenario`
 * (the layout is checked once per process); its failed checks come back as
 * its exit status. `local`: loaded RTLD_LOCAL, found through the loader. */
static void with_fake(int scenario, bool py310, bool local, void (*body)(void))
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/libpython-fake%s.so", fake_dir, py310 ? "310" : "");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        unit_checks_failed = 0;
        fake = dlopen(path, RTLD_NOW | (local ? RTLD_LOCAL : RTLD_GLOBAL));
        int (*setup)(int) = fake ? (int (*)(int))dlsym(fake, "fakepy_setup") : NULL;
        if (!setup || setup(scenario) != 0) {
            printf("  cannot set up %s: %s\n", path, dlerror());
            fflush(stdout);
            _exit(100);
        }
        body();
        fflush(stdout);
        _exit(unit_checks_failed > 99 ? 99 : unit_checks_failed);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        printf("  scenario %d: child %s %d\n", scenario,
               WIFEXITED(status) ? "failed checks:" : "killed by signal", WIFEXITED(status) ?
               WEXITSTATUS(status) : WTERMSIG(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* The fake's frames: Net.forward (model.py, latin-1 name) then <module>. */
static void names_both_frames(void)
{
    struct gg_py_raw raw[16];
    struct gg_py_frame f;
    CHECK_EQ_U64(gg_py_capture(raw, 16), 2);
    CHECK_EQ_U64(gg_py_state(), GG_PY_ON);
    CHECK(strstr(gg_py_status(), "libpython-fake") != NULL);
    CHECK(gg_py_take_error() == NULL);
    CHECK(gg_py_resolve(&raw[0], 1, true, &f) == 1);
    CHECK_STR(f.file, "/m/m\xc3\xb6" "del.py");
    CHECK_STR(f.func, "Net.forward");
    CHECK_EQ_U64(f.line, 13);
    CHECK(gg_py_resolve(&raw[1], 1, true, &f) == 1);
    CHECK_STR(f.file, "/m/train.py");
    CHECK_STR(f.func, "<module>");
    CHECK_EQ_U64(f.line, 21);
    struct gg_py_frame both[2];
    CHECK_EQ_U64(gg_py_resolve(raw, 2, true, both), 2);
    CHECK_STR(both[0].func, "Net.forward");
    CHECK_STR(both[1].func, "<module>");
    CHECK_EQ_U64(gg_py_capture(raw, 1), 1);          /* the cap: innermost first */
    CHECK(gg_py_resolve(&raw[0], 1, false, &f) == 1);       /* checked reads, same answer */
    CHECK_STR(f.func, "Net.forward");
    /* Finalizing, or a thread Python never saw: nothing. */
    fake_call("fakepy_finalizing_on");
    CHECK_EQ_U64(gg_py_capture(raw, 16), 0);
    fake_call("fakepy_finalizing_off");
    CHECK_EQ_U64(gg_py_capture(raw, 16), 2);
    fake_call("fakepy_no_tstate");
    CHECK_EQ_U64(gg_py_capture(raw, 16), 0);
    gg_py_disable();
    CHECK_EQ_U64(gg_py_state(), GG_PY_OFF);
}

static void test_fake_312(void) { with_fake(FAKE_312, false, false, names_both_frames); }
static void test_fake_313(void) { with_fake(FAKE_313, false, false, names_both_frames); }
static void test_fake_310(void) { with_fake(FAKE_310, true, false, names_both_frames); }
static void test_fake_rtld_local(void) { with_fake(FAKE_312, false, true, names_both_frames); }

/* Names asked for late, after the code object was freed or replaced. */
static void late_after_free(void)
{
    struct gg_py_raw raw[16];
    struct gg_py_frame f;
    CHECK_EQ_U64(gg_py_capture(raw, 16), 2);
    CHECK(gg_py_resolve(&raw[0], 1, true, &f) == 1);
    fake_call("fakepy_free_inner_code");
    CHECK(gg_py_resolve(&raw[0], 1, false, &f) == 1);       /* cached: no read at all */
    CHECK_STR(f.func, "Net.forward");
    gg_py_test_forget(NULL);
    CHECK(gg_py_resolve(&raw[0], 1, false, &f) == 0);      /* unmapped: no crash, no name */
    CHECK_STR(f.func, "?");
    CHECK(gg_py_resolve(&raw[1], 1, false, &f) == 1);
    CHECK_STR(f.func, "<module>");
}

static void late_after_replace(void)
{
    struct gg_py_raw raw[16];
    struct gg_py_frame f;
    CHECK_EQ_U64(gg_py_capture(raw, 16), 2);
    fake_call("fakepy_rename_inner_code");
    struct gg_py_raw again[16];
    CHECK_EQ_U64(gg_py_capture(again, 16), 2);
    CHECK(again[0].code == raw[0].code && again[0].ident != raw[0].ident);
    CHECK(gg_py_resolve(&raw[0], 1, false, &f) == 0);      /* not the code it was */
    CHECK(gg_py_resolve(&raw[0], 1, true, &f) == 0);
    CHECK(gg_py_resolve(&again[0], 1, true, &f) == 1);
    CHECK_STR(f.func, "Other.forward");
}

/* After the first walk proved the layout, something unexpected still
 * turns capture off for good rather than being followed. */
static void later_anomaly(void)
{
    struct gg_py_raw raw[16];
    CHECK_EQ_U64(gg_py_capture(raw, 16), 2);
    fake_call("fakepy_misalign_inner");
    CHECK_EQ_U64(gg_py_capture(raw, 16), 0);
    CHECK_EQ_U64(gg_py_state(), GG_PY_FAILED);
    const char *e = gg_py_take_error();
    CHECK(e && strstr(e, "unexpected frame (frame unreadable)"));
}

static void test_fake_later_anomaly(void) { with_fake(FAKE_312, false, false, later_anomaly); }

/* Threads capturing and naming at once, their first walks too: run under
 * ThreadSanitizer by make test-tsan. */
static void *capture_and_name(void *arg)
{
    long *bad = arg;
    for (int i = 0; i < 2000; i++) {
        struct gg_py_raw raw[8];
        struct gg_py_frame f[8];
        int n = gg_py_capture(raw, 8);
        if (n != 2 || gg_py_resolve(raw, n, true, f) != 2 || strcmp(f[0].func, "Net.forward") ||
            f[1].line != 21)
            ++*bad;
        if (i % 500 == 0)
            gg_py_test_forget(NULL);
    }
    return NULL;
}

static void threads(void)
{
    pthread_t t[4];
    long bad[4] = { 0 };
    /* Found first: captures while another thread looks return nothing rather
     * than wait. The first walks, checked, still race. */
    CHECK_EQ_U64(gg_py_state(), GG_PY_ON);
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, capture_and_name, &bad[i]) == 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_U64(bad[i], 0);
    }
}

static void test_fake_threads(void) { with_fake(FAKE_312, false, false, threads); }

static void test_fake_late(void)
{
    with_fake(FAKE_312, false, false, late_after_free);
    with_fake(FAKE_312, false, false, late_after_replace);
}

static const char *expected_error;

static void fails_once(void)
{
    struct gg_py_raw raw[16];
    CHECK_EQ_U64(gg_py_capture(raw, 16), 0);
    CHECK_EQ_U64(gg_py_state(), GG_PY_FAILED);
    const char *e = gg_py_take_error();
    CHECK(e && strstr(e, expected_error));
    if (!e || !strstr(e, expected_error))
        printf("  said: %s\n", e ? e : "(nothing)");
    CHECK(gg_py_take_error() == NULL);               /* said once */
    CHECK(strstr(gg_py_status(), expected_error) != NULL);
    CHECK_EQ_U64(gg_py_capture(raw, 16), 0);         /* and off for good */
    gg_py_disable();
    CHECK_EQ_U64(gg_py_state(), GG_PY_FAILED);
}

static void test_fake_refused(void)
{
    static const struct { int scenario; bool py310; const char *error; } cases[] = {
        { FAKE_314, false, "CPython 3.14.0 (" },
        { FAKE_39, true, "CPython 3.9.18 (" },
        { FAKE_PRERELEASE, false, "pre-release" },
        { FAKE_CODE_SIZE, false, "type 'code' has size 200, not 192" },
        { FAKE_TP_NAME_BAD, false, "layout not as expected" },
        { FAKE_313_COOKIE, false, "_Py_DebugOffsets" },
        { FAKE_313_FREE_THREADED, false, "free-threaded 1" },
        { FAKE_313_OFFSETS, false, "offsets out of range" },
        { FAKE_UNMAPPED_FRAME, false, "frame unreadable" },
        { FAKE_CYCLE, false, "cycle" },
        { FAKE_MISALIGNED, false, "frame unreadable" },
        { FAKE_NOT_CODE, false, "frame without a code object" },
        { FAKE_BAD_INSTR, false, "instruction pointer outside its code" },
        { FAKE_BAD_OWNER, false, "frame owner out of range" },
        { FAKE_BAD_STR, false, "co_filename not a str" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        expected_error = cases[i].error;
        with_fake(cases[i].scenario, cases[i].py310, false, fails_once);
    }
}

/* ---- Python loaded after the first look --------------------------------- */

static void test_python_loaded_later(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        unit_checks_failed = 0;
        struct gg_py_raw raw[8];
        CHECK_EQ_U64(gg_py_capture(raw, 8), 0);
        CHECK_EQ_U64(gg_py_state(), GG_PY_ABSENT);
        char path[PATH_MAX + 64];
        snprintf(path, sizeof path, "%s/libpython-fake.so", fake_dir);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);    /* embedded, later */
        int (*setup)(int) = h ? (int (*)(int))dlsym(h, "fakepy_setup") : NULL;
        CHECK(setup && setup(FAKE_312) == 0);
        int n = 0;
        for (int i = 0; i < 256 && n == 0; i++)     /* looked for again, not every call */
            n = gg_py_capture(raw, 8);
        CHECK_EQ_U64(n, 0);                          /* not within the second */
        gg_py_test_rescan_now();
        for (int i = 0; i < 256 && n == 0; i++)
            n = gg_py_capture(raw, 8);
        CHECK_EQ_U64(n, 2);
        CHECK_EQ_U64(gg_py_state(), GG_PY_ON);
        fflush(stdout);
        _exit(unit_checks_failed > 99 ? 99 : unit_checks_failed);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = '\0';
    snprintf(fake_dir, sizeof fake_dir, "%s/../pyframes", dirname(self));
    RUN(test_line_311);
    RUN(test_line_311_corrupt);
    RUN(test_line_310);
    RUN(test_utf8);
    RUN(test_str_state);
    /* The fakes first: each child must look for Python itself. */
    RUN(test_fake_312);
    RUN(test_fake_313);
    RUN(test_fake_310);
    RUN(test_fake_rtld_local);
    RUN(test_fake_late);
    RUN(test_fake_later_anomaly);
    RUN(test_fake_threads);
    RUN(test_fake_refused);
    RUN(test_python_loaded_later);
    RUN(test_no_python);
    return unit_done();
}
