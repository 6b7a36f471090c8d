/* hook_runtime.c - layer 6: the CUDA runtime's allocation functions, as
 * exported by the shim (docs/how-it-works.md).
 *
 * Every RT row of hooks.def is exported once unversioned and once per
 * runtime version (runtime.h, gpuguard.map), and each copy forwards to the
 * runtime of its version: a caller reaches its own runtime, its devices
 * and its last error. A hook asks the guard before and tells it after;
 * error codes reach the caller unchanged, and a refusal is exactly
 * cudaErrorMemoryAllocation (also as the runtime's last error), the one code
 * PyTorch's allocator answers by freeing its cache and retrying.
 * cudaFree(NULL) and zero-size requests go straight through. A dlsym of a
 * hooked name on a runtime's own handle (ctypes) gets the copy that
 * forwards to the function it found (gg_hook_runtime_lookup).
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"
#include "hook_body.h"
#include "hook_shapes.def"

/* ---- the real functions, per runtime ----------------------------------------------- */

static void *_Atomic real_fn[GG_RT_COUNT][GG_HOOK_COUNT];

static GG_COLD void *real_slow(enum gg_rt rt, enum gg_hook h)
{
    void *p = gg_runtime_resolve(rt, gg_hooks[h].export);
    if (p)
        atomic_store_explicit(&real_fn[rt][h], p, memory_order_release);
    return p;
}

static inline void *real_of(enum gg_rt rt, enum gg_hook h)
{
    void *p = atomic_load_explicit(&real_fn[rt][h], memory_order_acquire);
    return gg_likely(p != NULL) ? p : real_slow(rt, h);
}

/* No runtime of that version to forward to: the caller linked one, so it
 * was loaded in a way the search did not find. Said once. */
static GG_COLD cudaError_t missing(enum gg_rt rt, enum gg_hook h)
{
    static _Atomic bool said;
    if (!atomic_exchange(&said, true)) {
        const char *v = gg_runtime_version_name(rt);
        gg_say("cannot find the CUDA runtime's %s%s%s; the call fails", gg_hooks[h].export,
               v ? "@" : "", v ? v : "");
    }
    return cudaErrorInitializationError;
}

/* ---- the bodies, one per shape (hook_shapes.def) ---------------------------------- */

/* The shared steps (hook_body.h), on the runtime's side: side = the
 * runtime's version. Its codes are the shared ones. */
_Static_assert(cudaSuccess == GG_OK && cudaErrorMemoryAllocation == GG_OOM,
               "the runtime's codes are hook_body.h's");

/* What the caller's pointer holds (0: no pointer). */
static inline uintptr_t key_of(void *const *p)
{
    return p ? (uintptr_t)*p : 0;
}

typedef cudaError_t (*alloc_fn)(void **, size_t);
static inline cudaError_t body_RT_ALLOC(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                        size_t n)
{
    alloc_fn real = (alloc_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, n, -1, GG_REFUSABLE))
        return real(p, n);
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, p);
    cudaError_t r = real(p, n);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of(p) : 0);
}

/* A stream-ordered request on stream s: on the stream's device (a default
 * stream's is the runtime's current one); pool 0: that device's current
 * pool (hook_body.h). */
static inline int stream_device(cudaStream_t s)
{
    if ((uintptr_t)s <= 2) /* the legacy and per-thread default streams */
        return -1;
    return gg_driver_stream_device(s);
}

typedef cudaError_t (*async_fn)(void **, size_t, cudaStream_t);
static inline cudaError_t body_RT_ASYNC(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                        size_t n, cudaStream_t s)
{
    async_fn real = (async_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, n, stream_device(s), GG_REFUSABLE))
        return real(p, n, s);
    if (!gg_guard_pool(&c, 0, c.dev, gg_hooks_driver_enabled())) { /* a host pool's */
        cudaError_t r = real(p, n, s);
        return gg_hook_host_end(r, key_of(p));
    }
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, p);
    cudaError_t r = real(p, n, s);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of(p) : 0);
}

