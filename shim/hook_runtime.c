/* hook_runtime.c - layer 6: the CUDA runtime's allocation functions, as
 * exported by the shim (DESIGN.md section 2).
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
#include "arrays.h"
#include "device.h"
#include "driver.h"
#include "events.h"
#include "gate.h"
#include "guard.h"
#include "hooks.h"
#include "pools.h"
#include "prim.h"
#include "react.h"
#include "runtime.h"
#include "trace.h"

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

#define REAL(type, rt, h)                 \
    type real = (type)real_of(rt, h);     \
    if (gg_unlikely(!real))               \
        return missing(rt, h)

/* ---- the bodies, one per shape ---------------------------------------------------------- */

/* The runtime allocates on its current device: ask it, unless there is only
 * one. ra: the caller's return address (the module that asked). */
static inline bool begin(struct gg_call *c, enum gg_rt rt, enum gg_hook h, uintptr_t ra,
                         uint64_t bytes, uint8_t refusable)
{
    if (!bytes || !gg_enter())
        return false;
    c->dev = gg_device_count == 1 ? 0 : gg_runtime_device(rt);
    c->api = (uint8_t)h;
    c->api_name = gg_hooks[h].journal;
    c->refusable = refusable;
    c->pool = GG_POOL_NONE;
    c->runtime = true;
    c->bytes = bytes;
    c->caller = ra;
    return true;
}

/* A refusal looks like the runtime's own out-of-memory: no pointer, and
 * cudaErrorMemoryAllocation as the last error. */
static GG_COLD cudaError_t refuse(const struct gg_call *c, const struct gg_verdict *v,
                                  enum gg_rt rt, void **p)
{
    gg_react(c, v);
    gg_runtime_set_oom(rt);
    if (p)
        *p = NULL;
    if (gg_tracing())
        gg_trace_alloc(c->api_name, c->dev, c->bytes, 0, cudaErrorMemoryAllocation, true, c->pool);
    gg_leave();
    return cudaErrorMemoryAllocation;
}

static inline cudaError_t end(struct gg_call *c, struct gg_verdict *v, cudaError_t r, void **p)
{
    if (r == cudaSuccess)
        gg_guard_allocated(c, p ? (uintptr_t)*p : 0, v);
    else
        gg_guard_failed(c, r == cudaErrorMemoryAllocation, v);
    if (gg_unlikely(gg_verdict_any(v)))
        gg_react(c, v);
    if (gg_tracing())
        gg_trace_alloc(c->api_name, c->dev, c->bytes, r == cudaSuccess && p ? (uintptr_t)*p : 0,
                       r, false, c->pool);
    gg_leave();
    return r;
}

/* A free the runtime accepted of memory the shim never saw allocated (made
 * through a path it does not hook): counted, said once. */
static GG_COLD void unknown_free(enum gg_rt rt, const void *p, cudaError_t r)
{
    if (r != cudaSuccess)
        return;
    int dev = gg_device_count == 1 ? 0 : gg_runtime_device(rt);
    if (gg_guard_unknown_free((uintptr_t)p, dev))
        gg_events_error("freed %p, which gpuguard did not see allocated; forwarded untouched "
                        "(said once, counted in the summary)", p);
}

static inline cudaError_t free_end(enum gg_rt rt, enum gg_hook h, void *p, bool known,
                                   bool report, const struct gg_entry *e, uint32_t ticket,
                                   const struct gg_verdict *v, cudaError_t r)
{
    if (r != cudaSuccess && gg_tracing())
        gg_trace_failed("free", gg_hooks[h].journal, (uintptr_t)p, r);
    if (!known) {
        if (report)
            unknown_free(rt, p, r);
    }
    else if (r != cudaSuccess)
        gg_guard_unrelease(e, ticket);
    else if (gg_unlikely(gg_verdict_any(v)))
        gg_react_free(v);
    gg_leave();
    return r;
}

#define ADMIT_CALL(c, rt, p, CALL)                        \
    do {                                                  \
        struct gg_verdict v;                              \
        if (!gg_guard_admit(&c, &v))                      \
            return refuse(&c, &v, rt, (void **)(p));      \
        return end(&c, &v, CALL, (void **)(p));           \
    } while (0)

