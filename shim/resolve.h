/* resolve.h - finding the real CUDA functions at run time.
 *
 * The shim never links libcudart or libcuda. Runtime functions are resolved
 * lazily on first use: dlsym(RTLD_NEXT) first, then, when that finds nothing
 * (a runtime loaded RTLD_LOCAL, as under Python extensions), a search of the
 * already loaded libcudart.so.* objects. Driver functions come from the
 * loaded libcuda.so.1.
 *
 * The shim also overrides dlsym, to see the driver lookups that libcudart,
 * static runtimes (NCCL, cuBLAS) and older PyTorch make on libcuda's handle:
 * a lookup of a hooked driver function gets the shim's hook. The override is
 * a trampoline that tail-jumps to the real dlsym for everything else, so
 * dlsym(RTLD_NEXT, ...) still resolves relative to its real caller.
 */
#ifndef GG_RESOLVE_H
#define GG_RESOLVE_H

#include <stdatomic.h>
#include <stdbool.h>

/* The real dlsym, whatever interposes it. */
void *gg_real_dlsym(void *handle, const char *name);

/* A runtime function, cached in *slot; NULL when no runtime is loaded yet. */
void *gg_resolve_runtime_slow(void *_Atomic *slot, const char *name);
static inline void *gg_resolve_runtime(void *_Atomic *slot, const char *name)
{
    void *p = atomic_load_explicit(slot, memory_order_acquire);
    return __builtin_expect(p != 0, 1) ? p : gg_resolve_runtime_slow(slot, name);
}

/* A driver function by its exported name (cuMemGetInfo_v2), from the loaded
 * libcuda.so.1, loading it if `load` and it is not loaded yet. */
void *gg_resolve_driver(const char *name, bool load);

/* Whether ip lies inside libcuda.so.1 (a real driver function). */
bool gg_resolve_in_driver(const void *ip);

/* Whether ip lies inside the shim itself. */
bool gg_resolve_in_self(const void *ip);

#endif /* GG_RESOLVE_H */
