/* options.c - the environment, read once (see options.h). */
#include "options.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "os.h"

struct gg_options gg_opt;

/* Room for the copies, so nothing points into the live environment. */
static char store[5 * GG_PATH_MAX + 64];
static size_t store_used;

static const char *keep(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return NULL;
    size_t n = strlen(v) + 1;
    if (n > GG_PATH_MAX || store_used + n > sizeof store) {
        gg_say("%s is longer than %d bytes; ignored", name, GG_PATH_MAX);
        return NULL;
    }
    char *p = memcpy(store + store_used, v, n);
    store_used += n;
    return p;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The policies installed beside the library (<libdir>/../share/gpuguard/policy),
 * or the source tree's policy/ when the library runs from build/. */
static const char *default_policy_dir(void)
{
    static char dir[GG_PATH_MAX];
    Dl_info info;
    if (!dladdr((void *)&default_policy_dir, &info) || !info.dli_fname)
        return NULL;
    char lib[GG_PATH_MAX];
    if (!realpath(info.dli_fname, lib))
        return NULL;
    char *slash = strrchr(lib, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    static const char *const tries[] = {"../share/gpuguard/policy", "../policy", "../../policy"};
    for (size_t i = 0; i < sizeof tries / sizeof *tries; i++) {
        char cand[GG_PATH_MAX + 32];
        int n = snprintf(cand, sizeof cand, "%s/%s", lib, tries[i]);
        if (n > 0 && (size_t)n < sizeof dir && is_dir(cand)) {
            memcpy(dir, cand, (size_t)n + 1);
            return dir;
        }
    }
    return NULL;
}

static bool flag(const char *name, bool dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    if (!strcmp(v, "1") || !strcmp(v, "yes") || !strcmp(v, "true") || !strcmp(v, "on"))
        return true;
    if (!strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "false") || !strcmp(v, "off"))
        return false;
    gg_say("%s=%s: expected 1 or 0; using %d", name, v, dflt);
    return dflt;
}

void gg_options_read(void)
{
    memset(&gg_opt, 0, sizeof gg_opt);
    store_used = 0;
    gg_opt.policy = keep("GPUGUARD_POLICY");
    if (!gg_opt.policy)
        gg_opt.policy = default_policy_dir();
    gg_opt.mode = keep("GPUGUARD_MODE");
    gg_opt.headroom = keep("GPUGUARD_HEADROOM");
    gg_opt.journal_dir = keep("GPUGUARD_JOURNAL_DIR");
    gg_opt.signal = keep("GPUGUARD_SIGNAL");
    gg_opt.rank = keep("RANK");
    gg_opt.quiet = flag("GPUGUARD_QUIET", false);
    gg_opt.driver_hooks = flag("GPUGUARD_DRIVER_HOOKS", true);
    gg_opt.off = gg_opt.mode && !strcmp(gg_opt.mode, "off");
}

struct gg_policy_env gg_options_policy_env(void)
{
    struct gg_policy_env e = {
        .policy = gg_opt.policy,
        .mode = gg_opt.mode,
        .headroom = gg_opt.headroom,
        .journal_dir = gg_opt.journal_dir,
        .signal = gg_opt.signal,
    };
    return e;
}