typedef cudaError_t (*pool_fn)(void **, size_t, cudaMemPool_t, cudaStream_t);
static inline cudaError_t body_RT_POOL(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                       size_t n, cudaMemPool_t pool, cudaStream_t s)
{
    pool_fn real = (pool_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    if (!pool) /* no pool: the runtime says what is wrong */
        return real(p, n, pool, s);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, n, stream_device(s), GG_REFUSABLE))
        return real(p, n, pool, s);
    if (!gg_guard_pool(&c, (uint64_t)(uintptr_t)pool, c.dev, gg_hooks_driver_enabled())) {
        cudaError_t r = real(p, n, pool, s);
        return gg_hook_host_end(r, key_of(p));
    }
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, p);
    cudaError_t r = real(p, n, pool, s);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of(p) : 0);
}

typedef cudaError_t (*managed_fn)(void **, size_t, unsigned);
static inline cudaError_t body_RT_MANAGED(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                          size_t n, unsigned flags)
{
    managed_fn real = (managed_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    /* Managed memory may oversubscribe the device: counted, never refused. */
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, n, -1, GG_REFUSABLE_NEVER))
        return real(p, n, flags);
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, p);
    cudaError_t r = real(p, n, flags);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of(p) : 0);
}

/* Pitched memory: judged by what was asked, counted by what the device
 * gave (hook_body.h). */
typedef cudaError_t (*pitch_fn)(void **, size_t *, size_t, size_t);
static cudaError_t body_RT_PITCH(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                 size_t *pitch, size_t w, size_t hgt)
{
    pitch_fn real = (pitch_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, gg_hook_pitch_bytes(w, hgt), -1,
                                    GG_REFUSABLE))
        return real(p, pitch, w, hgt);
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, p);
    cudaError_t r = real(p, pitch, w, hgt);
    if (r == cudaSuccess && pitch)
        gg_hook_pitched(&c, *pitch, hgt);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of(p) : 0);
}

/* 3-D pitched memory: width bytes for each of height x depth rows, counted
 * by the pitch the device gave. An extent that overflows is the runtime's
 * to reject. */
typedef cudaError_t (*malloc3d_fn)(struct cudaPitchedPtr *, struct cudaExtent);
static cudaError_t body_RT_3D(enum gg_hook h, enum gg_rt rt, uintptr_t ra,
                              struct cudaPitchedPtr *pp, struct cudaExtent e)
{
    malloc3d_fn real = (malloc3d_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    uint64_t rows, bytes;
    if (!pp || __builtin_mul_overflow((uint64_t)e.height, (uint64_t)e.depth, &rows) ||
        __builtin_mul_overflow((uint64_t)e.width, rows, &bytes))
        return real(pp, e);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, bytes, -1, GG_REFUSABLE))
        return real(pp, e);
    if (!gg_guard_admit(&c, &v)) {
        memset(pp, 0, sizeof *pp);
        return gg_hook_refuse((int)rt, &c, &v, NULL);
    }
    cudaError_t r = real(pp, e);
    if (r == cudaSuccess)
        gg_hook_pitched(&c, pp->pitch, rows);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? (uintptr_t)pp->ptr : 0);
}

/* Arrays: the bytes their extent and element size hold (arrays.h), the
 * element size from the channel descriptor; one the runtime will reject
 * (no descriptor, an extent it cannot hold) passes through uncounted, its
 * error the runtime's. */
static inline bool array_bytes(const struct cudaChannelFormatDesc *desc, size_t w, size_t hgt,
                               size_t depth, unsigned flags, unsigned levels, uint64_t *bytes)
{
    return desc && gg_array_bytes(w, hgt, depth,
                                  gg_array_channel_bytes(desc->x, desc->y, desc->z, desc->w),
                                  flags, levels, bytes);
}

typedef cudaError_t (*array_fn)(cudaArray_t *, const struct cudaChannelFormatDesc *, size_t,
                                size_t, unsigned);
