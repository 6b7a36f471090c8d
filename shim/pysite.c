/* pysite.c - layer 5: GPUGUARD_TORCH=1: gpuguard's sitecustomize first on
 * PYTHONPATH, at load (see pysite.h). */
#include "pysite.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "prim.h"
#include "settings.h"
#include "values.h"

#define SITE_SUBDIR "/gpuguard/_site"

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool gg_pysite_find(const char *libdir, char *out, size_t cap)
{
    /* installed (lib/), the source tree's build/ and build/<variant>/ */
    static const char *const tries[] = {"../share/gpuguard/python", "../tools/python",
                                        "../../tools/python"};
    for (size_t i = 0; i < GG_COUNT(tries); i++) {
        char cand[PATH_MAX], probe[PATH_MAX + 64];
        int n = snprintf(cand, sizeof cand, "%s/%s", libdir, tries[i]);
        if (n <= 0 || (size_t)n >= sizeof cand)
            continue;
        snprintf(probe, sizeof probe, "%s" SITE_SUBDIR "/sitecustomize.py", cand);
        char real[PATH_MAX];
        if (!is_file(probe) || !realpath(cand, real) || strlen(real) >= cap)
            continue;
        memcpy(out, real, strlen(real) + 1);
        return true;
    }
    return false;
}

/* Is `dir` one of the entries of the colon-separated path? */
static bool has_entry(const char *path, const char *dir)
{
    size_t len = strlen(dir);
    for (const char *p = path; p && *p;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        if (n == len && memcmp(p, dir, n) == 0)
            return true;
        p = colon ? colon + 1 : NULL;
    }
    return false;
}

bool gg_pysite_pythonpath(const char *old, const char *site, const char *pydir, char *out,
                          size_t cap)
{
    if (old && has_entry(old, site))
        return false;
    bool with_pydir = !(old && has_entry(old, pydir));
    int n = snprintf(out, cap, "%s%s%s%s%s", site, with_pydir ? ":" : "", with_pydir ? pydir : "",
                     old && *old ? ":" : "", old && *old ? old : "");
    return n > 0 && (size_t)n < cap;
}

bool gg_pysite_load(void)
{
    const char *v = getenv(gg_setting_info[GG_SET_torch].env);
    const char *why;
    bool on = false;
    if (!v || gg_value_bool(v, &on, &why) != 0 || !on || gg_settings_env_off())
        return false; /* a bad value is said when the shim starts (GPUGUARD_TORCH is not valid) */
    if (!gg_real_dlsym(RTLD_DEFAULT, "Py_BytesMain"))
        return false; /* not a Python interpreter */
    Dl_info info;
    /* At load, on one thread, once: not 20 KiB of its stack. */
    static char lib[PATH_MAX], pydir[PATH_MAX], site[PATH_MAX + 32], path[3 * PATH_MAX];
    if (!dladdr((void *)&gg_pysite_load, &info) || !info.dli_fname || !realpath(info.dli_fname, lib))
        return false;
    char *slash = strrchr(lib, '/');
    if (!slash)
        return false;
    *slash = '\0';
    if (!gg_pysite_find(lib, pydir, sizeof pydir))
        return false;
    snprintf(site, sizeof site, "%s" SITE_SUBDIR, pydir);
    if (!gg_pysite_pythonpath(getenv("PYTHONPATH"), site, pydir, path, sizeof path))
        return false;
    return setenv("PYTHONPATH", path, 1) == 0;
}

/* At load, before the interpreter reads its environment. */
__attribute__((constructor)) static void at_load(void)
{
    (void)gg_pysite_load();
}
