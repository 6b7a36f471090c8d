/* hooks_driver.c - the driver API's allocation functions (see hooks_driver.h).
 *
 * A table names each hooked function; every hook comes in variants by origin
 * (driver lookup or entry point) and, for stream-ordered functions, by the
 * legacy or per-thread default stream (the driver hands out a different real
 * function for each). The real functions are kept per variant.
 */
#include "hooks_driver.h"

#include <cuda.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "guard.h"
#include "init.h"
#include "os.h"
#include "resolve.h"

enum entry {
    E_MEM_ALLOC, E_MEM_FREE, E_MEM_ALLOC_PITCH, E_MEM_ALLOC_MANAGED, E_MEM_ALLOC_ASYNC,
    E_MEM_FREE_ASYNC, E_MEM_ALLOC_FROM_POOL, E_MEM_CREATE, E_MEM_RELEASE, E_MEM_GET_INFO,
    E_GET_PROC_V2, E_GET_PROC_V1, E_COUNT
};

/* origin x stream variant */
#define NV 4
#define VARIANT(origin, ptsz) ((origin) * 2 + (ptsz))

struct entry_info {
    const char *export;       /* exported symbol name */
    const char *base;         /* cuGetProcAddress name */
    int min_version;          /* the first CUDA version with this signature */
    int max_version;          /* the last, or 0 */
    bool stream;              /* has a per-thread-stream variant */
    void *hook[NV];
};

static void *_Atomic real_fn[E_COUNT][2];

static void *real_of_slow(enum entry e, int ptsz);
static struct entry_info table[E_COUNT];

/* The real function behind a hook: stored when the hook was handed out. */
static inline void *real_of(enum entry e, int ptsz)
{
    void *p = atomic_load_explicit(&real_fn[e][ptsz], memory_order_acquire);
    return gg_likely(p) ? p : real_of_slow(e, ptsz);
}

/* ---- the hook bodies ----------------------------------------------------- */

static bool begin(struct gg_call *c, enum gg_api api, uint64_t bytes, int origin, int dev)
{
    if (!bytes || !gg_enter())
        return false;
    int cur = gg_guard_current_device();
    c->dev = dev >= 0 ? dev : cur;
    c->current = c->dev == cur;
    c->api = api;
    c->bytes = bytes;
    c->enforceable = origin == GG_ORIGIN_ENTRY;
    c->site = GG_SITE_NONE;
    return true;
}

static CUresult alloc_end(struct gg_call *c, CUresult r, uintptr_t key)
{
    if (r == CUDA_SUCCESS)
        gg_guard_allocated(c, key);
    else
        gg_guard_failed(c, r == CUDA_ERROR_OUT_OF_MEMORY);
    gg_leave();
    return r;
}

typedef CUresult (*mem_alloc_fn)(CUdeviceptr *, size_t);
static CUresult mem_alloc(int v, CUdeviceptr *dptr, size_t bytes)
{
    mem_alloc_fn real = (mem_alloc_fn)real_of(E_MEM_ALLOC, 0);
    struct gg_call c;
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!begin(&c, GG_API_CU_MEM_ALLOC, bytes, v / 2, -1))
        return real(dptr, bytes);
    if (!gg_guard_admit(&c)) {
        gg_leave();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(dptr, bytes);
    return alloc_end(&c, r, r == CUDA_SUCCESS && dptr ? (uintptr_t)*dptr : 0);
}

