/* test_policy.c - policy files: keys, problems with FILE:LINE, selection,
 * environment overrides, limits (shim/config/policy.c, with values.c, settings.c and
 * inifile.c beneath it). */
#include "policy.h"
#include "unit.h"

#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GiB (1ULL << 30)
#define MiB (1ULL << 20)

/* ------------------------------------------------------------------------ */
/* What the callback was told                                                */

#define MAX_REPORTS 64

struct report {
    char file[GG_PATH_MAX];
    int line;
    char msg[1024];
};

struct reports {
    int n;
    struct report r[MAX_REPORTS];
};

static void collect(void *ctx, const char *file, int line, const char *msg)
{
    struct reports *rs = ctx;

    if (rs->n < MAX_REPORTS) {
        struct report *r = &rs->r[rs->n];
        snprintf(r->file, sizeof r->file, "%s", file);
        r->line = line;
        snprintf(r->msg, sizeof r->msg, "%s", msg);
    }
    rs->n++;
}

/* Was (file, line, a message containing `part`) reported? */
static int reported(const struct reports *rs, const char *file, int line, const char *part)
{
    for (int i = 0; i < rs->n && i < MAX_REPORTS; i++)
        if (strcmp(rs->r[i].file, file) == 0 && rs->r[i].line == line &&
            strstr(rs->r[i].msg, part))
            return 1;
    return 0;
}

static void dump(const struct reports *rs)
{
    for (int i = 0; i < rs->n && i < MAX_REPORTS; i++)
        printf("    reported %s:%d: %s\n", rs->r[i].file, rs->r[i].line, rs->r[i].msg);
}

#define CHECK_REPORTED(rs, file, line, part)                                           \
    do {                                                                               \
        if (!reported((rs), (file), (line), (part))) {                                 \
            unit_checks_failed++;                                                      \
            printf("  %s:%d: not reported: %s:%d: ...%s...\n", __FILE__, __LINE__,     \
                   (file), (line), (part));                                            \
            dump(rs);                                                                  \
        }                                                                              \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Temporary files                                                           */

static char tmp_root[64];

static const char *tmp_dir(void)
{
    if (!tmp_root[0]) {
        snprintf(tmp_root, sizeof tmp_root, "/tmp/gg_test_policy_XXXXXX");
        if (!unit_tmpdir(tmp_root)) {
            perror("mkdtemp");
            exit(2);
        }
    }
    return tmp_root;
}

/* A fresh directory under the temporary root. */
static const char *new_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmp_dir(), name);
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        perror(out);
        exit(2);
    }
    return out;
}

