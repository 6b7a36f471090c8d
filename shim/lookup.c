/* lookup.c - layer 6: the driver lookups made with dlsym.
 *
 * libcudart and static runtimes (NCCL, cuBLAS) take cuGetProcAddress, and
 * older PyTorch its VMM functions, with dlsym on libcuda's handle. The
 * shim's dlsym (the trampoline, prim.h) asks this filter first: a lookup of
 * a hooked driver function that the real dlsym finds in libcuda gets the
 * shim's hook; everything else goes to the real dlsym with the caller's own
 * frame. The filter is registered when the library is loaded: that stores
 * one pointer and does nothing else (no CUDA, no files, no environment).
 */
#include <dlfcn.h>

#include "driver.h"
#include "gate.h"
#include "hooks.h"
#include "prim.h"
#include "settings.h"

static GG_NO_SANITIZE void *filter(void *handle, const char *name)
{
    if (!name || name[0] != 'c' || name[1] != 'u' || handle == RTLD_NEXT)
        return NULL;
    /* Off, a forked child, a failed start: the lookups are the program's. */
    if (gg_passing_through() || !gg_hooks_driver_enabled() || !gg_hook_driver_wanted(name) ||
        gg_settings_env_off())
        return NULL;
    void *real = gg_real_dlsym(handle, name);
    if (!real)
        return NULL;
    /* Only libcuda's own functions: a library that exports its own cuMemAlloc
     * (a stub, another interposer) is left alone. */
    if (!gg_driver_contains(real)) {
        char why[128];
        if (gg_driver_open(false, why, sizeof why) != 0 || !gg_driver_contains(real))
            return NULL;
    }
    return gg_hook_driver_lookup(name, real, GG_ORIGIN_DRIVER, 0, -1);
}

__attribute__((constructor)) static void register_filter(void)
{
    gg_dlsym_set_filter(filter);
}