typedef CUresult (*mem_alloc_pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
static CUresult mem_alloc_pitch(int v, CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h,
                                unsigned elem)
{
    mem_alloc_pitch_fn real = (mem_alloc_pitch_fn)real_of(E_MEM_ALLOC_PITCH, 0);
    struct gg_call c;
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!begin(&c, GG_API_CU_MEM_ALLOC_PITCH, (uint64_t)w * h, v / 2, -1))
        return real(dptr, pitch, w, h, elem);
    if (!gg_guard_admit(&c)) {
        gg_leave();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(dptr, pitch, w, h, elem);
    if (r == CUDA_SUCCESS && pitch)
        c.bytes = (uint64_t)*pitch * h;
    return alloc_end(&c, r, r == CUDA_SUCCESS && dptr ? (uintptr_t)*dptr : 0);
}

typedef CUresult (*mem_alloc_managed_fn)(CUdeviceptr *, size_t, unsigned);
static CUresult mem_alloc_managed(int v, CUdeviceptr *dptr, size_t bytes, unsigned flags)
{
    mem_alloc_managed_fn real = (mem_alloc_managed_fn)real_of(E_MEM_ALLOC_MANAGED, 0);
    struct gg_call c;
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!begin(&c, GG_API_CU_MEM_ALLOC_MANAGED, bytes, v / 2, -1))
        return real(dptr, bytes, flags);
    c.enforceable = false; /* managed memory may oversubscribe the device */
    if (!gg_guard_admit(&c)) {
        gg_leave();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(dptr, bytes, flags);
    return alloc_end(&c, r, r == CUDA_SUCCESS && dptr ? (uintptr_t)*dptr : 0);
}

typedef CUresult (*mem_alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
static CUresult mem_alloc_async(int v, CUdeviceptr *dptr, size_t bytes, CUstream s)
{
    mem_alloc_async_fn real = (mem_alloc_async_fn)real_of(E_MEM_ALLOC_ASYNC, v & 1);
    struct gg_call c;
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!begin(&c, GG_API_CU_MEM_ALLOC_ASYNC, bytes, v / 2, -1))
        return real(dptr, bytes, s);
    if (!gg_guard_admit(&c)) {
        gg_leave();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(dptr, bytes, s);
    return alloc_end(&c, r, r == CUDA_SUCCESS && dptr ? (uintptr_t)*dptr : 0);
}

typedef CUresult (*mem_alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult mem_alloc_pool(int v, CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                               CUstream s)
{
    mem_alloc_pool_fn real = (mem_alloc_pool_fn)real_of(E_MEM_ALLOC_FROM_POOL, v & 1);
    struct gg_call c;
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!begin(&c, GG_API_CU_MEM_ALLOC_FROM_POOL, bytes, v / 2, -1))
        return real(dptr, bytes, pool, s);
    if (!gg_guard_admit(&c)) {
        gg_leave();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(dptr, bytes, pool, s);
    return alloc_end(&c, r, r == CUDA_SUCCESS && dptr ? (uintptr_t)*dptr : 0);
}

/* Physical memory handles share the ledger with pointers; ~handle keeps the
 * two key spaces apart (device pointers never have the top bits set). */
static inline uintptr_t handle_key(CUmemGenericAllocationHandle h)
{
    return (uintptr_t)~h;
}

typedef CUresult (*mem_create_fn)(CUmemGenericAllocationHandle *, size_t,
                                  const CUmemAllocationProp *, unsigned long long);
static CUresult mem_create(int v, CUmemGenericAllocationHandle *h, size_t bytes,
                           const CUmemAllocationProp *prop, unsigned long long flags)
{
    mem_create_fn real = (mem_create_fn)real_of(E_MEM_CREATE, 0);
    struct gg_call c;
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    /* Only device memory is the guard's: host and NUMA locations (NCCL's
     * host buffers) pass through uncounted. */
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !begin(&c, GG_API_CU_MEM_CREATE, bytes, v / 2, prop->location.id))
        return real(h, bytes, prop, flags);
    if (!gg_guard_admit(&c)) {
        gg_leave();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = real(h, bytes, prop, flags);
    return alloc_end(&c, r, r == CUDA_SUCCESS && h ? handle_key(*h) : 0);
}

/* A free: forget first (the address may be handed out again the moment the
 * real free returns), and put it back if the real free fails. */
static CUresult free_end(bool known, const struct gg_alloc *a, CUresult r)
{
    if (known && r != CUDA_SUCCESS)
        gg_guard_unrelease(a);
    gg_leave();
    return r;
}

typedef CUresult (*mem_free_fn)(CUdeviceptr);
static CUresult mem_free(int v, CUdeviceptr p)
{
    (void)v;
    mem_free_fn real = (mem_free_fn)real_of(E_MEM_FREE, 0);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || !gg_enter())
        return real(p);
    struct gg_alloc a;
    bool known = gg_guard_release((uintptr_t)p, &a);
    return free_end(known, &a, real(p));
}

typedef CUresult (*mem_free_async_fn)(CUdeviceptr, CUstream);
static CUresult mem_free_async(int v, CUdeviceptr p, CUstream s)
{
    mem_free_async_fn real = (mem_free_async_fn)real_of(E_MEM_FREE_ASYNC, v & 1);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || !gg_enter())
        return real(p, s);
    struct gg_alloc a;
    bool known = gg_guard_release((uintptr_t)p, &a);
    return free_end(known, &a, real(p, s));
}

typedef CUresult (*mem_release_fn)(CUmemGenericAllocationHandle);
static CUresult mem_release(int v, CUmemGenericAllocationHandle h)
{
    (void)v;
    mem_release_fn real = (mem_release_fn)real_of(E_MEM_RELEASE, 0);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!gg_enter())
        return real(h);
    struct gg_alloc a;
    bool known = gg_guard_release(handle_key(h), &a);
    return free_end(known, &a, real(h));
}