/* Write `text` to dir/name; the path goes to out. */
static const char *put(char *out, size_t cap, const char *dir, const char *name, const char *text)
{
    FILE *f;

    snprintf(out, cap, "%s/%s", dir, name);
    f = fopen(out, "w");
    if (!f) {
        perror(out);
        exit(2);
    }
    fputs(text, f);
    fclose(f);
    return out;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void tmp_cleanup(void)
{
    if (tmp_root[0])
        nftw(tmp_root, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Load text as a file; problems into rs. */
static int load_text(const char *name, const char *text, struct gg_policy *p,
                     struct reports *rs, char *path, size_t cap)
{
    char dir[256];

    new_dir(dir, sizeof dir, "files");
    put(path, cap, dir, name, text);
    memset(rs, 0, sizeof *rs);
    return gg_policy_load(path, p, collect, rs);
}

/* ------------------------------------------------------------------------ */
/* Sizes                                                                     */

static void test_size_units(void)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        { "0", 0 },
        { "4096", 4096 },
        { "4096 B", 4096 },
        { "4096B", 4096 },
        { "1 KiB", 1024 },
        { "1KiB", 1024 },
        { "2 MiB", 2 * MiB },
        { "1.5 GiB", 3 * GiB / 2 },
        { "1.5GiB", 3 * GiB / 2 },
        { "1.5\tGiB", 3 * GiB / 2 },
        { "1.5   GiB", 3 * GiB / 2 },
        { "  1.5 GiB  ", 3 * GiB / 2 },
        { "2 TiB", 2ULL << 40 },
        { "0.5 KiB", 512 },
        { "0.1 GiB", 107374182 }, /* 107374182.4, rounded down */
        { "1 kB", 1000 },
        { "1 KB", 1000 },
        { "512MB", 512000000ULL },
        { "512 MB", 512000000ULL },
        { "1.5 GB", 1500000000ULL },
        { "3 TB", 3000000000000ULL },
        { "1.0", 1 },
        { "007 MiB", 7 * MiB },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gg_size s = { 7, 7.0, true };
        const char *why = NULL;
        int rc = gg_value_size(cases[i].text, &s, &why);

        if (rc != 0)
            printf("    '%s': %s\n", cases[i].text, why);
        CHECK(rc == 0);
        CHECK(!s.is_percent);
        CHECK_EQ_U64(s.bytes, cases[i].bytes);
    }
    {
        /* 2^64 bytes does not fit; one TiB less does. */
        struct gg_size s;
        const char *why = NULL;
        CHECK(gg_value_size("16777216 TiB", &s, &why) == -1);
        CHECK_STR(why, "size too large");
        CHECK(gg_value_size("16777215 TiB", &s, &why) == 0);
        CHECK_EQ_U64(s.bytes, 16777215ULL << 40);
        CHECK(gg_value_size("18446744073709551615", &s, &why) == 0);
        CHECK_EQ_U64(s.bytes, UINT64_MAX);
    }
}

static void test_size_percent(void)
{
    static const struct {
        const char *text;
        double percent;
    } cases[] = {
        { "10%", 10.0 }, { "10 %", 10.0 }, { "2.5%", 2.5 }, { "0%", 0.0 },
        { "100%", 100.0 }, { "100.0%", 100.0 }, { " 12.5 % ", 12.5 },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gg_size s = { 7, 7.0, false };
        const char *why = NULL;

        CHECK(gg_value_size(cases[i].text, &s, &why) == 0);
        CHECK(s.is_percent);
        CHECK(s.percent == cases[i].percent);
    }
}

static void test_size_malformed(void)
{
    static const struct {
        const char *text;
        const char *why;
    } cases[] = {
        { "", "malformed size: empty" },
        { "   ", "malformed size: empty" },
        { "GiB", "malformed size: expected a number" },
        { "%", "malformed size: expected a number" },
        { "one GiB", "malformed size: expected a number" },
        { "+1 GiB", "malformed size: expected a number" },
        { ".5 GiB", "malformed size: expected a number" },
        { "1. GiB", "malformed size: expected digits after '.'" },
        { "1 gib", "malformed size: unknown unit" },
        { "1 G", "malformed size: unknown unit" },
        { "1 Gb", "malformed size: unknown unit" },
        { "1 mb", "malformed size: unknown unit" },
        { "1 GiBs", "malformed size: unknown unit" },
        { "1 GiB extra", "malformed size: unknown unit" },
        { "1 B B", "malformed size: unknown unit" },
        { "1,5 GiB", "malformed size: unknown unit" },
        { "1e9", "malformed size: unknown unit" },
        { "0x10", "malformed size: unknown unit" },
        { "1.2.3 GiB", "malformed size: unknown unit" },
        { "10%%", "malformed size: unknown unit" },
        { "10 percent", "malformed size: unknown unit" },
        { "1.5", "malformed size: a size in bytes must be a whole number" },
        { "1.5 B", "malformed size: a size in bytes must be a whole number" },
        { "99999999999999999999", "malformed size: too many digits" },
        { "1.00000000000000000001 GiB", "malformed size: too many digits" },
        { "16777216 TiB", "size too large" },
        { "-1", "negative size" },
        { "-1 GiB", "negative size" },
        { "-0.5 GiB", "negative size" },
        { "-5%", "negative size" },
        { "101%", "percentage over 100" },
        { "100.01%", "percentage over 100" },
        { "1000 %", "percentage over 100" },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gg_size s = { 7, 7.0, false };
        const char *why = NULL;
        int rc = gg_value_size(cases[i].text, &s, &why);

        CHECK(rc == -1);
        CHECK(why != NULL);
        if (why && strncmp(why, cases[i].why, strlen(cases[i].why)) != 0) {
            unit_checks_failed++;
            printf("  '%s': why '%s', expected '%s...'\n", cases[i].text, why, cases[i].why);
        }
    }
    CHECK(gg_value_size(NULL, &(struct gg_size){ 0, 0, false }, NULL) == -1);
}

static void test_size_bytes(void)
{
    struct gg_size ten = { 0, 10.0, true }, all = { 0, 100.0, true }, none = { 0, 0.0, true };
    struct gg_size eighth = { 0, 12.5, true }, fixed = { 3 * GiB / 2, 0, false };

    CHECK_EQ_U64(gg_size_bytes(ten, 24 * GiB), 2576980377ULL); /* 2576980377.6 */
    CHECK_EQ_U64(gg_size_bytes(ten, 1000), 100);
    CHECK_EQ_U64(gg_size_bytes(all, 24 * GiB), 24 * GiB);
    CHECK_EQ_U64(gg_size_bytes(none, 24 * GiB), 0);
    CHECK_EQ_U64(gg_size_bytes(eighth, 80 * GiB), 10 * GiB);
    CHECK_EQ_U64(gg_size_bytes(fixed, 1), 3 * GiB / 2); /* bytes are bytes */
    CHECK_EQ_U64(gg_size_bytes(ten, 0), 0);
    CHECK_EQ_U64(gg_size_bytes(all, UINT64_MAX), UINT64_MAX);
}

/* ------------------------------------------------------------------------ */
/* Keys                                                                      */

static void test_defaults(void)
{
    struct gg_policy p;

    memset(&p, 0xAB, sizeof p);
    gg_policy_defaults(&p);
    CHECK_STR(p.file, "");
    CHECK_STR(p.s.match, "");
    CHECK(p.s.headroom.is_percent); /* the shipped policies' 10%, not 0 */
    CHECK(p.s.headroom.percent == 10.0);
    CHECK(p.s.near_miss.is_percent);
    CHECK(p.s.near_miss.percent == 5.0);
    CHECK(p.s.mode == GG_MODE_AUTO);
    CHECK(p.s.enforce == GG_ENFORCE_RUNTIME);
    CHECK(p.s.virtualize_meminfo);
    CHECK(p.s.signal == SIGUSR2);
    CHECK(p.s.batch_size == 0);
    CHECK(p.s.grad_accum == 0);
    CHECK(p.s.min_batch_size == 1);
    CHECK_STR(p.s.journal_dir, ".");
    CHECK(p.s.stacks == GG_STACKS_ALL);
    CHECK(p.s.depth == 32);
    CHECK(!p.broken);
    CHECK(p.line[GG_SET_headroom] == 0);
    CHECK(!p.from_env[GG_SET_headroom]);
}

static void test_every_key(void)
{
    static const char text[] =
        "; a policy that sets every key\n"                       /* 1 */
        "[gpu]\n"                                                /* 2 */
        "match = NVIDIA Test GPU*, Other *   ; two globs\n"      /* 3 */
        "\n"                                                     /* 4 */
        "[memory]\n"                                             /* 5 */
        "headroom = 1.5 GiB    ; must stay free\n"               /* 6 */
        "near_miss = 2.5%\n"                                     /* 7 */
        "mode = observe\n"                                       /* 8 */
        "enforce = all\n"                                        /* 9 */
        "virtualize_meminfo = no\n"                              /* 10 */
        "# hash comment\n"                                       /* 11 */
        "[trainer]\n"                                            /* 12 */
        "signal = SIGUSR1\n"                                     /* 13 */
        "batch_size = 8\n"                                       /* 14 */
        "grad_accum = 2\n"                                       /* 15 */
        "min_batch_size = 2\n"                                   /* 16 */
        "[journal]\n"                                            /* 17 */
        "dir = /var/tmp/gg journal\n"                            /* 18 */
        "stacks = all\n"                                         /* 19 */
        "depth = 128\n";                                         /* 20 */
    struct gg_policy p;
    struct reports rs;
    char path[GG_PATH_MAX];

    CHECK(load_text("every.ini", text, &p, &rs, path, sizeof path) == 0);
    dump(&rs);
    CHECK(!p.broken);
    CHECK_STR(p.file, path);
    CHECK_STR(p.s.match, "NVIDIA Test GPU*, Other *");
    CHECK(!p.s.headroom.is_percent);
    CHECK_EQ_U64(p.s.headroom.bytes, 3 * GiB / 2);
    CHECK(p.line[GG_SET_headroom] == 6);
    CHECK(p.s.near_miss.is_percent && p.s.near_miss.percent == 2.5);
    CHECK(p.s.mode == GG_MODE_OBSERVE);
    CHECK(p.s.enforce == GG_ENFORCE_ALL);
    CHECK(!p.s.virtualize_meminfo);
    CHECK(p.s.signal == SIGUSR1);
    CHECK(p.s.batch_size == 8);
    CHECK(p.s.grad_accum == 2);
    CHECK(p.s.min_batch_size == 2);
    CHECK_STR(p.s.journal_dir, "/var/tmp/gg journal");
    CHECK(p.s.stacks == GG_STACKS_ALL);
    CHECK(p.s.depth == 128);
}

/* Indentation, case, ':' separators, CRLF and a BOM are all fine. */
static void test_lenient_forms(void)
{
    static const char text[] =
        "\xEF\xBB\xBF[GPU]\r\n"
        "  Match = A*\r\n"
        "[ memory ]   ; spaces inside the brackets\r\n"
        "\tHEADROOM : 10%\r\n"
        "    near_miss = 1 GiB\r\n"
        "mode = OBSERVE\r\n"
        "[journal]\r\n"
        "stacks = Near_Miss\r\n"
        "depth = 1";                 /* no final newline */
    struct gg_policy p;
    struct reports rs;
    char path[GG_PATH_MAX];

    CHECK(load_text("lenient.ini", text, &p, &rs, path, sizeof path) == 0);
    dump(&rs);
    CHECK_STR(p.s.match, "A*");
    CHECK(p.s.headroom.is_percent && p.s.headroom.percent == 10.0);
    CHECK(p.line[GG_SET_headroom] == 4);
    CHECK_EQ_U64(p.s.near_miss.bytes, GiB);
    CHECK(p.s.mode == GG_MODE_OBSERVE);
    CHECK(p.s.stacks == GG_STACKS_NEAR_MISS);
    CHECK(p.s.depth == 1);
}

static void test_enum_values(void)
{
    static const struct {
        const char *key, *value;
        int expect; /* what the field becomes */
    } cases[] = {
        { "mode", "enforce", GG_MODE_ENFORCE },    { "mode", "observe", GG_MODE_OBSERVE },
        { "mode", "off", GG_MODE_OFF },            { "mode", "auto", GG_MODE_AUTO },
        { "enforce", "runtime", GG_ENFORCE_RUNTIME },
        { "enforce", "all", GG_ENFORCE_ALL },      { "virtualize_meminfo", "yes", 1 },
        { "virtualize_meminfo", "no", 0 },         { "virtualize_meminfo", "true", 1 },
        { "virtualize_meminfo", "false", 0 },      { "virtualize_meminfo", "1", 1 },
        { "virtualize_meminfo", "0", 0 },          { "virtualize_meminfo", "on", 1 },
        { "virtualize_meminfo", "off", 0 },        { "virtualize_meminfo", "Yes", 1 },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256], path[GG_PATH_MAX];
        struct gg_policy p;
        struct reports rs;
        int got;

        snprintf(text, sizeof text, "[memory]\n%s = %s\n", cases[i].key, cases[i].value);
        CHECK(load_text("enum.ini", text, &p, &rs, path, sizeof path) == 0);
        got = strcmp(cases[i].key, "mode") == 0      ? (int)p.s.mode
              : strcmp(cases[i].key, "enforce") == 0 ? (int)p.s.enforce
                                                     : (int)p.s.virtualize_meminfo;
        if (got != cases[i].expect) {
            unit_checks_failed++;
            printf("  %s = %s gave %d\n", cases[i].key, cases[i].value, got);
        }
    }
}