#define ALLOC_BODY(rt, h, ra, bytes, refusable, p, CALL)  \
    do {                                                  \
        struct gg_call c;                                 \
        if (!begin(&c, rt, h, ra, bytes, refusable))      \
            return CALL;                                  \
        ADMIT_CALL(c, rt, p, CALL);                       \
    } while (0)

/* `report`: a free of memory the shim never saw is said (and counted).
 * Traced before the real free: the address may be handed out again the
 * moment it returns. */
#define FREE_BODY(rt, h, p, report, CALL)                                        \
    do {                                                                         \
        if (!p || !gg_enter())                                                   \
            return CALL;                                                         \
        struct gg_entry e;                                                       \
        struct gg_verdict v;                                                     \
        uint32_t ticket;                                                         \
        bool known = gg_guard_release((uintptr_t)p, &e, &ticket, &v);           \
        if (gg_tracing())                                                        \
            gg_trace_free(gg_hooks[h].journal, (uintptr_t)p);                    \
        return free_end(rt, h, p, known, report, &e, ticket, &v, CALL);          \
    } while (0)

typedef cudaError_t (*alloc_fn)(void **, size_t);
static inline cudaError_t body_RT_ALLOC(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                        size_t n)
{
    REAL(alloc_fn, rt, h);
    ALLOC_BODY(rt, h, ra, n, GG_REFUSABLE, p, real(p, n));
}

/* A stream-ordered request: charged to the device of the pool that serves
 * it, judged by how much that pool must grow; a host pool's passes by.
 * pool 0: the current pool of the stream's device. */
#define POOL_BODY(rt, h, ra, n, POOL, STREAM, P, CALL)                                  \
    do {                                                                                \
        struct gg_call c;                                                               \
        if (!begin(&c, rt, h, ra, n, GG_REFUSABLE))                                     \
            return CALL;                                                                \
        if ((uintptr_t)(STREAM) > 2) { /* not a default stream: the stream's device */ \
            int sd = gg_driver_stream_device(STREAM);                                   \
            c.dev = sd >= 0 ? sd : c.dev;                                               \
        }                                                                               \
        if (!gg_guard_pool(&c, POOL, c.dev, gg_hooks_driver_enabled())) {               \
            cudaError_t r = CALL;                                                       \
            if (r == cudaSuccess && (P))                                                \
                gg_guard_host_allocated((uintptr_t) * (P));                             \
            gg_leave();                                                                 \
            return r;                                                                   \
        }                                                                               \
        ADMIT_CALL(c, rt, P, CALL);                                                     \
    } while (0)

typedef cudaError_t (*async_fn)(void **, size_t, cudaStream_t);
static inline cudaError_t body_RT_ASYNC(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                        size_t n, cudaStream_t s)
{
    REAL(async_fn, rt, h);
    POOL_BODY(rt, h, ra, n, 0, s, p, real(p, n, s));
}

typedef cudaError_t (*pool_fn)(void **, size_t, cudaMemPool_t, cudaStream_t);
static inline cudaError_t body_RT_POOL(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                       size_t n, cudaMemPool_t pool, cudaStream_t s)
{
    REAL(pool_fn, rt, h);
    if (!pool) /* no pool: the runtime says what is wrong */
        return real(p, n, pool, s);
    POOL_BODY(rt, h, ra, n, (uint64_t)(uintptr_t)pool, s, p, real(p, n, pool, s));
}

typedef cudaError_t (*managed_fn)(void **, size_t, unsigned);
static inline cudaError_t body_RT_MANAGED(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                          size_t n, unsigned flags)
{
    REAL(managed_fn, rt, h);
    /* Managed memory may oversubscribe the device: counted, never refused. */
    ALLOC_BODY(rt, h, ra, n, GG_REFUSABLE_NEVER, p, real(p, n, flags));
}