typedef CUresult (*mem_get_info_fn)(size_t *, size_t *);
static CUresult mem_get_info(int v, size_t *free_b, size_t *total_b)
{
    (void)v;
    mem_get_info_fn real = (mem_get_info_fn)real_of(E_MEM_GET_INFO, 0);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(free_b, total_b);
    if (r == CUDA_SUCCESS && gg_enter()) {
        gg_guard_meminfo(gg_guard_current_device(), free_b, total_b);
        gg_leave();
    }
    return r;
}

typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);
static CUresult get_proc_v2(int v, const char *sym, void **pfn, int ver, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status)
{
    get_proc_v2_fn real = (get_proc_v2_fn)real_of(E_GET_PROC_V2, 0);
    gg_arch_poll(); /* a runtime starting up: new modules are checked before their kernels */
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(sym, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && sym && pfn && *pfn && gg_hooks_driver_enabled())
        *pfn = gg_hooks_driver_lookup(sym, *pfn, (enum gg_origin)(v / 2), flags, ver);
    return r;
}

typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);
static CUresult get_proc_v1(int v, const char *sym, void **pfn, int ver, cuuint64_t flags)
{
    get_proc_v1_fn real = (get_proc_v1_fn)real_of(E_GET_PROC_V1, 0);
    gg_arch_poll();
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(sym, pfn, ver, flags);
    if (r == CUDA_SUCCESS && sym && pfn && *pfn && gg_hooks_driver_enabled())
        *pfn = gg_hooks_driver_lookup(sym, *pfn, (enum gg_origin)(v / 2), flags, ver);
    return r;
}

/* ---- the variants -------------------------------------------------------- */

/* HOOK(name, body, variant, params, args) defines one variant's function. */
#define HOOK(fn, body, v, params, args) \
    static CUresult CUDAAPI fn params { return body(v, EXPAND args); }
#define EXPAND(...) __VA_ARGS__

#define P_ALLOC (CUdeviceptr *d, size_t b)
#define A_ALLOC (d, b)
HOOK(mem_alloc_d, mem_alloc, 0, P_ALLOC, A_ALLOC)
HOOK(mem_alloc_e, mem_alloc, 2, P_ALLOC, A_ALLOC)
#define P_PITCH (CUdeviceptr *d, size_t *p, size_t w, size_t h, unsigned e)
#define A_PITCH (d, p, w, h, e)
HOOK(mem_alloc_pitch_d, mem_alloc_pitch, 0, P_PITCH, A_PITCH)
HOOK(mem_alloc_pitch_e, mem_alloc_pitch, 2, P_PITCH, A_PITCH)
#define P_MANAGED (CUdeviceptr *d, size_t b, unsigned f)
#define A_MANAGED (d, b, f)
HOOK(mem_alloc_managed_d, mem_alloc_managed, 0, P_MANAGED, A_MANAGED)
HOOK(mem_alloc_managed_e, mem_alloc_managed, 2, P_MANAGED, A_MANAGED)
#define P_ASYNC (CUdeviceptr *d, size_t b, CUstream s)
#define A_ASYNC (d, b, s)
HOOK(mem_alloc_async_d, mem_alloc_async, 0, P_ASYNC, A_ASYNC)
HOOK(mem_alloc_async_dp, mem_alloc_async, 1, P_ASYNC, A_ASYNC)
HOOK(mem_alloc_async_e, mem_alloc_async, 2, P_ASYNC, A_ASYNC)
HOOK(mem_alloc_async_ep, mem_alloc_async, 3, P_ASYNC, A_ASYNC)
#define P_FASYNC (CUdeviceptr p, CUstream s)
#define A_FASYNC (p, s)
HOOK(mem_free_async_d, mem_free_async, 0, P_FASYNC, A_FASYNC)
HOOK(mem_free_async_dp, mem_free_async, 1, P_FASYNC, A_FASYNC)
HOOK(mem_free_async_e, mem_free_async, 2, P_FASYNC, A_FASYNC)
HOOK(mem_free_async_ep, mem_free_async, 3, P_FASYNC, A_FASYNC)
#define P_POOL (CUdeviceptr *d, size_t b, CUmemoryPool m, CUstream s)
#define A_POOL (d, b, m, s)
HOOK(mem_alloc_pool_d, mem_alloc_pool, 0, P_POOL, A_POOL)
HOOK(mem_alloc_pool_dp, mem_alloc_pool, 1, P_POOL, A_POOL)
HOOK(mem_alloc_pool_e, mem_alloc_pool, 2, P_POOL, A_POOL)
HOOK(mem_alloc_pool_ep, mem_alloc_pool, 3, P_POOL, A_POOL)
#define P_CREATE (CUmemGenericAllocationHandle *h, size_t b, const CUmemAllocationProp *p, \
                  unsigned long long f)
