/* callers.c - layer 3: the module behind a return address (see callers.h). */
#include "callers.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "prim.h"

#define CACHE 256    /* addresses remembered (direct-mapped) */
#define NAME_LEN 64  /* a file name longer than this is cut (the globs see the cut one) */

static struct {
    uintptr_t ip;
    char module[NAME_LEN]; /* "" with ip set: no object holds it */
} cache[CACHE];
static unsigned long long cache_subs; /* objects unloaded when the cache was filled */
static gg_spin lock = GG_SPIN_INIT;

/* How many objects have been unloaded from the process so far. */
static int read_subs(struct dl_phdr_info *info, size_t size, void *ctx)
{
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
        *(unsigned long long *)ctx = info->dlpi_subs;
    return 1; /* the first object says it */
}

static void copy_name(char *out, size_t cap, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t n = strlen(base);
    if (n >= cap)
        n = cap - 1;
    memcpy(out, base, n);
    out[n] = '\0';
}

bool gg_callers_module(uintptr_t ip, char *out, size_t cap)
{
    if (!cap)
        return false;
    out[0] = '\0';
    if (!ip)
        return false;
    unsigned long long subs = 0;
    dl_iterate_phdr(read_subs, &subs);
    size_t k = (size_t)gg_mix64(ip) & (CACHE - 1);
    /* A thread interrupted by a signal while it holds the lock must not make
     * the handler wait: then nothing is cached. No lock of ours is held
     * across dladdr (it takes the loader's). */
    if (gg_spin_trylock(&lock, 1000)) {
        bool hit = subs == cache_subs && cache[k].ip == ip;
        if (hit)
            copy_name(out, cap, cache[k].module);
        gg_spin_unlock(&lock);
        if (hit)
            return out[0] != '\0';
    }
    char name[NAME_LEN] = "";
    Dl_info info;
    if (dladdr((void *)(ip - 1), &info) && info.dli_fname)
        copy_name(name, sizeof name, info.dli_fname);
    if (gg_spin_trylock(&lock, 1000)) {
        if (subs != cache_subs) {
            memset(cache, 0, sizeof cache);
            cache_subs = subs;
        }
        cache[k].ip = ip;
        memcpy(cache[k].module, name, sizeof name);
        gg_spin_unlock(&lock);
    }
    copy_name(out, cap, name);
    return out[0] != '\0';
}

void gg_callers_after_fork(void)
{
    gg_spin_reset(&lock);
}