typedef cudaError_t (*pitch_fn)(void **, size_t *, size_t, size_t);
static cudaError_t body_RT_PITCH(enum gg_hook h, enum gg_rt rt, uintptr_t ra, void **p,
                                 size_t *pitch, size_t w, size_t hgt)
{
    REAL(pitch_fn, rt, h);
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)w, (uint64_t)hgt, &bytes))
        bytes = UINT64_MAX; /* cannot be had: the guard refuses or the runtime fails */
    struct gg_call c;
    struct gg_verdict v;
    if (!begin(&c, rt, h, ra, bytes, GG_REFUSABLE))
        return real(p, pitch, w, hgt);
    if (!gg_guard_admit(&c, &v))
        return refuse(&c, &v, rt, p);
    cudaError_t r = real(p, pitch, w, hgt);
    if (r == cudaSuccess && pitch && !__builtin_mul_overflow((uint64_t)*pitch, (uint64_t)hgt, &bytes))
        c.bytes = bytes; /* what the device really gave */
    return end(&c, &v, r, p);
}

/* 3-D pitched memory: width bytes for each of height x depth rows, counted
 * by the pitch the device gave. An extent that overflows is the runtime's
 * to reject. */
typedef cudaError_t (*malloc3d_fn)(struct cudaPitchedPtr *, struct cudaExtent);
static cudaError_t body_RT_3D(enum gg_hook h, enum gg_rt rt, uintptr_t ra,
                              struct cudaPitchedPtr *pp, struct cudaExtent e)
{
    REAL(malloc3d_fn, rt, h);
    uint64_t rows, bytes;
    if (!pp || __builtin_mul_overflow((uint64_t)e.height, (uint64_t)e.depth, &rows) ||
        __builtin_mul_overflow((uint64_t)e.width, rows, &bytes))
        return real(pp, e);
    struct gg_call c;
    struct gg_verdict v;
    if (!begin(&c, rt, h, ra, bytes, GG_REFUSABLE))
        return real(pp, e);
    if (!gg_guard_admit(&c, &v)) {
        memset(pp, 0, sizeof *pp);
        return refuse(&c, &v, rt, NULL);
    }
    cudaError_t r = real(pp, e);
    if (r == cudaSuccess && !__builtin_mul_overflow((uint64_t)pp->pitch, rows, &bytes))
        c.bytes = bytes; /* what the device really gave */
    void *ptr = r == cudaSuccess ? pp->ptr : NULL;
    return end(&c, &v, r, &ptr);
}

/* Arrays: the bytes their extent and channel format hold (arrays.h); one
 * the runtime will reject passes through uncounted, its error the runtime's. */
#define ARRAY_BODY(rt, h, ra, A, DESC, W, H, D, FLAGS, LEVELS, CALL)                      \
    do {                                                                                  \
        uint64_t bytes;                                                                   \
        if (!(DESC) || !gg_array_bytes(W, H, D,                                           \
                                       gg_array_channel_bytes((DESC)->x, (DESC)->y,       \
                                                              (DESC)->z, (DESC)->w),      \
                                       FLAGS, LEVELS, &bytes))                            \
            return CALL;                                                                  \
        ALLOC_BODY(rt, h, ra, bytes, GG_REFUSABLE, A, CALL);                              \
    } while (0)

typedef cudaError_t (*array_fn)(cudaArray_t *, const struct cudaChannelFormatDesc *, size_t,
                                size_t, unsigned);
static cudaError_t body_RT_ARRAY(enum gg_hook h, enum gg_rt rt, uintptr_t ra, cudaArray_t *a,
                                 const struct cudaChannelFormatDesc *desc, size_t w, size_t hgt,
                                 unsigned flags)
{
    REAL(array_fn, rt, h);
    ARRAY_BODY(rt, h, ra, a, desc, w, hgt, 0, flags, 1, real(a, desc, w, hgt, flags));
}

typedef cudaError_t (*array3d_fn)(cudaArray_t *, const struct cudaChannelFormatDesc *,
                                  struct cudaExtent, unsigned);
static cudaError_t body_RT_ARRAY3D(enum gg_hook h, enum gg_rt rt, uintptr_t ra, cudaArray_t *a,
                                   const struct cudaChannelFormatDesc *desc, struct cudaExtent e,
                                   unsigned flags)
{
    REAL(array3d_fn, rt, h);
    ARRAY_BODY(rt, h, ra, a, desc, e.width, e.height, e.depth, flags, 1, real(a, desc, e, flags));
}