#define A_CREATE (h, b, p, f)
HOOK(mem_create_d, mem_create, 0, P_CREATE, A_CREATE)
HOOK(mem_create_e, mem_create, 2, P_CREATE, A_CREATE)
#define P_FREE (CUdeviceptr p)
#define A_FREE (p)
HOOK(mem_free_d, mem_free, 0, P_FREE, A_FREE)
HOOK(mem_free_e, mem_free, 2, P_FREE, A_FREE)
#define P_RELEASE (CUmemGenericAllocationHandle h)
#define A_RELEASE (h)
HOOK(mem_release_d, mem_release, 0, P_RELEASE, A_RELEASE)
HOOK(mem_release_e, mem_release, 2, P_RELEASE, A_RELEASE)
#define P_INFO (size_t *f, size_t *t)
#define A_INFO (f, t)
HOOK(mem_get_info_d, mem_get_info, 0, P_INFO, A_INFO)
HOOK(mem_get_info_e, mem_get_info, 2, P_INFO, A_INFO)
#define P_GP2 (const char *s, void **p, int v, cuuint64_t f, CUdriverProcAddressQueryResult *q)
#define A_GP2 (s, p, v, f, q)
HOOK(get_proc_v2_d, get_proc_v2, 0, P_GP2, A_GP2)
HOOK(get_proc_v2_e, get_proc_v2, 2, P_GP2, A_GP2)
#define P_GP1 (const char *s, void **p, int v, cuuint64_t f)
#define A_GP1 (s, p, v, f)
HOOK(get_proc_v1_d, get_proc_v1, 0, P_GP1, A_GP1)
HOOK(get_proc_v1_e, get_proc_v1, 2, P_GP1, A_GP1)

#define PLAIN(d, e) {(void *)d, (void *)d, (void *)e, (void *)e}
#define STREAM(d, dp, e, ep) {(void *)d, (void *)dp, (void *)e, (void *)ep}

static struct entry_info table[E_COUNT] = {
    [E_MEM_ALLOC] = {"cuMemAlloc_v2", "cuMemAlloc", 3020, 0, false, PLAIN(mem_alloc_d, mem_alloc_e)},
    [E_MEM_FREE] = {"cuMemFree_v2", "cuMemFree", 3020, 0, false, PLAIN(mem_free_d, mem_free_e)},
    [E_MEM_ALLOC_PITCH] = {"cuMemAllocPitch_v2", "cuMemAllocPitch", 3020, 0, false,
                           PLAIN(mem_alloc_pitch_d, mem_alloc_pitch_e)},
    [E_MEM_ALLOC_MANAGED] = {"cuMemAllocManaged", "cuMemAllocManaged", 6000, 0, false,
                             PLAIN(mem_alloc_managed_d, mem_alloc_managed_e)},
    [E_MEM_ALLOC_ASYNC] = {"cuMemAllocAsync", "cuMemAllocAsync", 11020, 0, true,
                           STREAM(mem_alloc_async_d, mem_alloc_async_dp, mem_alloc_async_e,
                                  mem_alloc_async_ep)},
    [E_MEM_FREE_ASYNC] = {"cuMemFreeAsync", "cuMemFreeAsync", 11020, 0, true,
                          STREAM(mem_free_async_d, mem_free_async_dp, mem_free_async_e,
                                 mem_free_async_ep)},
    [E_MEM_ALLOC_FROM_POOL] = {"cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 11020, 0,
                               true, STREAM(mem_alloc_pool_d, mem_alloc_pool_dp,
                                            mem_alloc_pool_e, mem_alloc_pool_ep)},
    [E_MEM_CREATE] = {"cuMemCreate", "cuMemCreate", 10020, 0, false,
                      PLAIN(mem_create_d, mem_create_e)},
    [E_MEM_RELEASE] = {"cuMemRelease", "cuMemRelease", 10020, 0, false,
                       PLAIN(mem_release_d, mem_release_e)},
    [E_MEM_GET_INFO] = {"cuMemGetInfo_v2", "cuMemGetInfo", 3020, 0, false,
                        PLAIN(mem_get_info_d, mem_get_info_e)},
    [E_GET_PROC_V2] = {"cuGetProcAddress_v2", "cuGetProcAddress", 12000, 0, false,
                       PLAIN(get_proc_v2_d, get_proc_v2_e)},
    [E_GET_PROC_V1] = {"cuGetProcAddress", "cuGetProcAddress", 11030, 11999, false,
                       PLAIN(get_proc_v1_d, get_proc_v1_e)},
};

