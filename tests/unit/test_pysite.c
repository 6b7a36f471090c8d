/* test_pysite.c - pysite.c: GPUGUARD_TORCH=1 puts gpuguard's site directory
 * (its sitecustomize and the gpuguard package, nothing else) first on
 * PYTHONPATH, once, found beside the library; only one that no other user
 * could have written; the interpreter's -I, -E and -S read as python reads
 * them; in a program that is not Python's own (this test) nothing changes. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pysite.h"
#include "unit.h"

static void test_pythonpath(void)
{
    char out[256];
    CHECK(gg_pysite_pythonpath(NULL, "/p/site", out, sizeof out));
    CHECK_STR(out, "/p/site");
    CHECK(gg_pysite_pythonpath("", "/p/site", out, sizeof out));
    CHECK_STR(out, "/p/site");
    CHECK(gg_pysite_pythonpath("/mine:/lib", "/p/site", out, sizeof out));
    CHECK_STR(out, "/p/site:/mine:/lib");
    /* the site is there already (a user's, a parent's): nothing changes */
    CHECK(!gg_pysite_pythonpath("/x:/p/site", "/p/site", out, sizeof out));
    /* a prefix of an entry is not the entry */
    CHECK(gg_pysite_pythonpath("/p/site2", "/p/site", out, sizeof out));
    /* no room: nothing */
    CHECK(!gg_pysite_pythonpath("/mine", "/p/site", out, 8));
}

static unsigned opts(const char *a, const char *b, const char *c)
{
    char *argv[] = {"python3", (char *)a, (char *)b, (char *)c, NULL};
    int argc = 1 + (a != NULL) + (b != NULL) + (c != NULL);
    return gg_pysite_options(argc, argv);
}

static void test_options_as_python_reads_them(void)
{
    CHECK(opts(NULL, NULL, NULL) == 0);
    CHECK(opts("train.py", NULL, NULL) == 0);
    CHECK(opts("-I", "train.py", NULL) == (GG_PY_ISOLATED | GG_PY_NO_ENV));
    CHECK(opts("-E", "-c", "pass") == GG_PY_NO_ENV);
    CHECK(opts("-sEu", "train.py", NULL) == GG_PY_NO_ENV); /* a cluster */
    CHECK(opts("-S", "-m", "x") == GG_PY_NO_SITE);
    CHECK(opts("-bIB", NULL, NULL) == (GG_PY_ISOLATED | GG_PY_NO_ENV));
    /* what follows -c, -m or the script is theirs, not python's */
    CHECK(opts("-c", "-I", NULL) == 0);
    CHECK(opts("-cI", NULL, NULL) == 0);
    CHECK(opts("-m", "x", "-E") == 0);
    CHECK(opts("train.py", "-E", NULL) == 0);
    CHECK(opts("-", "-E", NULL) == 0);
    CHECK(opts("--", "-E", NULL) == 0);
    /* -W and -X take an argument: joined, or the next word */
    CHECK(opts("-W", "-E", NULL) == 0);
    CHECK(opts("-Werror", "-E", NULL) == GG_PY_NO_ENV);
    CHECK(opts("-Xdev", "-I", NULL) == (GG_PY_ISOLATED | GG_PY_NO_ENV));
    CHECK(opts("-X", "dev", "-E") == GG_PY_NO_ENV);
    CHECK(opts("--check-hash-based-pycs", "always", "-E") == GG_PY_NO_ENV);
}

static char root[] = "/tmp/gg_pysite_XXXXXX";

static void mkpath(const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *s = p + strlen(root) + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    FILE *f = fopen(p, "w");
    if (f)
        fclose(f);
}

static void at(char *out, size_t cap, const char *rel)
{
    char real[PATH_MAX];
    if (!realpath(root, real))
        real[0] = '\0';
    snprintf(out, cap, "%s%s%s", real, rel[0] ? "/" : "", rel);
}

static void test_found_beside_the_library(void)
{
    char lib[PATH_MAX], out[PATH_MAX], want[PATH_MAX * 2];
    CHECK(unit_tmpdir(root) != NULL);
    chmod(root, 0755);
    snprintf(lib, sizeof lib, "%s/lib", root);
    mkdir(lib, 0755);
    CHECK(!gg_pysite_find(lib, out, sizeof out)); /* nothing installed */
    mkpath("share/gpuguard/site/sitecustomize.py");
    CHECK(!gg_pysite_find(lib, out, sizeof out)); /* a sitecustomize without the package */
    mkpath("share/gpuguard/site/gpuguard/__init__.py");
    CHECK(gg_pysite_find(lib, out, sizeof out));
    at(want, sizeof want, "share/gpuguard/site");
    CHECK_STR(out, want);
    /* the source tree: build/ and build/san/ beside tools/site */
    char build[PATH_MAX];
    snprintf(build, sizeof build, "%s/build/san", root);
    mkpath("build/san/x");
    mkpath("tools/site/sitecustomize.py");
    mkpath("tools/site/gpuguard/__init__.py");
    CHECK(gg_pysite_find(build, out, sizeof out));
    at(want, sizeof want, "tools/site");
    CHECK_STR(out, want);
    CHECK(!gg_pysite_find(build, out, 4)); /* no room */
}

/* Who could have written the site directory: it, what it holds (through
 * the source tree's links too) and the directories above it up to the one
 * that holds the library. Runs after test_found_beside_the_library. */