static void test_stacks_values(void)
{
    static const struct {
        const char *value;
        enum gg_stacks expect;
    } cases[] = {
        { "all", GG_STACKS_ALL }, { "near_miss", GG_STACKS_NEAR_MISS }, { "off", GG_STACKS_OFF },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[128], path[GG_PATH_MAX];
        struct gg_policy p;
        struct reports rs;

        snprintf(text, sizeof text, "[journal]\nstacks = %s\n", cases[i].value);
        CHECK(load_text("stacks.ini", text, &p, &rs, path, sizeof path) == 0);
        CHECK(p.s.stacks == (int)cases[i].expect);
    }
}

static void test_signal_values(void)
{
    static const struct {
        const char *value;
        int expect;
    } cases[] = {
        { "SIGUSR2", SIGUSR2 }, { "USR2", SIGUSR2 }, { "sigusr1", SIGUSR1 }, { "usr1", SIGUSR1 },
        { "SIGHUP", SIGHUP },   { "12", 12 },        { "10", 10 },           { "none", 0 },
        { "None", 0 },          { "0", 0 },          { "SIGWINCH", SIGWINCH },
    };
    static const struct {
        const char *value, *why;
    } bad[] = {
        { "SIGTERM", "not a signal for advice" }, { "TERM", "not a signal for advice" },
        { "SIGINT", "not a signal for advice" },  { "SIGSEGV", "not a signal for advice" },
        { "SIGABRT", "not a signal for advice" }, { "SIGKILL", "not a signal for advice" },
        { "SIGSTOP", "not a signal for advice" }, { "15", "not a signal for advice" },
        { "9", "not a signal for advice" },       { "SIGFOO", "bad value (expected a signal" },
        { "USR3", "bad value" },                  { "65", "bad value" },
        { "-1", "bad value" },                    { "SIG", "bad value" },
        { "SIGUSR2 now", "bad value" },           { "12x", "bad value" },
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[128], path[GG_PATH_MAX];
        struct gg_policy p;
        struct reports rs;

        snprintf(text, sizeof text, "[trainer]\nsignal = %s\n", cases[i].value);
        CHECK(load_text("signal.ini", text, &p, &rs, path, sizeof path) == 0);
        if (p.s.signal != cases[i].expect) {
            unit_checks_failed++;
            printf("  signal = %s gave %d\n", cases[i].value, p.s.signal);
        }
    }
    {
        /* real-time signals, by number */
        char text[128], path[GG_PATH_MAX];
        struct gg_policy p;
        struct reports rs;

        snprintf(text, sizeof text, "[trainer]\nsignal = %d\n", SIGRTMIN + 2);
        CHECK(load_text("signal.ini", text, &p, &rs, path, sizeof path) == 0);
        CHECK(p.s.signal == SIGRTMIN + 2);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[128], path[GG_PATH_MAX], want[256];
        struct gg_policy p;
        struct reports rs;

        snprintf(text, sizeof text, "[trainer]\nsignal = %s\n", bad[i].value);
        CHECK(load_text("signal.ini", text, &p, &rs, path, sizeof path) == 1);
        snprintf(want, sizeof want, "[trainer] signal = '%s': %s", bad[i].value, bad[i].why);
        CHECK_REPORTED(&rs, path, 2, want);
        CHECK(p.s.signal == SIGUSR2);
    }
}

static void test_names(void)
{
    CHECK_STR(gg_mode_name(GG_MODE_ENFORCE), "enforce");
    CHECK_STR(gg_mode_name(GG_MODE_OBSERVE), "observe");
    CHECK_STR(gg_mode_name(GG_MODE_OFF), "off");
    CHECK_STR(gg_mode_name(GG_MODE_AUTO), "auto");
    CHECK_STR(gg_enforce_name(GG_ENFORCE_RUNTIME), "runtime");
    CHECK_STR(gg_enforce_name(GG_ENFORCE_ALL), "all");
    CHECK_STR(gg_stacks_name(GG_STACKS_NEAR_MISS), "near_miss");
    CHECK_STR(gg_stacks_name(GG_STACKS_ALL), "all");
    CHECK_STR(gg_stacks_name(GG_STACKS_OFF), "off");
    CHECK_STR(gg_signal_name(SIGUSR2), "SIGUSR2");
    CHECK_STR(gg_signal_name(0), "none");
    CHECK_STR(gg_signal_name(SIGTERM), "SIGTERM");
    CHECK(gg_signal_name(40) == NULL);
}

/* ------------------------------------------------------------------------ */
/* Problems, each with its FILE:LINE                                         */

