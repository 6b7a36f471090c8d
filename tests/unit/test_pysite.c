/* test_pysite.c - pysite.c: GPUGUARD_TORCH=1 puts gpuguard's sitecustomize
 * first on PYTHONPATH, once, found beside the library; in a program that is
 * not Python (this test) nothing changes. */
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
    CHECK(gg_pysite_pythonpath(NULL, "/p/gpuguard/_site", "/p", out, sizeof out));
    CHECK_STR(out, "/p/gpuguard/_site:/p");
    CHECK(gg_pysite_pythonpath("", "/p/gpuguard/_site", "/p", out, sizeof out));
    CHECK_STR(out, "/p/gpuguard/_site:/p");
    CHECK(gg_pysite_pythonpath("/mine:/lib", "/p/gpuguard/_site", "/p", out, sizeof out));
    CHECK_STR(out, "/p/gpuguard/_site:/p:/mine:/lib");
    /* the helper is there already (gpuguard-run's --no-torch, a user's): only the site */
    CHECK(gg_pysite_pythonpath("/mine:/p", "/p/gpuguard/_site", "/p", out, sizeof out));
    CHECK_STR(out, "/p/gpuguard/_site:/mine:/p");
    /* the site is there already (gpuguard-run's, a parent's): nothing changes */
    CHECK(!gg_pysite_pythonpath("/x:/p/gpuguard/_site:/p", "/p/gpuguard/_site", "/p", out, sizeof out));
    /* a prefix of an entry is not the entry */
    CHECK(gg_pysite_pythonpath("/p/gpuguard/_site2", "/p/gpuguard/_site", "/p", out, sizeof out));
    /* no room: nothing */
    CHECK(!gg_pysite_pythonpath("/mine", "/p/gpuguard/_site", "/p", out, 8));
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

static void test_found_beside_the_library(void)
{
    char lib[PATH_MAX], out[PATH_MAX], want[PATH_MAX * 2];
    CHECK(mkdtemp(root) != NULL);
    snprintf(lib, sizeof lib, "%s/lib", root);
    mkdir(lib, 0755);
    CHECK(!gg_pysite_find(lib, out, sizeof out)); /* nothing installed */
    mkpath("share/gpuguard/python/gpuguard/_site/sitecustomize.py");
    CHECK(gg_pysite_find(lib, out, sizeof out));
    char real[PATH_MAX];
    CHECK(realpath(root, real) != NULL);
    snprintf(want, sizeof want, "%s/share/gpuguard/python", real);
    CHECK_STR(out, want);
    /* the source tree: build/ and build/san/ beside tools/python */
    char build[PATH_MAX];
    snprintf(build, sizeof build, "%s/build/san", root);
    mkpath("build/san/x");
    mkpath("tools/python/gpuguard/_site/sitecustomize.py");
    CHECK(gg_pysite_find(build, out, sizeof out));
    snprintf(want, sizeof want, "%s/tools/python", real);
    CHECK_STR(out, want);
    CHECK(!gg_pysite_find(build, out, 4)); /* no room */
}

static void test_not_in_a_program_that_is_not_python(void)
{
    setenv("GPUGUARD_TORCH", "1", 1);
    unsetenv("PYTHONPATH");
    CHECK(!gg_pysite_load()); /* this test defines no Py_BytesMain */
    CHECK(getenv("PYTHONPATH") == NULL);
    setenv("GPUGUARD_TORCH", "no", 1);
    CHECK(!gg_pysite_load());
    unsetenv("GPUGUARD_TORCH");
}

int main(void)
{
    RUN(test_pythonpath);
    RUN(test_found_beside_the_library);
    RUN(test_not_in_a_program_that_is_not_python);
    return unit_done();
}