static void test_only_a_directory_no_one_else_could_write(void)
{
    char site[PATH_MAX], lib[PATH_MAX], why[PATH_MAX + 256], p[PATH_MAX + 64];
    at(site, sizeof site, "share/gpuguard/site");
    at(lib, sizeof lib, "lib");
    CHECK(gg_pysite_trusted(site, lib, why, sizeof why));
    /* writable by others: the directory, a file in it, the package, one above */
    static const char *const parts[] = {"share/gpuguard/site", "share/gpuguard/site/sitecustomize.py",
                                        "share/gpuguard/site/gpuguard",
                                        "share/gpuguard/site/gpuguard/__init__.py",
                                        "share/gpuguard", "share"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        struct stat st;
        at(p, sizeof p, parts[i]);
        CHECK(stat(p, &st) == 0);
        chmod(p, (st.st_mode & 0777) | 002);
        CHECK(!gg_pysite_trusted(site, lib, why, sizeof why));
        CHECK(strstr(why, p) != NULL && strstr(why, "writable by every user") != NULL);
        /* a group another user may be in (users, 100) */
        CHECK(chown(p, (uid_t)-1, 100) == 0 || geteuid() != 0);
        chmod(p, (st.st_mode & 0777) | 020);
        CHECK(!gg_pysite_trusted(site, lib, why, sizeof why));
        CHECK(strstr(why, "writable by its group") != NULL);
        CHECK(chown(p, (uid_t)-1, st.st_gid) == 0 || geteuid() != 0);
        chmod(p, st.st_mode & 0777);
        CHECK(gg_pysite_trusted(site, lib, why, sizeof why));
    }
    /* group-writable in the user's own private group (a umask of 002 under
     * Debian's and Ubuntu's user private groups): no one else can write */
    char passwd[4096];
    unit_slurp("/etc/passwd", passwd, sizeof passwd);
    if (geteuid() == 0 && strstr(passwd, "root:x:0:0:") == passwd) {
        char group[4096];
        unit_slurp("/etc/group", group, sizeof group);
        chmod(site, 0775);
        CHECK(gg_pysite_trusted(site, lib, why, sizeof why) ==
              (strstr(group, "root:x:0:\n") == group));
        chmod(site, 0755);
    }
    /* an ancestor that is sticky and open to all (/tmp's kind) is fine; the
     * site directory itself is not (anyone could add a module to it) */
    at(p, sizeof p, "share");
    chmod(p, 01777);
    CHECK(gg_pysite_trusted(site, lib, why, sizeof why));
    chmod(p, 0755);
    chmod(site, 01777);
    CHECK(!gg_pysite_trusted(site, lib, why, sizeof why));
    chmod(site, 0755);
    /* another user's file in it: a sitecustomize planted by nobody */
    if (geteuid() == 0) {
        at(p, sizeof p, "share/gpuguard/site/gpuguard/planted.py");
        mkpath("share/gpuguard/site/gpuguard/planted.py");
        CHECK(chown(p, 65534, 65534) == 0);
        CHECK(!gg_pysite_trusted(site, lib, why, sizeof why));
        CHECK(strstr(why, "belongs to uid 65534") != NULL);
        unlink(p);
    }
    /* a link inside the package is not followed: refused */
    at(p, sizeof p, "share/gpuguard/site/gpuguard/link.py");
    CHECK(symlink("/etc/passwd", p) == 0);
    CHECK(!gg_pysite_trusted(site, lib, why, sizeof why));
    CHECK(strstr(why, "is a symbolic link") != NULL);
    unlink(p);
    /* the source tree's site: links to tools/python, checked there too */
    char tools[PATH_MAX], build[PATH_MAX];
    mkpath("tools/python/gpuguard/__init__.py");
    mkpath("tools/python/gpuguard/_site/sitecustomize.py");
    at(p, sizeof p, "tools/src");
    mkdir(p, 0755);
    at(tools, sizeof tools, "tools/src/site");
    mkdir(tools, 0755);
    snprintf(p, sizeof p, "%s/gpuguard", tools);
    CHECK(symlink("../../python/gpuguard", p) == 0);
    snprintf(p, sizeof p, "%s/sitecustomize.py", tools);
    CHECK(symlink("../../python/gpuguard/_site/sitecustomize.py", p) == 0);
    at(build, sizeof build, "build");
    CHECK(gg_pysite_trusted(tools, build, why, sizeof why));
    at(p, sizeof p, "tools/python/gpuguard/_site");
    chmod(p, 0777);
    CHECK(!gg_pysite_trusted(tools, build, why, sizeof why));
    CHECK(strstr(why, "_site is writable by every user") != NULL);
    chmod(p, 0755);
}

static void test_not_in_a_program_that_is_not_python(void)
{
    char *argv[] = {"test_pysite", NULL};
    setenv("GPUGUARD_TORCH", "1", 1);
    unsetenv("PYTHONPATH");
    CHECK(!gg_pysite_is_interpreter()); /* this test calls neither Py_BytesMain nor Py_Main */
    CHECK(!gg_pysite_load(1, argv));
    CHECK(getenv("PYTHONPATH") == NULL);
    CHECK(gg_pysite_problem() == NULL);
    setenv("GPUGUARD_TORCH", "no", 1);
    CHECK(!gg_pysite_load(1, argv));
    unsetenv("GPUGUARD_TORCH");
}

int main(void)
{
    RUN(test_pythonpath);
    RUN(test_options_as_python_reads_them);
    RUN(test_found_beside_the_library);
    RUN(test_only_a_directory_no_one_else_could_write);
    RUN(test_not_in_a_program_that_is_not_python);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        printf("(could not remove %s)\n", root);
    return unit_done();
}
