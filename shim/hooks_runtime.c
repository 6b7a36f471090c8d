/* hooks_runtime.c - the CUDA runtime's allocation functions, as exported by
 * the shim (DESIGN.md section 2).
 *
 * Each hook finds the real function lazily (resolve.h), asks the guard
 * whether the call may go ahead, calls it, and tells the guard what came
 * back. Error codes reach the caller unchanged; a refusal is exactly
 * cudaErrorMemoryAllocation, the one code PyTorch's allocator answers by
 * freeing its cache and retrying. cudaFree(NULL) and zero-size requests go
 * straight through.
 */
#include <cuda_runtime_api.h>

#include "guard.h"
#include "hooks_driver.h"
#include "init.h"
#include "journal.h"
#include "os.h"
#include "resolve.h"

/* The per-thread-default-stream forms, which the headers declare only when
 * a program is compiled for them. */
GG_EXPORT cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
GG_EXPORT cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void *, cudaStream_t);
GG_EXPORT cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void **, size_t, cudaMemPool_t,
                                                             cudaStream_t);
GG_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(
    const char *, void **, unsigned long long, enum cudaDriverEntryPointQueryResult *);
GG_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(
    const char *, void **, unsigned int, unsigned long long,
    enum cudaDriverEntryPointQueryResult *);

/* REAL(fn): the runtime's own fn, typed like the hook. */
#define REAL_SLOT(fn) static void *_Atomic real_##fn;
#define REAL(fn) ((__typeof__(&fn))gg_resolve_runtime(&real_##fn, #fn))
REAL_SLOT(cudaMalloc) REAL_SLOT(cudaFree) REAL_SLOT(cudaMallocAsync)
REAL_SLOT(cudaMallocAsync_ptsz) REAL_SLOT(cudaFreeAsync) REAL_SLOT(cudaFreeAsync_ptsz)
REAL_SLOT(cudaMallocFromPoolAsync) REAL_SLOT(cudaMallocFromPoolAsync_ptsz)
REAL_SLOT(cudaMallocManaged) REAL_SLOT(cudaMallocPitch) REAL_SLOT(cudaMemGetInfo)
REAL_SLOT(cudaGetDevice)
REAL_SLOT(cudaGetDriverEntryPoint) REAL_SLOT(cudaGetDriverEntryPoint_ptsz)
REAL_SLOT(cudaGetDriverEntryPointByVersion) REAL_SLOT(cudaGetDriverEntryPointByVersion_ptsz)

/* No runtime to forward to: the caller linked one, so this is a runtime
 * loaded in a way the search did not find. Said once. */
static GG_COLD cudaError_t missing(const char *fn)
{
    static _Atomic bool said;
    if (!atomic_exchange(&said, true))
        gg_say("cannot find the CUDA runtime's %s; the call fails", fn);
    return cudaErrorInitializationError;
}

/* The runtime allocates on its current device: ask the runtime, unless
 * there is only one. */
static inline int runtime_device(void)
{
    if (gg_device_count == 1)
        return 0;
    __typeof__(&cudaGetDevice) get = REAL(cudaGetDevice);
    int dev;
    return get && get(&dev) == cudaSuccess ? dev : -1;
}

static inline bool begin(struct gg_call *c, enum gg_api api, uint64_t bytes)
{
    if (!bytes || !gg_enter())
        return false;
    c->dev = runtime_device();
    c->api = api;
    c->bytes = bytes;
    c->enforceable = true;
    c->current = true;
    c->site = GG_SITE_NONE;
    return true;
}

/* A refusal looks like the runtime's own out-of-memory: no pointer. */
static GG_COLD cudaError_t refuse(void **p)
{
    if (p)
        *p = NULL;
    gg_leave();
    return cudaErrorMemoryAllocation;
}

static inline cudaError_t end(struct gg_call *c, cudaError_t r, void **p)
{
    if (r == cudaSuccess)
        gg_guard_allocated(c, p ? (uintptr_t)*p : 0);
    else
        gg_guard_failed(c, r == cudaErrorMemoryAllocation);
    gg_leave();
    return r;
}