static void test_problems_have_lines(void)
{
    static const char text[] =
        "stray = 1\n"                                   /* 1: outside a section */
        "[gpu]\n"                                       /* 2 */
        "match = A*\n"                                  /* 3 */
        "[memroy]\n"                                    /* 4: unknown section */
        "headroom = 1 GiB\n"                            /* 5: ignored (section reported) */
        "[memory]\n"                                    /* 6 */
        "headrom = 1 GiB\n"                             /* 7: unknown key */
        "headroom = 1.5 gib\n"                          /* 8: malformed size */
        "near_miss = 150%\n"                            /* 9: percentage over 100 */
        "mode = enforcing\n"                            /* 10: bad enum */
        "enforce = some\n"                              /* 11: bad enum */
        "virtualize_meminfo = maybe\n"                  /* 12: bad bool */
        "this line has no equals sign\n"                /* 13: cannot parse */
        "[trainer\n"                                    /* 14: malformed header */
        "[trainer]\n"                                   /* 15 */
        "signal = SIGKILL\n"                            /* 16: bad signal */
        "batch_size = 0\n"                              /* 17: out of range */
        "grad_accum = four\n"                           /* 18: not an integer */
        "min_batch_size = -2\n"                         /* 19: out of range */
        "[journal]\n"                                   /* 20 */
        "depth = 129\n"                                 /* 21: out of range */
        "stacks = some\n"                               /* 22: bad enum */
        "depth = 12\n"                                  /* 23: given twice */
        "dir =\n"                                       /* 24: empty */
        "= value\n"                                     /* 25: no key name */
        "[memory] junk\n"                               /* 26: text after ] */
        "near_miss = 1%\n";                             /* 27: given twice, across headers */
    struct gg_policy p;
    struct reports rs;
    char path[GG_PATH_MAX];
    int n = load_text("bad.ini", text, &p, &rs, path, sizeof path);

    CHECK(p.broken);
    CHECK(n == rs.n);
    CHECK(n == 21);
    CHECK_REPORTED(&rs, path, 1, "key 'stray' is outside a section");
    CHECK_REPORTED(&rs, path, 4, "unknown section [memroy]");
    CHECK(!reported(&rs, path, 5, ""));
    CHECK_REPORTED(&rs, path, 7, "unknown key 'headrom' in [memory] (known: headroom, near_miss");
    CHECK_REPORTED(&rs, path, 8, "[memory] headroom = '1.5 gib': malformed size: unknown unit");
    CHECK_REPORTED(&rs, path, 9, "[memory] near_miss = '150%': percentage over 100");
    CHECK_REPORTED(&rs, path, 10, "[memory] mode = 'enforcing': bad value (expected auto, "
                                  "enforce, observe or off)");
    CHECK_REPORTED(&rs, path, 11, "[memory] enforce = 'some': bad value (expected runtime or all)");
    CHECK_REPORTED(&rs, path, 12, "[memory] virtualize_meminfo = 'maybe': bad value (expected "
                                  "yes, no, true, false, 1, 0, on or off)");
    CHECK_REPORTED(&rs, path, 13, "cannot parse 'this line has no equals sign'");
    CHECK_REPORTED(&rs, path, 14, "malformed section header '[trainer'");
    CHECK_REPORTED(&rs, path, 16, "[trainer] signal = 'SIGKILL': not a signal for advice");
    CHECK_REPORTED(&rs, path, 17, "[trainer] batch_size = '0': out of range (1..1048576)");
    CHECK_REPORTED(&rs, path, 18, "[trainer] grad_accum = 'four': not an integer");
    CHECK_REPORTED(&rs, path, 19, "[trainer] min_batch_size = '-2': out of range");
    CHECK_REPORTED(&rs, path, 21, "[journal] depth = '129': out of range (1..128)");
    CHECK_REPORTED(&rs, path, 22, "[journal] stacks = 'some': bad value (expected all, "
                                  "near_miss or off)");
    CHECK_REPORTED(&rs, path, 23, "[journal] depth is given twice (first on line 21)");
    CHECK_REPORTED(&rs, path, 24, "[journal] dir = '': empty");
    CHECK_REPORTED(&rs, path, 25, "missing key name before '='");
    CHECK_REPORTED(&rs, path, 26, "unexpected text after [memory]: 'junk'");
    CHECK_REPORTED(&rs, path, 27, "[memory] near_miss is given twice (first on line 9)");
    /* what was good was still read; what was bad kept its default */
    CHECK_STR(p.s.match, "A*");
    CHECK_EQ_U64(p.s.headroom.bytes, 0);
    CHECK(p.s.near_miss.is_percent && p.s.near_miss.percent == 5.0);
    CHECK(p.s.mode == GG_MODE_AUTO);
    CHECK(p.s.signal == SIGUSR2);
    CHECK(p.s.depth == 32);
}

/* Whole messages, as gpuguard-check prints them after FILE:LINE:. */
static void test_exact_messages(void)
{
    struct gg_policy p;
    struct reports rs;
    char path[GG_PATH_MAX];

    load_text("m.ini", "[memory]\nheadroom = -1 GiB\n", &p, &rs, path, sizeof path);
    CHECK(rs.n == 1);
    CHECK(rs.r[0].line == 2);
    CHECK_STR(rs.r[0].msg, "[memory] headroom = '-1 GiB': negative size");

    load_text("m.ini", "[memory]\nnear_miss = 101%\n", &p, &rs, path, sizeof path);
    CHECK_STR(rs.r[0].msg, "[memory] near_miss = '101%': percentage over 100");

    load_text("m.ini", "[journal]\ndepth = 0\n", &p, &rs, path, sizeof path);
    CHECK_STR(rs.r[0].msg, "[journal] depth = '0': out of range (1..128)");

    load_text("m.ini", "[journal]\ndepht = 3\n", &p, &rs, path, sizeof path);
    CHECK_STR(rs.r[0].msg, "unknown key 'depht' in [journal] (known: dir, stacks, python, depth, metrics_dir, metrics_interval)");

    load_text("m.ini", "[gpus]\n", &p, &rs, path, sizeof path);
    CHECK_STR(rs.r[0].msg,
              "unknown section [gpus] (expected [gpu], [memory], [trainer] or [journal])");
    CHECK(p.broken);

    load_text("m.ini", "[memory]\nmode = loud\n", &p, &rs, path, sizeof path);
    CHECK_STR(rs.r[0].msg, "[memory] mode = 'loud': bad value (expected auto, enforce, observe or off)");

    load_text("m.ini", "[memory]\nheadroom\n", &p, &rs, path, sizeof path);
    CHECK_STR(rs.r[0].msg,
              "cannot parse 'headroom' (expected key = value, [section] or a ; comment)");
    CHECK(rs.r[0].line == 2);

    load_text("m.ini", "[trainer]\nbatch_size = 4\nmin_batch_size = 8\n", &p, &rs, path,
              sizeof path);
    CHECK(rs.n == 1);
    CHECK(rs.r[0].line == 3);
    CHECK_STR(rs.r[0].msg, "[trainer] min_batch_size = 8 is larger than batch_size = 4");
}

/* The last line, a line inih would split, a NUL byte, an empty glob. */
/* After a malformed header nothing is read until the next good one: each key
 * line there says so, with its line, and the lines after are checked as
 * usual. A value that could not be read is kept, quoted, for the listing. */
static void test_under_a_malformed_header(void)
{
    static const char text[] =
        "[gpu]\n"                                       /* 1 */
        "match = A*\n"                                  /* 2 */
        "[memory\n"                                     /* 3: malformed header */
        "headroom = 20%\n"                              /* 4: not read */
        "; a comment\n"                                 /* 5 */
        "mode = enforce\n"                              /* 6: not read */
        "[trainer]\n"                                   /* 7 */
        "signal = SIGFOO\n"                             /* 8: bad value, still said */
        "batch_size = 8\n";                             /* 9: read */
    struct gg_policy p;
    struct reports rs;
    char path[GG_PATH_MAX];
    int n = load_text("hdr.ini", text, &p, &rs, path, sizeof path);

    CHECK(n == 4);
    CHECK(rs.n == 4);
    CHECK_REPORTED(&rs, path, 3, "malformed section header '[memory' (expected [name])");
    CHECK_REPORTED(&rs, path, 4, "key 'headroom' is not read: it is under the malformed section "
                                 "header on line 3");
    CHECK_REPORTED(&rs, path, 6, "key 'mode' is not read: it is under the malformed section "
                                 "header on line 3");
    CHECK_REPORTED(&rs, path, 8, "[trainer] signal = 'SIGFOO': bad value");
    CHECK(!reported(&rs, path, 5, ""));
    CHECK(p.broken);
    CHECK(p.s.mode == GG_MODE_AUTO);
    CHECK(p.line[GG_SET_mode] == 0);
    CHECK(p.s.batch_size == 8);
    CHECK_STR(p.invalid[GG_SET_signal], "'SIGFOO'");
    CHECK(p.line[GG_SET_signal] == 8);
    CHECK_STR(p.invalid[GG_SET_batch_size], "");

    load_text("m.ini", "[memory]\nmode = enforced\n", &p, &rs, path, sizeof path);
    CHECK(p.broken);
    CHECK(p.s.mode == GG_MODE_AUTO);   /* the default stands ... */
    CHECK(p.line[GG_SET_mode] == 2);   /* ... and what line 2 said is kept */
    CHECK_STR(p.invalid[GG_SET_mode], "'enforced'");
    load_text("m.ini", "[memory]\nmode = enforce\n", &p, &rs, path, sizeof path);
    CHECK_STR(p.invalid[GG_SET_mode], "");
    /* a long value is cut to fit, and says so */
    load_text("m.ini", "[memory]\nmode = abcdefghijklmnopqrstuvwxyz0123456789\n", &p, &rs, path,
              sizeof path);
    CHECK(strlen(p.invalid[GG_SET_mode]) == GG_POLICY_INVALID_MAX - 1);
    CHECK(strstr(p.invalid[GG_SET_mode], "...'") != NULL);
}