typedef cudaError_t (*mipmap_fn)(cudaMipmappedArray_t *, const struct cudaChannelFormatDesc *,
                                 struct cudaExtent, unsigned, unsigned);
static cudaError_t body_RT_MIPMAP(enum gg_hook h, enum gg_rt rt, uintptr_t ra,
                                  cudaMipmappedArray_t *a, const struct cudaChannelFormatDesc *desc,
                                  struct cudaExtent e, unsigned levels, unsigned flags)
{
    REAL(mipmap_fn, rt, h);
    ARRAY_BODY(rt, h, ra, a, desc, e.width, e.height, e.depth, flags, levels,
               real(a, desc, e, levels, flags));
}

typedef cudaError_t (*free_fn)(void *);
static inline cudaError_t body_RT_FREE(enum gg_hook h, enum gg_rt rt, void *p)
{
    REAL(free_fn, rt, h);
    FREE_BODY(rt, h, p, true, real(p));
}

typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);
static inline cudaError_t body_RT_FREE_ASYNC(enum gg_hook h, enum gg_rt rt, void *p,
                                             cudaStream_t s)
{
    REAL(free_async_fn, rt, h);
    FREE_BODY(rt, h, p, true, real(p, s));
}

/* An array the shim did not count (sparse, deferred) is no surprise. */
typedef cudaError_t (*free_array_fn)(cudaArray_t);
static cudaError_t body_RT_FREE_ARRAY(enum gg_hook h, enum gg_rt rt, cudaArray_t a)
{
    REAL(free_array_fn, rt, h);
    FREE_BODY(rt, h, a, false, real(a));
}

typedef cudaError_t (*free_mipmap_fn)(cudaMipmappedArray_t);
static cudaError_t body_RT_FREE_MIPMAP(enum gg_hook h, enum gg_rt rt,
                                       cudaMipmappedArray_t a)
{
    REAL(free_mipmap_fn, rt, h);
    FREE_BODY(rt, h, a, false, real(a));
}

