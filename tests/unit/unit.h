/* unit.h - the smallest test harness that does the job.
 *
 *   static void test_parse(void) { CHECK(x == 1); CHECK_EQ_U64(a, b); CHECK_STR(s, "x"); }
 *   int main(void) { RUN(test_parse); return unit_done(); }
 *
 * Each RUN is one test; it fails if any CHECK in it fails. The last line is
 * "N passed, N failed", which tests/run.py adds up.
 */
#ifndef GG_UNIT_H
#define GG_UNIT_H

#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int unit_passed, unit_failed, unit_checks_failed;

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            unit_checks_failed++;                                                \
            printf("  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);    \
        }                                                                        \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                       \
    do {                                                                         \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b); \
        if (a_ != b_) {                                                          \
            unit_checks_failed++;                                                \
            printf("  %s:%d: %s == %s failed: %llu != %llu\n", __FILE__, __LINE__, \
                   #a, #b, a_, b_);                                              \
        }                                                                        \
    } while (0)

#define CHECK_STR(a, b)                                                          \
    do {                                                                         \
        const char *a_ = (a), *b_ = (b);                                         \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                 \
            unit_checks_failed++;                                                \
            printf("  %s:%d: %s == \"%s\" failed: got \"%s\"\n", __FILE__,        \
                   __LINE__, #a, b_ ? b_ : "(null)", a_ ? a_ : "(null)");        \
        }                                                                        \
    } while (0)

#define RUN(fn)                                                                  \
    do {                                                                         \
        int before_ = unit_checks_failed;                                        \
        fn();                                                                    \
        if (unit_checks_failed == before_) {                                     \
            unit_passed++;                                                       \
            printf("ok   %s\n", #fn);                                            \
        } else {                                                                 \
            unit_failed++;                                                       \
            printf("FAIL %s\n", #fn);                                            \
        }                                                                        \
        fflush(stdout);                                                          \
    } while (0)

/* The file at path into buf (at most cap - 1 bytes, NUL-terminated): its
 * length; an unreadable file or no path reads as empty. */
static inline size_t unit_slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = path ? fopen(path, "r") : NULL;
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return n;
}

/* A temporary directory, as mkdtemp(templ) makes it; unit_done removes it
 * with all it holds, or keeps it and names it when a test failed. */
static char *unit_dirs[8];
static int unit_ndirs;

static inline char *unit_tmpdir(char *templ)
{
    char *dir = mkdtemp(templ);
    if (dir && unit_ndirs < (int)(sizeof unit_dirs / sizeof *unit_dirs))
        unit_dirs[unit_ndirs++] = dir;
    return dir;
}

static inline int unit_remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static inline int unit_done(void)
{
    for (int i = 0; i < unit_ndirs; i++) {
        if (unit_failed)
            printf("kept %s\n", unit_dirs[i]);
        else
            nftw(unit_dirs[i], unit_remove, 16, FTW_DEPTH | FTW_PHYS);
    }
    printf("%d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed ? 1 : 0;
}

#endif /* GG_UNIT_H */