static void test_edge_lines(void)
{
    char text[600], path[GG_PATH_MAX];
    struct gg_policy p;
    struct reports rs;
    size_t len;

    load_text("e.ini", "[memory]\nmode = observe\nbroken", &p, &rs, path, sizeof path);
    CHECK(rs.n == 1);
    CHECK_REPORTED(&rs, path, 3, "cannot parse 'broken'");
    CHECK(p.s.mode == GG_MODE_OBSERVE);

    /* 250 characters: inih's line is 200; the rest must not become a line. */
    len = (size_t)snprintf(text, sizeof text, "[journal]\ndir = /");
    memset(text + len, 'x', 250);
    len += 250;
    snprintf(text + len, sizeof text - len, "\ndepth = 7\n");
    load_text("e.ini", text, &p, &rs, path, sizeof path);
    CHECK(rs.n == 1);
    CHECK_REPORTED(&rs, path, 2, "line too long (257 characters, at most 199)");
    CHECK(p.s.depth == 7);
    CHECK_STR(p.s.journal_dir, ".");

    /* a line of exactly 199 characters is fine */
    len = (size_t)snprintf(text, sizeof text, "[journal]\ndir = /");
    memset(text + len, 'y', 192);
    len += 192;
    snprintf(text + len, sizeof text - len, "\n");
    CHECK(load_text("e.ini", text, &p, &rs, path, sizeof path) == 0);
    CHECK(strlen(p.s.journal_dir) == 193);

    {
        static const char nul[] = "[memory]\nmode = off\0 tail\nnear_miss = 1%\n";
        char dir[256];
        FILE *f;

        new_dir(dir, sizeof dir, "files");
        snprintf(path, sizeof path, "%s/nul.ini", dir);
        f = fopen(path, "w");
        fwrite(nul, 1, sizeof nul - 1, f);
        fclose(f);
        memset(&rs, 0, sizeof rs);
        CHECK(gg_policy_load(path, &p, collect, &rs) == 1);
        CHECK_REPORTED(&rs, path, 2, "line contains a NUL byte");
        CHECK(p.s.mode == GG_MODE_AUTO);
        CHECK(p.s.near_miss.percent == 1.0);
    }

    load_text("e.ini", "[gpu]\nmatch = A*, , B*\n", &p, &rs, path, sizeof path);
    CHECK_REPORTED(&rs, path, 2, "[gpu] match = 'A*, , B*': empty glob");
    load_text("e.ini", "[gpu]\nmatch =\n", &p, &rs, path, sizeof path);
    CHECK_REPORTED(&rs, path, 2, "[gpu] match = '': empty glob");
    load_text("e.ini", "[gpu]\nmatch = A* ; = B\n", &p, &rs, path, sizeof path);
    CHECK(rs.n == 0);
    CHECK_STR(p.s.match, "A*");
}

static void test_missing_and_unreadable(void)
{
    char dir[256], path[GG_PATH_MAX];
    struct gg_policy p;
    struct reports rs;

    new_dir(dir, sizeof dir, "gone");
    snprintf(path, sizeof path, "%s/nothing.ini", dir);
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_load(path, &p, collect, &rs) == 1);
    CHECK_REPORTED(&rs, path, 0, "cannot open policy file: No such file or directory");
    CHECK(p.broken);
    CHECK(p.s.mode == GG_MODE_AUTO); /* the defaults, and the file named */
    CHECK_STR(p.file, path);

    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_load(dir, &p, collect, &rs) == 1);
    CHECK_REPORTED(&rs, dir, 0, "is a directory, not a policy file");

    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_load("", &p, collect, &rs) == 1);
    CHECK(p.broken);

    if (geteuid() != 0) {
        put(path, sizeof path, dir, "secret.ini", "[memory]\nmode = off\n");
        chmod(path, 0);
        memset(&rs, 0, sizeof rs);
        CHECK(gg_policy_load(path, &p, collect, &rs) == 1);
        CHECK_REPORTED(&rs, path, 0, "cannot open policy file: Permission denied");
        CHECK(p.s.mode == GG_MODE_ENFORCE);
    } else {
        printf("  (unreadable file: skipped as root)\n");
    }

    /* a NULL callback is allowed: problems are still counted */
    CHECK(gg_policy_load("/nonexistent/x.ini", &p, NULL, NULL) == 1);
    CHECK(p.broken);
}

/* ------------------------------------------------------------------------ */
/* Selection                                                                 */

static void test_matches(void)
{
    CHECK(gg_globs_match("NVIDIA GeForce RTX 3090*", "NVIDIA GeForce RTX 3090"));
    CHECK(gg_globs_match("NVIDIA GeForce RTX 3090*", "NVIDIA GeForce RTX 3090 Ti"));
    CHECK(!gg_globs_match("NVIDIA GeForce RTX 3090*", "nvidia geforce rtx 3090"));
    CHECK(gg_globs_match("  A , NVIDIA L4  ,B", "NVIDIA L4"));
    CHECK(!gg_globs_match("NVIDIA L4", "NVIDIA L40S"));
    CHECK(gg_globs_match("NVIDIA H100 80GB HBM3*, NVIDIA H100 PCIe*", "NVIDIA H100 PCIe"));
    CHECK(gg_globs_match("Tesla T?", "Tesla T4"));
    CHECK(gg_globs_match("NVIDIA A100-[SP]*-40GB*", "NVIDIA A100-PCIE-40GB"));
    CHECK(!gg_globs_match("", "anything"));
    CHECK(!gg_globs_match(",,", "anything"));
    CHECK(!gg_globs_match(NULL, "anything"));
    CHECK(!gg_globs_match("*", NULL));
    CHECK(gg_globs_match("*", ""));
}

struct seen {
    int n;
    char names[16][64];
};

static int remember(void *arg, const char *path, const char *name)
{
    struct seen *s = arg;

    (void)path;
    if (s->n < 16)
        snprintf(s->names[s->n], sizeof s->names[0], "%s", name);
    s->n++;
    return strcmp(name, "stop.ini") == 0 ? 7 : 0;
}

static void test_dir_each(void)
{
    char dir[256], path[GG_PATH_MAX];
    struct seen s;

    new_dir(dir, sizeof dir, "each");
    put(path, sizeof path, dir, "b.ini", "");
    put(path, sizeof path, dir, "a.ini", "");
    put(path, sizeof path, dir, "B.ini", "");      /* 'B' < 'a' in strcmp */
    put(path, sizeof path, dir, "_x.ini", "");
    put(path, sizeof path, dir, ".hidden.ini", "");
    put(path, sizeof path, dir, "a.ini~", "");
    put(path, sizeof path, dir, "notes.txt", "");
    put(path, sizeof path, dir, "upper.INI", "");
    snprintf(path, sizeof path, "%s/sub.ini", dir);
    mkdir(path, 0700);
    memset(&s, 0, sizeof s);
    CHECK(gg_policy_dir_each(dir, remember, &s, NULL) == 0);
    CHECK(s.n == 4);
    CHECK_STR(s.names[0], "B.ini");
    CHECK_STR(s.names[1], "_x.ini");
    CHECK_STR(s.names[2], "a.ini");
    CHECK_STR(s.names[3], "b.ini");

    put(path, sizeof path, dir, "c.ini", "");
    put(path, sizeof path, dir, "stop.ini", "");
    put(path, sizeof path, dir, "z.ini", "");
    memset(&s, 0, sizeof s);
    CHECK(gg_policy_dir_each(dir, remember, &s, NULL) == 7);
    CHECK(s.n == 6);

    snprintf(path, sizeof path, "%s/none", dir);
    errno = 0;
    CHECK(gg_policy_dir_each(path, remember, &s, NULL) == -1);
    CHECK(errno == ENOENT);
}

