/* hooks.h - layer 6: the table of hooks.def, for the files that intercept. */
#ifndef GG_HOOKS_H
#define GG_HOOKS_H

#include <stdbool.h>

enum gg_hook {
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) GG_HOOK_##id,
#include "hooks.def"
#undef HOOK
    GG_HOOK_COUNT
};

struct gg_hook_info {
    const char *export;   /* the exported symbol */
    const char *base;     /* DRV: cuGetProcAddress's name */
    const char *journal;  /* the journal's `api` */
    int min, max;         /* DRV: CUDA versions with this ABI */
    bool driver;          /* family DRV */
    bool ptsz;            /* DRV: has a per-thread-default-stream variant */
};
extern const struct gg_hook_info gg_hooks[GG_HOOK_COUNT];

/* GPUGUARD_DRIVER_HOOKS is not 0 (read once, whenever first asked: the
 * driver's lookups can come before the shim starts). */
bool gg_hooks_driver_enabled(void);

/* ---- hook_driver.c: the driver's hooks, exported and handed out at lookups --- */

/* The hook to hand out for the driver function `real` found under `name`:
 * an exported name when version < 0 (dlsym), else a cuGetProcAddress base
 * name with that CUDA version and flags (the ABI of that version). `real`
 * itself when not hooked. */
void *gg_hook_driver_lookup(const char *name, void *real, unsigned long long flags, int version);

/* Is `name` the exported name of a hooked driver function (or its _ptsz)? */
bool gg_hook_driver_wanted(const char *name);

/* Is fn one of the shim's driver hooks? (A driver whose own tables hold
 * the shim's exports hands them out itself: the fake one does.) */
bool gg_hook_driver_is_hook(const void *fn);

/* For cudaGetDriverEntryPoint[ByVersion]: the hook for a looked-up pointer
 * `fn` of `symbol`, asked at `version` (the runtime's own for the plain
 * form; <= 0: unknown). */
void *gg_hook_driver_entry(const char *symbol, void *fn, unsigned long long flags, int version);

/* ---- hook_runtime.c: the runtime's hooks ---------------------------------------- */

/* Is `name` a hooked runtime function? */
bool gg_hook_runtime_wanted(const char *name);

/* For a dlsym of runtime function `name` that found `real` in a loaded
 * runtime (ctypes.CDLL("libcudart.so.13").cudaMalloc): the shim's copy
 * that forwards to that very function; NULL when none does. */
void *gg_hook_runtime_lookup(const char *name, void *real);

#endif /* GG_HOOKS_H */