static cudaError_t body_RT_ARRAY(enum gg_hook h, enum gg_rt rt, uintptr_t ra, cudaArray_t *a,
                                 const struct cudaChannelFormatDesc *desc, size_t w, size_t hgt,
                                 unsigned flags)
{
    array_fn real = (array_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    uint64_t bytes;
    if (!array_bytes(desc, w, hgt, 0, flags, 1, &bytes))
        return real(a, desc, w, hgt, flags);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, desc, w, hgt, flags);
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, (void **)a);
    cudaError_t r = real(a, desc, w, hgt, flags);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of((void **)a) : 0);
}

typedef cudaError_t (*array3d_fn)(cudaArray_t *, const struct cudaChannelFormatDesc *,
                                  struct cudaExtent, unsigned);
static cudaError_t body_RT_ARRAY3D(enum gg_hook h, enum gg_rt rt, uintptr_t ra, cudaArray_t *a,
                                   const struct cudaChannelFormatDesc *desc, struct cudaExtent e,
                                   unsigned flags)
{
    array3d_fn real = (array3d_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    uint64_t bytes;
    if (!array_bytes(desc, e.width, e.height, e.depth, flags, 1, &bytes))
        return real(a, desc, e, flags);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, desc, e, flags);
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, (void **)a);
    cudaError_t r = real(a, desc, e, flags);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of((void **)a) : 0);
}

typedef cudaError_t (*mipmap_fn)(cudaMipmappedArray_t *, const struct cudaChannelFormatDesc *,
                                 struct cudaExtent, unsigned, unsigned);
static cudaError_t body_RT_MIPMAP(enum gg_hook h, enum gg_rt rt, uintptr_t ra,
                                  cudaMipmappedArray_t *a, const struct cudaChannelFormatDesc *desc,
                                  struct cudaExtent e, unsigned levels, unsigned flags)
{
    mipmap_fn real = (mipmap_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    uint64_t bytes;
    if (!array_bytes(desc, e.width, e.height, e.depth, flags, levels, &bytes))
        return real(a, desc, e, levels, flags);
    struct gg_call c;
    struct gg_verdict v;
    if (!gg_hook_begin(&c, (int)rt, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, desc, e, levels, flags);
    if (!gg_guard_admit(&c, &v))
        return gg_hook_refuse((int)rt, &c, &v, (void **)a);
    cudaError_t r = real(a, desc, e, levels, flags);
    return gg_hook_end(&c, &v, r, r == cudaSuccess ? key_of((void **)a) : 0);
}

/* Frees: the guard forgets first, the real free, then what it returned
 * (hook_body.h). */
typedef cudaError_t (*free_fn)(void *);
static inline cudaError_t body_RT_FREE(enum gg_hook h, enum gg_rt rt, void *p)
{
    free_fn real = (free_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, (int)rt, h, (uintptr_t)p))
        return real(p);
    return gg_hook_free_done(&f, (int)rt, h, true, real(p));
}

typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);
static inline cudaError_t body_RT_FREE_ASYNC(enum gg_hook h, enum gg_rt rt, void *p,
                                             cudaStream_t s)
{
    free_async_fn real = (free_async_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, (int)rt, h, (uintptr_t)p))
        return real(p, s);
    return gg_hook_free_done(&f, (int)rt, h, true, real(p, s));
}

/* An array the shim did not count (sparse, deferred) is no surprise. */
typedef cudaError_t (*free_array_fn)(cudaArray_t);
static cudaError_t body_RT_FREE_ARRAY(enum gg_hook h, enum gg_rt rt, cudaArray_t a)
{
    free_array_fn real = (free_array_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, (int)rt, h, (uintptr_t)a))
        return real(a);
    return gg_hook_free_done(&f, (int)rt, h, false, real(a));
}