static void test_select_order(void)
{
    char dir[256], path[GG_PATH_MAX], want[GG_PATH_MAX];
    struct gg_policy p;
    struct reports rs;

    new_dir(dir, sizeof dir, "order");
    put(path, sizeof path, dir, "b-generic.ini", "[gpu]\nmatch = NVIDIA X*\n[memory]\nmode = observe\n");
    put(path, sizeof path, dir, "a-special.ini", "[gpu]\nmatch = NVIDIA X 1*\n[memory]\nmode = off\n");
    put(path, sizeof path, dir, "c-other.ini", "[gpu]\nmatch = Tesla T4, NVIDIA Y\n");
    put(path, sizeof path, dir, "default.ini", "[gpu]\nmatch = *\n[memory]\nheadroom = 10%\n");
    put(path, sizeof path, dir, ".old.ini", "[gpu]\nmatch = *\n");

    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_select(dir, (const char *[]){"NVIDIA X 1"}, 1, &p, collect, &rs) == 0);
    snprintf(want, sizeof want, "%s/a-special.ini", dir);
    CHECK_STR(p.file, want);
    CHECK(p.s.mode == GG_MODE_OFF);

    CHECK(gg_policy_select(dir, (const char *[]){"NVIDIA X 2"}, 1, &p, collect, &rs) == 0);
    snprintf(want, sizeof want, "%s/b-generic.ini", dir);
    CHECK_STR(p.file, want);
    CHECK(p.s.mode == GG_MODE_OBSERVE);

    CHECK(gg_policy_select(dir, (const char *[]){"NVIDIA Y"}, 1, &p, collect, &rs) == 0);
    snprintf(want, sizeof want, "%s/c-other.ini", dir);
    CHECK_STR(p.file, want);

    /* default.ini is not tried in order, even though its match fits */
    CHECK(gg_policy_select(dir, (const char *[]){"Something Else"}, 1, &p, collect, &rs) == 0);
    snprintf(want, sizeof want, "%s/default.ini", dir);
    CHECK_STR(p.file, want);
    CHECK(p.s.headroom.is_percent && p.s.headroom.percent == 10.0);

    /* a trailing slash on the directory */
    snprintf(path, sizeof path, "%s/", dir);
    CHECK(gg_policy_select(path, (const char *[]){"NVIDIA X 2"}, 1, &p, collect, &rs) == 0);
    snprintf(want, sizeof want, "%s/b-generic.ini", dir);
    CHECK_STR(p.file, want);
    CHECK(rs.n == 0);
    dump(&rs);
}

static void test_select_fallbacks(void)
{
    char dir[256], path[GG_PATH_MAX], file[GG_PATH_MAX];
    struct gg_policy p;
    struct reports rs;

    /* no default.ini: the built-in defaults, no problem */
    new_dir(dir, sizeof dir, "nodefault");
    put(path, sizeof path, dir, "x.ini", "[gpu]\nmatch = X\n[memory]\nmode = off\n");
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_select(dir, (const char *[]){"Y"}, 1, &p, collect, &rs) == 0);
    CHECK_STR(p.file, "");
    CHECK(p.s.mode == GG_MODE_AUTO);
    CHECK(!p.broken);

    /* an empty directory */
    new_dir(dir, sizeof dir, "empty");
    CHECK(gg_policy_select(dir, (const char *[]){"Y"}, 1, &p, collect, &rs) == 0);
    CHECK_STR(p.file, "");

    /* no location at all */
    CHECK(gg_policy_select(NULL, (const char *[]){"Y"}, 1, &p, collect, &rs) == 0);
    CHECK(gg_policy_select("", (const char *[]){"Y"}, 1, &p, collect, &rs) == 0);
    CHECK_STR(p.file, "");
    CHECK(rs.n == 0);

    /* a file is used for every device, whatever its match says */
    put(file, sizeof file, dir, "only.ini", "[gpu]\nmatch = Z\n[memory]\nmode = observe\n");
    CHECK(gg_policy_select(file, (const char *[]){"Y"}, 1, &p, collect, &rs) == 0);
    CHECK_STR(p.file, file);
    CHECK(p.s.mode == GG_MODE_OBSERVE);

    /* a file given directly needs no match */
    put(file, sizeof file, dir, "plain.ini", "[memory]\nmode = off\n");
    CHECK(gg_policy_select(file, (const char *[]){"Y"}, 1, &p, collect, &rs) == 0);
    CHECK(p.s.mode == GG_MODE_OFF);

    /* a location that does not exist */
    snprintf(path, sizeof path, "%s/missing", dir);
    CHECK(gg_policy_select(path, (const char *[]){"Y"}, 1, &p, collect, &rs) == 1);
    CHECK_REPORTED(&rs, path, 0, "cannot open policy file or directory: No such file");
    CHECK(p.broken);
    CHECK_STR(p.file, "");
    CHECK(p.s.mode == GG_MODE_AUTO);
}

static void test_select_problems(void)
{
    char dir[256], path[GG_PATH_MAX], nomatch[GG_PATH_MAX], chosen[GG_PATH_MAX];
    char dangling[GG_PATH_MAX];
    struct gg_policy p;
    struct reports rs;

    new_dir(dir, sizeof dir, "problems");
    put(path, sizeof path, dir, "a.ini", "[gpu]\nmatch = A\n[memory]\nmode = bogus\n");
    put(nomatch, sizeof nomatch, dir, "m.ini", "[gpu]\nmtach = B\n");
    put(chosen, sizeof chosen, dir, "z.ini", "[gpu]\nmatch = Z\n[trainer]\nbatch_size = x\n");
    put(path, sizeof path, dir, "default.ini", "[memory]\nmode = observe\n");

    /* A matches first: a.ini's own problem is reported, nothing after it */
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_select(dir, (const char *[]){"A"}, 1, &p, collect, &rs) == 1);
    snprintf(path, sizeof path, "%s/a.ini", dir);
    CHECK_REPORTED(&rs, path, 4, "[memory] mode = 'bogus': bad value");
    CHECK(p.broken);

    /* Z: m.ini was tried on the way and has no match; z.ini's own problem */
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_select(dir, (const char *[]){"Z"}, 1, &p, collect, &rs) == 2);
    CHECK_REPORTED(&rs, nomatch, 0, "no [gpu] match");
    CHECK_REPORTED(&rs, chosen, 4, "[trainer] batch_size = 'x': not an integer");
    CHECK(!reported(&rs, path, 4, "")); /* a.ini's problem is gpuguard-check's business */
    CHECK(p.broken);

    /* nothing matches: default.ini, with the no-match file reported */
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_select(dir, (const char *[]){"Q"}, 1, &p, collect, &rs) == 1);
    snprintf(path, sizeof path, "%s/default.ini", dir);
    CHECK_STR(p.file, path);
    CHECK(p.s.mode == GG_MODE_OBSERVE);
    CHECK(p.broken);

    /* an unreadable file on the way is reported once, not as "no match" too */
    snprintf(dangling, sizeof dangling, "%s/b.ini", dir);
    CHECK(symlink("/nonexistent/policy.ini", dangling) == 0);
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_select(dir, (const char *[]){"Q"}, 1, &p, collect, &rs) == 2);
    CHECK_REPORTED(&rs, dangling, 0, "cannot open policy file: No such file or directory");
    CHECK(!reported(&rs, dangling, 0, "no [gpu] match"));
    unlink(dangling);

    /* a dangling default.ini is reported, not taken for "no default.ini" */
    unlink(path);
    CHECK(symlink("/nonexistent/default.ini", path) == 0);
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_select(dir, (const char *[]){"Q"}, 1, &p, collect, &rs) == 2);
    CHECK_REPORTED(&rs, path, 0, "cannot open policy file");

    /* gg_policy_check_member on its own */
    gg_policy_defaults(&p);
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_check_member("dir/x.ini", &p, collect, &rs) == 1);
    CHECK_REPORTED(&rs, "dir/x.ini", 0, "no [gpu] match");
    CHECK(gg_policy_check_member("dir/default.ini", &p, collect, &rs) == 0);
    snprintf(p.s.match, sizeof p.s.match, "X*");
    CHECK(gg_policy_check_member("dir/x.ini", &p, collect, &rs) == 0);
}