static GG_COLD void unknown_free(const void *p, cudaError_t r)
{
    /* A free the runtime accepted of memory the shim never saw allocated
     * (made through a path it does not hook). Counted; said once. */
    if (r != cudaSuccess)
        return;
    int dev = runtime_device();
    if (dev >= 0 && dev < GG_MAX_DEVICES)
        atomic_fetch_add(&gg_ledger_counters[dev].unknown_frees, 1);
    static _Atomic bool said;
    if (!atomic_exchange(&said, true))
        gg_journal_error("freed %p, which gpuguard did not see allocated; forwarded untouched "
                         "(said once, counted in the summary)", p);
}

static inline cudaError_t free_end(void *p, bool known, const struct gg_alloc *a, cudaError_t r)
{
    if (known && r != cudaSuccess)
        gg_guard_unrelease(a);
    else if (!known)
        unknown_free(p, r);
    gg_leave();
    return r;
}

/* ---- allocation ----------------------------------------------------------- */

GG_EXPORT cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size)
{
    __typeof__(&cudaMalloc) real = REAL(cudaMalloc);
    struct gg_call c;
    if (gg_unlikely(!real))
        return missing("cudaMalloc");
    if (!begin(&c, GG_API_CUDA_MALLOC, size))
        return real(devPtr, size);
    if (!gg_guard_admit(&c))
        return refuse(devPtr);
    return end(&c, real(devPtr, size), devPtr);
}

/* The stream-ordered forms share one body per shape. */
static cudaError_t malloc_async(__typeof__(&cudaMallocAsync) real, const char *name,
                                void **devPtr, size_t size, cudaStream_t s)
{
    struct gg_call c;
    if (gg_unlikely(!real))
        return missing(name);
    if (!begin(&c, GG_API_CUDA_MALLOC_ASYNC, size))
        return real(devPtr, size, s);
    if (!gg_guard_admit(&c))
        return refuse(devPtr);
    return end(&c, real(devPtr, size, s), devPtr);
}

GG_EXPORT cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s)
{
    return malloc_async(REAL(cudaMallocAsync), "cudaMallocAsync", devPtr, size, s);
}

GG_EXPORT cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s)
{
    return malloc_async(REAL(cudaMallocAsync_ptsz), "cudaMallocAsync_ptsz", devPtr, size, s);
}

static cudaError_t malloc_pool(__typeof__(&cudaMallocFromPoolAsync) real, const char *name,
                               void **p, size_t size, cudaMemPool_t pool, cudaStream_t s)
{
    struct gg_call c;
    if (gg_unlikely(!real))
        return missing(name);
    if (!begin(&c, GG_API_CUDA_MALLOC_FROM_POOL, size))
        return real(p, size, pool, s);
    if (!gg_guard_admit(&c))
        return refuse(p);
    return end(&c, real(p, size, pool, s), p);
}

GG_EXPORT cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                                        cudaStream_t s)
{
    return malloc_pool(REAL(cudaMallocFromPoolAsync), "cudaMallocFromPoolAsync", p, size, pool, s);
}

GG_EXPORT cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void **p, size_t size,
                                                             cudaMemPool_t pool, cudaStream_t s)
{
    return malloc_pool(REAL(cudaMallocFromPoolAsync_ptsz), "cudaMallocFromPoolAsync_ptsz", p,
                       size, pool, s);
}

GG_EXPORT cudaError_t CUDARTAPI cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    __typeof__(&cudaMallocManaged) real = REAL(cudaMallocManaged);
    struct gg_call c;
    if (gg_unlikely(!real))
        return missing("cudaMallocManaged");
    if (!begin(&c, GG_API_CUDA_MALLOC_MANAGED, size))
        return real(devPtr, size, flags);
    c.enforceable = false; /* managed memory may oversubscribe the device */
    if (!gg_guard_admit(&c))
        return refuse(devPtr);
    return end(&c, real(devPtr, size, flags), devPtr);
}

GG_EXPORT cudaError_t CUDARTAPI cudaMallocPitch(void **devPtr, size_t *pitch, size_t width,
                                                size_t height)
{
    __typeof__(&cudaMallocPitch) real = REAL(cudaMallocPitch);
    struct gg_call c;
    if (gg_unlikely(!real))
        return missing("cudaMallocPitch");
    if (!begin(&c, GG_API_CUDA_MALLOC_PITCH, (uint64_t)width * height))
        return real(devPtr, pitch, width, height);
    if (!gg_guard_admit(&c))
        return refuse(devPtr);
    cudaError_t r = real(devPtr, pitch, width, height);
    if (r == cudaSuccess && pitch)
        c.bytes = (uint64_t)*pitch * height; /* what the device really gave */
    return end(&c, r, devPtr);
}