typedef cudaError_t (*free_mipmap_fn)(cudaMipmappedArray_t);
static cudaError_t body_RT_FREE_MIPMAP(enum gg_hook h, enum gg_rt rt,
                                       cudaMipmappedArray_t a)
{
    free_mipmap_fn real = (free_mipmap_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, (int)rt, h, (uintptr_t)a))
        return real(a);
    return gg_hook_free_done(&f, (int)rt, h, false, real(a));
}

typedef cudaError_t (*meminfo_fn)(size_t *, size_t *);
static cudaError_t body_RT_MEMINFO(enum gg_hook h, enum gg_rt rt, size_t *free_b,
                                   size_t *total_b)
{
    meminfo_fn real = (meminfo_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    cudaError_t r = real(free_b, total_b);
    if (r == cudaSuccess && gg_enter()) {
        int dev = gg_hook_device((int)rt, -1);
        gg_guard_meminfo(dev, free_b, total_b);
        if (gg_tracing() && free_b && total_b)
            gg_trace_meminfo(gg_hooks[h].journal, dev, *free_b, *total_b);
        gg_leave();
    }
    return r;
}

/* Driver entry points: PyTorch's expandable segments, CuPy. The plain form
 * asks at the runtime's own version. A hook handed out is traced with the
 * module that asked (ra). */
static void *entry_handed(const char *via, const char *sym, void *fn, unsigned long long flags,
                          int version, uintptr_t ra)
{
    void *hook = gg_hook_driver_entry(sym, fn, flags, version);
    if ((gg_tracing() || gg_trace_early()) && gg_hook_driver_is_hook(hook))
        gg_trace_lookup(via, sym, version, flags, ra);
    return hook;
}

typedef cudaError_t (*entry_fn)(const char *, void **, unsigned long long,
                                enum cudaDriverEntryPointQueryResult *);
static cudaError_t body_RT_ENTRY(enum gg_hook h, enum gg_rt rt, uintptr_t ra, const char *sym,
                                 void **fn, unsigned long long flags,
                                 enum cudaDriverEntryPointQueryResult *st)
{
    entry_fn real = (entry_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    cudaError_t r = real(sym, fn, flags, st);
    if (r == cudaSuccess && fn && *fn)
        *fn = entry_handed("entry", sym, *fn, flags, gg_runtime_version(rt), ra);
    return r;
}

typedef cudaError_t (*entry_v_fn)(const char *, void **, unsigned int, unsigned long long,
                                  enum cudaDriverEntryPointQueryResult *);
static cudaError_t body_RT_ENTRY_V(enum gg_hook h, enum gg_rt rt, uintptr_t ra, const char *sym,
                                   void **fn, unsigned int version, unsigned long long flags,
                                   enum cudaDriverEntryPointQueryResult *st)
{
    entry_v_fn real = (entry_v_fn)real_of(rt, h);
    if (gg_unlikely(!real))
        return missing(rt, h);
    cudaError_t r = real(sym, fn, version, flags, st);
    if (r == cudaSuccess && fn && *fn)
        *fn = entry_handed("entry_v", sym, *fn, flags, (int)version, ra);
    return r;
}

/* nvcc's host code registers each fat binary from its library's
 * constructor: forwarded to that library's own runtime (this copy's
 * version), the library noted, and checked against the GPUs (arch.h) when
 * the shim has started; never starts the shim (a process that imports
 * torch and never allocates leaves nothing behind). */
typedef void **(*register_fn)(void *);
static void **body_RT_REGISTER(enum gg_hook h, enum gg_rt rt, void *fat_cubin)
{
    register_fn real = (register_fn)real_of(rt, h);
    if (gg_unlikely(!real)) {
        missing(rt, h);
        return NULL;
    }
    void *module = gg_passing_through() ? NULL : gg_arch_registering(fat_cubin);
    void **handle = real(fat_cubin);
    if (module && gg_active())
        gg_arch_registered(module);
    return handle;
}

/* ---- the exports, from hooks.def ----------------------------------------------------- */

/* One exported function `name` forwarding to runtime rt: its signature,
 * and whether its body is given the caller's return address (the call that
 * entered the shim, the module that asked), from hook_shapes.def. */
#define RT_FN(name, rt, id, shape) GG_SHAPE(RT_FN_, shape, name, rt, id, shape)
#define RT_FN_(name, rt, id, shape, ret, caller, params, args)                        \
    GG_EXPORT ret CUDARTAPI name params;                                             \
    GG_EXPORT ret CUDARTAPI name params                                              \
    {                                                                                \
        return body_##shape(GG_HOOK_##id, rt GG_SHAPE_CALLER_##caller GG_SHAPE_ARGS args); \
    }

/* The copy for unversioned callers: export@@GPUGUARD_CUDART, the default.
 * Not the base version: glibc lets a versioned reference bind to a symbol
 * of the base version, so a caller of cudaMalloc@libcudart.so.12 could land
 * on it; a named version it rejects. */
#define RT_PLAIN(id, export, shape)                    \
    RT_FN(gg_rt_any_##export, GG_RT_ANY, id, shape)    \
    __asm__(".symver gg_rt_any_" #export ", " #export "@@GPUGUARD_CUDART");

/* The copy for runtime version V: export@<version node>. */
#define RT_COPY(V, id, export, shape)                      \
    RT_FN(gg_rt_##V##_##export, GG_RT_##V, id, shape)     \
    __asm__(".symver gg_rt_" #V "_" #export ", " #export "@" GG_RT_NAME_##V);

_Static_assert(GG_RT_COUNT == 6, "RT_COPIES must name every version of GG_RUNTIME_VERSIONED");
#define RT_COPIES(id, export, shape)                                   \
    RT_COPY(11, id, export, shape) RT_COPY(12, id, export, shape)      \
    RT_COPY(13, id, export, shape) RT_COPY(14, id, export, shape)      \
    RT_COPY(15, id, export, shape)

/* cudaGetDriverEntryPoint is deprecated since CUDA 12.5 in favour of the
 * ByVersion form, and still what PyTorch 2.x calls. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#define HOOK_DRV(id, export, shape)
#define HOOK_RT(id, export, shape) RT_PLAIN(id, export, shape) RT_COPIES(id, export, shape)
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) HOOK_##family(id, export, shape)
#include "hooks.def"
#undef HOOK
#undef HOOK_RT

/* ---- a dlsym of a runtime function on a runtime's handle (ctypes) ----------------- */

/* Every copy, by hook and runtime version. */
static void *const copies[GG_HOOK_COUNT][GG_RT_COUNT] = {
#define HOOK_RT(id, export, shape)                                                      \
    [GG_HOOK_##id] = {(void *)gg_rt_any_##export, (void *)gg_rt_11_##export,            \
                      (void *)gg_rt_12_##export, (void *)gg_rt_13_##export,             \
                      (void *)gg_rt_14_##export, (void *)gg_rt_15_##export},
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) HOOK_##family(id, export, shape)
#include "hooks.def"
#undef HOOK
};
#pragma GCC diagnostic pop

static int runtime_hook(const char *name)
{
    for (int h = 0; h < GG_HOOK_COUNT; h++)
        if (!gg_hooks[h].driver && !strcmp(gg_hooks[h].export, name))
            return h;
    return -1;
}

bool gg_hook_runtime_wanted(const char *name)
{
    return runtime_hook(name) >= 0;
}

/* The copy whose runtime's function is `real`: the version it was found
 * under first, then the unversioned copy (a runtime built without symbol
 * versions, found as the process's first). */
void *gg_hook_runtime_lookup(const char *name, void *real)
{
    int h = runtime_hook(name);
    if (h < 0 || !real)
        return NULL;
    for (int rt = GG_RT_COUNT - 1; rt >= GG_RT_ANY; rt--)
        if (real_of((enum gg_rt)rt, (enum gg_hook)h) == real)
            return copies[h][rt];
    return NULL;
}