/* ------------------------------------------------------------------------ */
/* Environment                                                               */

/* Set (or, for NULL, unset) the variables a policy takes overrides from. */
static void set_env(const char *mode, const char *headroom, const char *dir, const char *sig)
{
    const char *names[] = {"GPUGUARD_MODE", "GPUGUARD_HEADROOM", "GPUGUARD_JOURNAL_DIR",
                           "GPUGUARD_SIGNAL"};
    const char *values[] = {mode, headroom, dir, sig};
    for (int i = 0; i < 4; i++) {
        if (values[i])
            setenv(names[i], values[i], 1);
        else
            unsetenv(names[i]);
    }
}

static void test_env_overrides(void)
{
    struct gg_policy p;
    struct reports rs;

    gg_policy_defaults(&p);
    p.line[GG_SET_headroom] = 9;
    memset(&rs, 0, sizeof rs);
    set_env("observe", "2 GiB", "/tmp/j", "SIGUSR1");
    CHECK(gg_policy_apply_env(&p, collect, &rs) == 0);
    CHECK(p.s.mode == GG_MODE_OBSERVE);
    CHECK_EQ_U64(p.s.headroom.bytes, 2 * GiB);
    CHECK(p.from_env[GG_SET_headroom]);
    CHECK(p.line[GG_SET_headroom] == 0);
    CHECK_STR(p.s.journal_dir, "/tmp/j");
    CHECK(p.s.signal == SIGUSR1);
    CHECK(!p.broken);

    /* unset and empty change nothing */
    set_env(NULL, NULL, NULL, NULL);
    CHECK(gg_policy_apply_env(&p, collect, &rs) == 0);
    set_env("", "", "", "");
    CHECK(gg_policy_apply_env(&p, collect, &rs) == 0);
    CHECK(p.s.mode == GG_MODE_OBSERVE);
    CHECK(p.s.signal == SIGUSR1);
    CHECK(rs.n == 0);

    set_env(" off ", "15%", NULL, "none");
    CHECK(gg_policy_apply_env(&p, collect, &rs) == 0);
    CHECK(p.s.mode == GG_MODE_OFF);
    CHECK(p.s.headroom.is_percent && p.s.headroom.percent == 15.0);
    CHECK(p.s.signal == 0);
    set_env("ENFORCE", NULL, NULL, "usr2");
    CHECK(gg_policy_apply_env(&p, collect, &rs) == 0);
    CHECK(p.s.mode == GG_MODE_ENFORCE);
    CHECK(p.s.signal == SIGUSR2);
    set_env(NULL, NULL, NULL, NULL);
}

static void test_env_bad_values(void)
{
    struct gg_policy p;
    struct reports rs;
    gg_policy_defaults(&p);
    memset(&rs, 0, sizeof rs);
    set_env("loud", "-1 GiB", NULL, "SIGFOO");
    CHECK(gg_policy_apply_env(&p, collect, &rs) == 3);
    CHECK(p.broken);
    CHECK_REPORTED(&rs, "GPUGUARD_MODE", 0,
                   "'loud': bad value (expected auto, enforce, observe or off)");
    CHECK_REPORTED(&rs, "GPUGUARD_HEADROOM", 0, "'-1 GiB': negative size");
    CHECK_REPORTED(&rs, "GPUGUARD_SIGNAL", 0, "'SIGFOO': bad value (expected a signal name");
    /* the policy keeps what it had */
    CHECK(p.s.mode == GG_MODE_AUTO);
    CHECK_EQ_U64(p.s.headroom.bytes, 0);
    CHECK(!p.from_env[GG_SET_headroom]);
    CHECK(p.s.signal == SIGUSR2);
    /* what the variables said, for the listing (line 0: the environment's) */
    CHECK_STR(p.invalid[GG_SET_mode], "'loud'");
    CHECK_STR(p.invalid[GG_SET_headroom], "'-1 GiB'");
    CHECK(p.line[GG_SET_mode] == 0);

    set_env(NULL, "200%", NULL, "9");
    memset(&rs, 0, sizeof rs);
    CHECK(gg_policy_apply_env(&p, collect, &rs) == 2);
    CHECK_REPORTED(&rs, "GPUGUARD_HEADROOM", 0, "'200%': percentage over 100");
    CHECK_REPORTED(&rs, "GPUGUARD_SIGNAL", 0, "'9': not a signal for advice");

    {
        char longdir[GG_PATH_MAX + 10];
        memset(longdir, 'd', sizeof longdir - 1);
        longdir[sizeof longdir - 1] = '\0';
        set_env(NULL, "1 GiB B", longdir, NULL);
        memset(&rs, 0, sizeof rs);
        CHECK(gg_policy_apply_env(&p, collect, &rs) == 2);
        CHECK_REPORTED(&rs, "GPUGUARD_HEADROOM", 0, "malformed size: unknown unit");
        CHECK_REPORTED(&rs, "GPUGUARD_JOURNAL_DIR", 0, "too long");
        CHECK_STR(p.s.journal_dir, ".");
    }
    set_env(NULL, NULL, NULL, NULL);
}

/* ------------------------------------------------------------------------ */
/* Limits                                                                    */

