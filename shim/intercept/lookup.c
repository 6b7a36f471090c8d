/* lookup.c - layer 6: the lookups made with dlsym.
 *
 * libcudart and static runtimes (NCCL, cuBLAS) take cuGetProcAddress, and
 * JAX, TensorFlow and older PyTorch their driver functions, with dlsym on
 * libcuda's handle; Python's ctypes takes cudaMalloc with dlsym on the
 * runtime's own handle, which finds the runtime's function, not the shim's
 * export. The shim's dlsym (the trampoline, prim.h) asks this filter first:
 * a lookup of a hooked function that the real dlsym finds in libcuda or in
 * a loaded runtime gets the shim's hook; everything else goes to the real
 * dlsym with the caller's own frame. The filter is registered when the
 * library is loaded: that stores one pointer and does nothing else (no
 * CUDA, no files, no environment).
 */
#include <dlfcn.h>
#include <string.h>

#include "arch.h"
#include "driver.h"
#include "life.h"
#include "hooks.h"
#include "prim.h"
#include "settings.h"
#include "trace.h"

/* Does `real` lie in a CUDA runtime (libcudart.so.13, a vendored
 * libcudart-1a2b3c4d.so.12)? */
static bool in_runtime(void *real)
{
    Dl_info info;
    if (!dladdr(real, &info) || !info.dli_fname)
        return false;
    const char *base = strrchr(info.dli_fname, '/');
    base = base ? base + 1 : info.dli_fname;
    return strncmp(base, "libcudart", 9) == 0;
}

/* A runtime's hook handed out: traced (trace.h). */
static void *handed(void *hook, const char *name, uintptr_t caller)
{
    if (hook && (gg_tracing() || gg_trace_early()))
        gg_trace_lookup("dlsym", name, -1, 0, caller);
    return hook;
}

static GG_NO_SANITIZE void *filter(void *handle, const char *name, uintptr_t caller)
{
    if (!name || name[0] != 'c' || name[1] != 'u' || handle == RTLD_NEXT)
        return NULL;
    /* Off, a forked child, a failed start: the lookups are the program's. */
    if (gg_passing_through() || gg_settings_env_off())
        return NULL;
    if (name[2] == 'd' && name[3] == 'a') { /* cuda*: the runtime API */
        if (handle == RTLD_DEFAULT || !gg_hook_runtime_wanted(name))
            return NULL; /* the default scope finds the shim's own export */
        void *real = gg_real_dlsym(handle, name);
        return handed(real && in_runtime(real) ? gg_hook_runtime_lookup(name, real) : NULL, name,
                      caller);
    }
    if (gg_active())
        gg_arch_poll(); /* a runtime that finds the driver by name (CUDA 11.2 and older) */
    if (!gg_hooks_driver_enabled() || !gg_hook_driver_wanted(name))
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
    void *hook = gg_hook_driver_lookup(name, real, 0, -1);
    if ((gg_tracing() || gg_trace_early()) && gg_hook_driver_is_hook(hook))
        gg_trace_lookup("dlsym", name, -1, 0, caller);
    return hook;
}

__attribute__((constructor)) static void register_filter(void)
{
    gg_dlsym_set_filter(filter);
}