/* ---- lookups -------------------------------------------------------------- */

bool gg_hooks_driver_enabled(void)
{
    static _Atomic int enabled = -1;
    int e = atomic_load_explicit(&enabled, memory_order_relaxed);
    if (gg_unlikely(e < 0)) {
        const char *v = getenv("GPUGUARD_DRIVER_HOOKS");
        e = !(v && (!strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "off") ||
                    !strcmp(v, "false")));
        atomic_store_explicit(&enabled, e, memory_order_relaxed);
    }
    return e;
}

static int by_export(const char *name)
{
    for (int e = 0; e < E_COUNT; e++)
        if (!strcmp(table[e].export, name))
            return e;
    /* The per-thread-stream exports: cuMemAllocAsync_ptsz ... */
    size_t n = strlen(name);
    if (n > 5 && !strcmp(name + n - 5, "_ptsz"))
        for (int e = 0; e < E_COUNT; e++)
            if (table[e].stream && strlen(table[e].export) == n - 5 &&
                !strncmp(table[e].export, name, n - 5))
                return e;
    return -1;
}

static int by_base(const char *name, int version)
{
    for (int e = 0; e < E_COUNT; e++)
        if (!strcmp(table[e].base, name) && version >= table[e].min_version &&
            (!table[e].max_version || version <= table[e].max_version))
            return e;
    return -1;
}

bool gg_hooks_driver_wanted(const char *name)
{
    return by_export(name) >= 0;
}

static GG_COLD void *real_of_slow(enum entry e, int ptsz)
{
    void *p;
    /* Not looked up yet (a hook handed out before its real function was
     * stored cannot happen; this covers races): ask libcuda's own scope. */
    char name[64];
    strcpy(name, table[e].export);
    if (ptsz)
        strcat(name, "_ptsz");
    p = gg_resolve_driver(name, false);
    if (p)
        atomic_store_explicit(&real_fn[e][ptsz], p, memory_order_release);
    return p;
}

static bool is_hook(const void *fn, int *e_out, int *v_out)
{
    for (int e = 0; e < E_COUNT; e++)
        for (int v = 0; v < NV; v++)
            if (table[e].hook[v] == fn) {
                *e_out = e;
                *v_out = v;
                return true;
            }
    return false;
}

static void *hand_out(int e, void *real, enum gg_origin origin, int ptsz)
{
    int he, hv;
    if (is_hook(real, &he, &hv)) /* already ours: only the origin changes */
        return table[he].hook[VARIANT(origin, hv & 1)];
    /* A driver that takes its own functions' addresses through the GOT hands
     * out the shim's exports: never store those as the real function (the
     * hook would call itself); real_of() asks libcuda's own scope instead. */
    if (!gg_resolve_in_self(real)) {
        void *expected = NULL;
        atomic_compare_exchange_strong(&real_fn[e][ptsz], &expected, real);
    }
    return table[e].hook[VARIANT(origin, table[e].stream ? ptsz : 0)];
}

void *gg_hooks_driver_lookup(const char *name, void *real, enum gg_origin origin,
                             unsigned long long flags, int version)
{
    int e, ptsz;
    if (version < 0) {
        e = by_export(name);
        size_t n = strlen(name);
        ptsz = n > 5 && !strcmp(name + n - 5, "_ptsz");
    } else {
        e = by_base(name, version);
        ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    }
    if (e < 0)
        return real;
    return hand_out(e, real, origin, ptsz);
}

void *gg_hooks_driver_entry(const char *symbol, void *fn, unsigned long long flags)
{
    if (!gg_hooks_driver_enabled() || !fn || !symbol)
        return fn;
    int he, hv;
    if (is_hook(fn, &he, &hv))
        return table[he].hook[VARIANT(GG_ORIGIN_ENTRY, hv & 1)];
    /* The runtime asked the driver directly: trust it with the newest
     * signature of the name. */
    return gg_hooks_driver_lookup(symbol, fn, GG_ORIGIN_ENTRY, flags, 1 << 30);
}
