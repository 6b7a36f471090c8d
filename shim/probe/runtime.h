/* runtime.h - layer 3: the real CUDA runtimes of the process, each kept
 * apart and pinned.
 *
 * A process may load several runtimes: a CUDA 12 extension beside PyTorch's
 * CUDA 13, each libcudart exporting cudaMalloc@libcudart.so.12 or
 * @libcudart.so.13. The shim exports one copy of each hooked runtime
 * function per known version (and one unversioned copy for unversioned
 * callers and versions it does not know), so the dynamic linker binds every
 * caller to the copy of the version it was linked against; each copy then
 * forwards to the function of that version, here.
 *
 * A function is found lazily: dlvsym(RTLD_NEXT) for the version (dlsym for
 * the unversioned copy), else a search of the loaded libcudart objects
 * (a runtime loaded RTLD_LOCAL, a vendored libcudart-1a2b3c4d.so.13). The
 * object it lies in is pinned (dlopen RTLD_NOLOAD, never closed), so a host
 * that dlcloses the plugin that brought it cannot leave the shim calling
 * into unmapped code.
 */
#ifndef GG_RUNTIME_H
#define GG_RUNTIME_H

#include <stdbool.h>

/* The runtime versions the shim exports a copy for (the version nodes of
 * libcudart's symbols; 14 and 15 for the runtimes to come, whose calls
 * would otherwise pass the shim by), and GG_RT_ANY: the copy for unversioned
 * callers (ctypes, dlsym(RTLD_DEFAULT)): the first runtime in the global
 * scope, or any loaded one. shim/gpuguard.map names the same nodes. */
#define GG_RT_NAME_11 "libcudart.so.11.0"
#define GG_RT_NAME_12 "libcudart.so.12"
#define GG_RT_NAME_13 "libcudart.so.13"
#define GG_RT_NAME_14 "libcudart.so.14"
#define GG_RT_NAME_15 "libcudart.so.15"
#define GG_RUNTIME_VERSIONED(X)                                             \
    X(11, GG_RT_NAME_11) X(12, GG_RT_NAME_12) X(13, GG_RT_NAME_13)          \
    X(14, GG_RT_NAME_14) X(15, GG_RT_NAME_15)
enum gg_rt {
    GG_RT_ANY,
#define GG_RT_ENUM(id, name) GG_RT_##id,
    GG_RUNTIME_VERSIONED(GG_RT_ENUM)
#undef GG_RT_ENUM
    GG_RT_COUNT
};

/* The version node's name ("libcudart.so.13"), NULL for GG_RT_ANY. */
const char *gg_runtime_version_name(enum gg_rt rt);

/* The real function `name` of runtime rt, pinned; NULL when no runtime of
 * that version is loaded (yet). Slow: the caller caches it. */
void *gg_runtime_resolve(enum gg_rt rt, const char *name);

/* The device a runtime call of rt allocates on: that runtime's current
 * device (cudaGetDevice); -1 when it cannot say. */
int gg_runtime_device(enum gg_rt rt);

/* Runtime rt's CUDA version (cudaRuntimeGetVersion: 13000); 0 when it
 * cannot say. What its driver lookups without a version ask for. */
int gg_runtime_version(enum gg_rt rt);

/* Make some runtime load its driver (cudaGetDeviceCount), so the shim uses
 * the very libcuda.so.1 the runtime uses. False when no runtime is loaded. */
bool gg_runtime_touch(void);

/* A refusal must look like the runtime's own out-of-memory, also to code
 * that checks only cudaGetLastError(): make runtime rt's last error
 * cudaErrorMemoryAllocation (by an allocation the device cannot satisfy). */
void gg_runtime_set_oom(enum gg_rt rt);

#ifdef GG_TESTING
/* Pinned runtime objects (tests, the summary). */
int gg_runtime_pinned(void);
#endif

#endif /* GG_RUNTIME_H */