typedef cudaError_t (*meminfo_fn)(size_t *, size_t *);
static cudaError_t body_RT_MEMINFO(enum gg_hook h, enum gg_rt rt, size_t *free_b,
                                   size_t *total_b)
{
    REAL(meminfo_fn, rt, h);
    cudaError_t r = real(free_b, total_b);
    if (r == cudaSuccess && gg_enter()) {
        int dev = gg_device_count == 1 ? 0 : gg_runtime_device(rt);
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
    REAL(entry_fn, rt, h);
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
    REAL(entry_v_fn, rt, h);
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

#define RET_RT_ALLOC cudaError_t
#define RET_RT_ASYNC cudaError_t
#define RET_RT_POOL cudaError_t
#define RET_RT_MANAGED cudaError_t
#define RET_RT_PITCH cudaError_t
#define RET_RT_3D cudaError_t
#define RET_RT_ARRAY cudaError_t
#define RET_RT_ARRAY3D cudaError_t
#define RET_RT_MIPMAP cudaError_t
#define RET_RT_FREE_ARRAY cudaError_t
#define RET_RT_FREE_MIPMAP cudaError_t
#define RET_RT_FREE cudaError_t
#define RET_RT_FREE_ASYNC cudaError_t
#define RET_RT_MEMINFO cudaError_t
#define RET_RT_ENTRY cudaError_t
#define RET_RT_ENTRY_V cudaError_t
#define RET_RT_REGISTER void **
#define SIG_RT_REGISTER (void *fat_cubin)
#define ARGS_RT_REGISTER (fat_cubin)
#define SIG_RT_ALLOC (void **p, size_t n)
#define ARGS_RT_ALLOC (p, n)
#define SIG_RT_ASYNC (void **p, size_t n, cudaStream_t s)
#define ARGS_RT_ASYNC (p, n, s)
#define SIG_RT_POOL (void **p, size_t n, cudaMemPool_t pool, cudaStream_t s)
#define ARGS_RT_POOL (p, n, pool, s)
#define SIG_RT_MANAGED (void **p, size_t n, unsigned int flags)
#define ARGS_RT_MANAGED (p, n, flags)
#define SIG_RT_PITCH (void **p, size_t *pitch, size_t w, size_t hgt)
#define ARGS_RT_PITCH (p, pitch, w, hgt)
#define SIG_RT_3D (struct cudaPitchedPtr * pp, struct cudaExtent e)
#define ARGS_RT_3D (pp, e)
#define SIG_RT_ARRAY \
    (cudaArray_t * a, const struct cudaChannelFormatDesc *desc, size_t w, size_t hgt, unsigned flags)
#define ARGS_RT_ARRAY (a, desc, w, hgt, flags)
#define SIG_RT_ARRAY3D \
    (cudaArray_t * a, const struct cudaChannelFormatDesc *desc, struct cudaExtent e, unsigned flags)
#define ARGS_RT_ARRAY3D (a, desc, e, flags)
#define SIG_RT_MIPMAP                                                                    \
    (cudaMipmappedArray_t * a, const struct cudaChannelFormatDesc *desc, struct cudaExtent e, \
     unsigned levels, unsigned flags)
#define ARGS_RT_MIPMAP (a, desc, e, levels, flags)
#define SIG_RT_FREE_ARRAY (cudaArray_t a)
#define ARGS_RT_FREE_ARRAY (a)
#define SIG_RT_FREE_MIPMAP (cudaMipmappedArray_t a)
#define ARGS_RT_FREE_MIPMAP (a)
#define SIG_RT_FREE (void *p)
#define ARGS_RT_FREE (p)
#define SIG_RT_FREE_ASYNC (void *p, cudaStream_t s)
#define ARGS_RT_FREE_ASYNC (p, s)
#define SIG_RT_MEMINFO (size_t * free_b, size_t *total_b)
#define ARGS_RT_MEMINFO (free_b, total_b)
#define SIG_RT_ENTRY \
    (const char *sym, void **fn, unsigned long long flags, enum cudaDriverEntryPointQueryResult *st)
#define ARGS_RT_ENTRY (sym, fn, flags, st)
#define SIG_RT_ENTRY_V                                                                  \
    (const char *sym, void **fn, unsigned int version, unsigned long long flags,       \
     enum cudaDriverEntryPointQueryResult *st)
#define ARGS_RT_ENTRY_V (sym, fn, version, flags, st)

#define EXPAND(...) __VA_ARGS__

/* One exported function `name` forwarding to runtime rt (the parameter
 * lists are expanded before they are pasted in). One that allocates reads
 * its own return address: the call that entered the shim, the module that
 * asked. */
#define RT_FN(name, rt, id, shape) RT_FN_(name, rt, id, shape, SIG_##shape, ARGS_##shape)
#define RT_FN_(name, rt, id, shape, sig, args)                                       \
    GG_EXPORT RET_##shape CUDARTAPI name sig;                                        \
    GG_EXPORT RET_##shape CUDARTAPI name sig                                         \
    {                                                                                \
        return body_##shape(GG_HOOK_##id, rt RA_##shape, EXPAND args);               \
    }
/* The shapes that allocate take the return address; frees and the rest
 * need none (not even its load). */
#define RA_YES , (uintptr_t)__builtin_return_address(0)
#define RA_RT_ALLOC RA_YES
#define RA_RT_ASYNC RA_YES
#define RA_RT_POOL RA_YES
#define RA_RT_MANAGED RA_YES
#define RA_RT_PITCH RA_YES
#define RA_RT_3D RA_YES
#define RA_RT_ARRAY RA_YES
#define RA_RT_ARRAY3D RA_YES
#define RA_RT_MIPMAP RA_YES
#define RA_RT_FREE
#define RA_RT_FREE_ASYNC
#define RA_RT_FREE_ARRAY
#define RA_RT_FREE_MIPMAP
#define RA_RT_MEMINFO
#define RA_RT_ENTRY RA_YES
#define RA_RT_ENTRY_V RA_YES
#define RA_RT_REGISTER

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