static void test_limit(void)
{
    struct gg_policy p;
    struct reports rs;
    char path[GG_PATH_MAX];

    gg_policy_defaults(&p);
    memset(&rs, 0, sizeof rs);
    CHECK_EQ_U64(gg_policy_limit(&p, 24 * GiB, collect, &rs), 24 * GiB - 2576980377ULL); /* 10% */
    p.s.headroom = (struct gg_size){ 0, 0, false };
    CHECK_EQ_U64(gg_policy_limit(&p, 24 * GiB, collect, &rs), 24 * GiB); /* headroom 0 */

    p.s.headroom = (struct gg_size){ 0, 10.0, true };
    CHECK_EQ_U64(gg_policy_limit(&p, 24 * GiB, collect, &rs), 24 * GiB - 2576980377ULL);
    CHECK_EQ_U64(gg_policy_limit(&p, 80 * GiB, collect, &rs), 72 * GiB);
    p.s.headroom = (struct gg_size){ 0, 100.0, true };
    CHECK_EQ_U64(gg_policy_limit(&p, 24 * GiB, collect, &rs), 0);
    p.s.headroom = (struct gg_size){ 3 * GiB / 2, 0, false };
    CHECK_EQ_U64(gg_policy_limit(&p, 24 * GiB, collect, &rs), 45 * GiB / 2);
    p.s.headroom = (struct gg_size){ 24 * GiB, 0, false };
    CHECK_EQ_U64(gg_policy_limit(&p, 24 * GiB, collect, &rs), 0); /* equal: not larger */
    CHECK(rs.n == 0);

    /* larger than the device: reported at the headroom line, limit = total */
    load_text("big.ini", "[gpu]\nmatch = X\n\n[memory]\nheadroom = 30 GiB\n", &p, &rs, path,
              sizeof path);
    CHECK(rs.n == 0);
    CHECK(p.line[GG_SET_headroom] == 5);
    CHECK_EQ_U64(gg_policy_limit(&p, 24 * GiB, collect, &rs), 24 * GiB);
    CHECK(rs.n == 1);
    CHECK_REPORTED(&rs, path, 5, "headroom 30.00 GiB (32212254720 bytes) is larger than the "
                                 "device (24.00 GiB, 25769803776 bytes)");
    /* the same headroom fits a bigger device */
    memset(&rs, 0, sizeof rs);
    CHECK_EQ_U64(gg_policy_limit(&p, 80 * GiB, collect, &rs), 50 * GiB);
    CHECK(rs.n == 0);

    /* from GPUGUARD_HEADROOM: reported under the variable's name */
    {
        set_env(NULL, "100 GiB", NULL, NULL);
        CHECK(gg_policy_apply_env(&p, collect, &rs) == 0);
        set_env(NULL, NULL, NULL, NULL);
        memset(&rs, 0, sizeof rs);
        CHECK_EQ_U64(gg_policy_limit(&p, 80 * GiB, collect, &rs), 80 * GiB);
        CHECK_REPORTED(&rs, "GPUGUARD_HEADROOM", 0, "is larger than the device");
    }
    /* no callback: still the whole device */
    CHECK_EQ_U64(gg_policy_limit(&p, 8 * GiB, NULL, NULL), 8 * GiB);
}

static void test_near_miss(void)
{
    struct gg_policy p;

    gg_policy_defaults(&p);
    CHECK_EQ_U64(gg_policy_near_miss(&p, 80 * GiB), 4 * GiB); /* 5% */
    CHECK_EQ_U64(gg_policy_near_miss(&p, 1000), 50);
    p.s.near_miss = (struct gg_size){ 512 * MiB, 0, false };
    CHECK_EQ_U64(gg_policy_near_miss(&p, 24 * GiB), 512 * MiB);
    CHECK_EQ_U64(gg_policy_near_miss(&p, 100 * MiB), 100 * MiB); /* never more than total */
    p.s.near_miss = (struct gg_size){ 0, 0.0, true };
    CHECK_EQ_U64(gg_policy_near_miss(&p, 24 * GiB), 0);
}

/* ------------------------------------------------------------------------ */
/* The shipped policies (when the test runs from the source tree)            */

static const char *find_policy_dir(void)
{
    static const char *const candidates[] = { "policy", "../policy", "../../policy",
                                              "../../../policy" };
    struct stat st;

    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        char probe[256];
        snprintf(probe, sizeof probe, "%s/default.ini", candidates[i]);
        if (stat(probe, &st) == 0)
            return candidates[i];
    }
    return NULL;
}

static void test_shipped_policies(void)
{
    static const struct {
        const char *name, *file;
    } cases[] = {
        { "NVIDIA GeForce RTX 3060", "rtx-3060-12gb.ini" },
        { "NVIDIA GeForce RTX 3060 Ti", "default.ini" },
        { "NVIDIA GeForce RTX 3060 Laptop GPU", "default.ini" },
        { "NVIDIA GeForce RTX 3090", "rtx-3090.ini" },
        { "NVIDIA GeForce RTX 3090 Ti", "rtx-3090.ini" },
        { "NVIDIA GeForce RTX 4090", "rtx-4090.ini" },
        { "NVIDIA GeForce RTX 4090 D", "rtx-4090.ini" },
        { "NVIDIA GeForce RTX 4090 Laptop GPU", "default.ini" },
        { "NVIDIA GeForce RTX 5070", "default.ini" },
        { "NVIDIA GeForce RTX 5070 Ti", "rtx-5070-ti.ini" },
        { "NVIDIA GeForce RTX 5070 Ti Laptop GPU", "default.ini" },
        { "NVIDIA GeForce RTX 5090", "rtx-5090.ini" },
        { "NVIDIA GeForce RTX 5090 D", "rtx-5090.ini" },
        { "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "rtx-pro-6000.ini" },
        { "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "rtx-pro-6000.ini" },
        { "NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000.ini" },
        { "NVIDIA RTX 6000 Ada Generation", "default.ini" },
        { "NVIDIA A100-SXM4-40GB", "a100-40gb.ini" },
        { "NVIDIA A100-PCIE-40GB", "a100-40gb.ini" },
        { "NVIDIA A100-SXM4-80GB", "a100-80gb.ini" },
        { "NVIDIA A100 80GB PCIe", "a100-80gb.ini" },
        { "NVIDIA H100 80GB HBM3", "h100-80gb.ini" },
        { "NVIDIA H100 PCIe", "h100-80gb.ini" },
        { "NVIDIA H100 NVL", "h100-80gb.ini" },
        { "NVIDIA H200", "h200.ini" },
        { "NVIDIA H200 NVL", "h200.ini" },
        { "NVIDIA L4", "l4.ini" },
        { "NVIDIA L40", "default.ini" },
        { "NVIDIA L40S", "default.ini" },
        { "Tesla T4", "t4.ini" },
        { "Tesla V100-SXM2-16GB", "default.ini" },
    };
    const char *dir = find_policy_dir();

    if (!dir) {
        printf("  (policy/ not found from here: skipped)\n");
        return;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct gg_policy p;
        struct reports rs;
        const char *base;

        memset(&rs, 0, sizeof rs);
        CHECK(gg_policy_select(dir, (const char *[]){cases[i].name}, 1, &p, collect, &rs) == 0);
        dump(&rs);
        base = strrchr(p.file, '/');
        base = base ? base + 1 : p.file;
        if (strcmp(base, cases[i].file) != 0) {
            unit_checks_failed++;
            printf("  %s got %s, expected %s\n", cases[i].name, p.file, cases[i].file);
        }
        CHECK(!p.broken);
        CHECK(p.s.headroom.is_percent && p.s.headroom.percent == 10.0);
    }
}

int main(void)
{
    RUN(test_size_units);
    RUN(test_size_percent);
    RUN(test_size_malformed);
    RUN(test_size_bytes);
    RUN(test_defaults);
    RUN(test_every_key);
    RUN(test_lenient_forms);
    RUN(test_enum_values);
    RUN(test_stacks_values);
    RUN(test_signal_values);
    RUN(test_names);
    RUN(test_problems_have_lines);
    RUN(test_exact_messages);
    RUN(test_under_a_malformed_header);
    RUN(test_edge_lines);
    RUN(test_missing_and_unreadable);
    RUN(test_matches);
    RUN(test_dir_each);
    RUN(test_select_order);
    RUN(test_select_fallbacks);
    RUN(test_select_problems);
    RUN(test_env_overrides);
    RUN(test_env_bad_values);
    RUN(test_limit);
    RUN(test_near_miss);
    RUN(test_shipped_policies);
    tmp_cleanup();
    return unit_done();
}