/* ---- free ------------------------------------------------------------------ */

GG_EXPORT cudaError_t CUDARTAPI cudaFree(void *devPtr)
{
    __typeof__(&cudaFree) real = REAL(cudaFree);
    if (gg_unlikely(!real))
        return missing("cudaFree");
    if (!devPtr || !gg_enter())
        return real(devPtr);
    struct gg_alloc a;
    bool known = gg_guard_release((uintptr_t)devPtr, &a);
    return free_end(devPtr, known, &a, real(devPtr));
}

static cudaError_t free_async(__typeof__(&cudaFreeAsync) real, const char *name, void *p,
                              cudaStream_t s)
{
    if (gg_unlikely(!real))
        return missing(name);
    if (!p || !gg_enter())
        return real(p, s);
    struct gg_alloc a;
    bool known = gg_guard_release((uintptr_t)p, &a);
    return free_end(p, known, &a, real(p, s));
}

GG_EXPORT cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t s)
{
    return free_async(REAL(cudaFreeAsync), "cudaFreeAsync", devPtr, s);
}

GG_EXPORT cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s)
{
    return free_async(REAL(cudaFreeAsync_ptsz), "cudaFreeAsync_ptsz", devPtr, s);
}

/* ---- what the device has --------------------------------------------------- */

GG_EXPORT cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    __typeof__(&cudaMemGetInfo) real = REAL(cudaMemGetInfo);
    if (gg_unlikely(!real))
        return missing("cudaMemGetInfo");
    cudaError_t r = real(free_b, total_b);
    if (r == cudaSuccess && gg_enter()) {
        gg_guard_meminfo(runtime_device(), free_b, total_b);
        gg_leave();
    }
    return r;
}

/* ---- driver entry points: PyTorch's expandable segments, CuPy ------------- */

static cudaError_t entry_point(cudaError_t r, const char *symbol, void **fn,
                               unsigned long long flags)
{
    if (r == cudaSuccess && fn && *fn)
        *fn = gg_hooks_driver_entry(symbol, *fn, flags);
    return r;
}

/* Deprecated since CUDA 12.5 in favour of the ByVersion form, and still what
 * PyTorch 2.x calls. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
GG_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char *symbol, void **fn,
                                                        unsigned long long flags,
                                                        enum cudaDriverEntryPointQueryResult *st)
{
    __typeof__(&cudaGetDriverEntryPoint) real = REAL(cudaGetDriverEntryPoint);
    if (gg_unlikely(!real))
        return missing("cudaGetDriverEntryPoint");
    return entry_point(real(symbol, fn, flags, st), symbol, fn, flags);
}

GG_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(
    const char *symbol, void **fn, unsigned long long flags, enum cudaDriverEntryPointQueryResult *st)
{
    __typeof__(&cudaGetDriverEntryPoint_ptsz) real = REAL(cudaGetDriverEntryPoint_ptsz);
    if (gg_unlikely(!real))
        return missing("cudaGetDriverEntryPoint_ptsz");
    return entry_point(real(symbol, fn, flags, st), symbol, fn, flags);
}

#pragma GCC diagnostic pop

GG_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(
    const char *symbol, void **fn, unsigned int version, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *st)
{
    __typeof__(&cudaGetDriverEntryPointByVersion) real = REAL(cudaGetDriverEntryPointByVersion);
    if (gg_unlikely(!real))
        return missing("cudaGetDriverEntryPointByVersion");
    return entry_point(real(symbol, fn, version, flags, st), symbol, fn, flags);
}

GG_EXPORT cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **fn, unsigned int version, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *st)
{
    __typeof__(&cudaGetDriverEntryPointByVersion_ptsz) real =
        REAL(cudaGetDriverEntryPointByVersion_ptsz);
    if (gg_unlikely(!real))
        return missing("cudaGetDriverEntryPointByVersion_ptsz");
    return entry_point(real(symbol, fn, version, flags, st), symbol, fn, flags);
}
