/* hook_driver.c - layer 6: the driver's allocation functions, handed out
 * wherever a pointer to them is looked up (DESIGN.md sections 2.1-2.3).
 *
 * Every DRV row of hooks.def gets four variants: by origin (a driver lookup,
 * or an entry point) and by stream (the legacy or the per-thread default
 * stream: the driver hands out a different real function for each). The
 * real function behind a variant is stored when the hook is handed out.
 *
 * The shim exports no driver names: a driver that takes its own functions'
 * addresses through its GOT would otherwise hand the shim's exports to every
 * static runtime, and NCCL's memory would be counted as refusable.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "device.h"
#include "driver.h"
#include "gate.h"
#include "guard.h"
#include "hooks.h"
#include "ledger.h"
#include "prim.h"
#include "react.h"
#include "settings.h"

const struct gg_hook_info gg_hooks[GG_HOOK_COUNT] = {
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) \
    [GG_HOOK_##id] = {#export, #base, journal, min, max, GG_FAMILY_##family, ptsz},
#define GG_FAMILY_RT false
#define GG_FAMILY_DRV true
#include "hooks.def"
#undef HOOK
};

bool gg_hooks_driver_enabled(void)
{
    static _Atomic int enabled = -1;
    int e = atomic_load_explicit(&enabled, memory_order_relaxed);
    if (gg_unlikely(e < 0)) {
        const char *v = getenv(gg_setting_info[GG_SET_driver_hooks].env);
        const char *why;
        bool on = true;
        if (v && *v && gg_value_bool(v, &on, &why) != 0)
            on = true; /* a bad value is said when the settings are read */
        e = on;
        atomic_store_explicit(&enabled, e, memory_order_relaxed);
    }
    return e;
}

/* ---- the real functions ------------------------------------------------------- */

static void *_Atomic real_fn[GG_HOOK_COUNT][2];

/* Not stored yet (a race with the lookup that handed the hook out): ask
 * libcuda itself. */
static GG_COLD void *real_slow(enum gg_hook h, int ptsz)
{
    char name[80];
    snprintf(name, sizeof name, "%s%s", gg_hooks[h].export, ptsz ? "_ptsz" : "");
    void *p = gg_driver_sym(name);
    if (p)
        atomic_store_explicit(&real_fn[h][ptsz], p, memory_order_release);
    return p;
}

static inline void *real_of(enum gg_hook h, int v)
{
    int ptsz = (v & 1) && gg_hooks[h].ptsz;
    void *p = atomic_load_explicit(&real_fn[h][ptsz], memory_order_acquire);
    return gg_likely(p != NULL) ? p : real_slow(h, ptsz);
}

/* ---- the bodies, one per shape ------------------------------------------------- */

/* Who may be refused: a driver lookup's caller only under enforce = all,
 * an entry point's always (2.3). */
static inline uint8_t refusable(int v)
{
    return (v >> 1) == GG_ORIGIN_ENTRY ? GG_REFUSABLE : GG_REFUSABLE_UNDER_ALL;
}

static inline bool begin(struct gg_call *c, enum gg_hook h, uint64_t bytes, int dev,
                         uint8_t may_refuse)
{
    if (!bytes || !gg_enter())
        return false;
    c->dev = dev >= 0 ? dev : gg_driver_current_device();
    c->api = (uint8_t)h;
    c->api_name = gg_hooks[h].journal;
    c->refusable = may_refuse;
    c->runtime = false;
    c->bytes = bytes;
    return true;
}

static GG_COLD CUresult refuse(const struct gg_call *c, const struct gg_verdict *v)
{
    gg_react(c, v);
    gg_leave();
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static inline CUresult alloc_end(struct gg_call *c, struct gg_verdict *v, CUresult r, uintptr_t key)
{
    if (r == CUDA_SUCCESS)
        gg_guard_allocated(c, key, v);
    else
        gg_guard_failed(c, r == CUDA_ERROR_OUT_OF_MEMORY, v);
    if (gg_unlikely(gg_verdict_any(v)))
        gg_react(c, v);
    gg_leave();
    return r;
}

/* A free: forget first (the address may be handed out again the moment the
 * real free returns), and put it back if the real free fails. */
static inline CUresult free_end(bool known, const struct gg_entry *e, uint32_t ticket,
                                const struct gg_verdict *v, CUresult r)
{
    if (known && r != CUDA_SUCCESS)
        gg_guard_unrelease(e, ticket);
    else if (known && gg_unlikely(gg_verdict_any(v)))
        gg_react_free(e->dev, v);
    gg_leave();
    return r;
}

/* The body of an allocation of `bytes` on `dev` (-1: the current context's),
 * whose real call is `CALL` and whose new key is `KEY`. */
#define ALLOC_BODY(h, v, bytes, dev, may_refuse, CALL, KEY)        \
    do {                                                           \
        struct gg_call c;                                          \
        struct gg_verdict vd;                                      \
        if (!begin(&c, h, bytes, dev, may_refuse))                 \
            return CALL;                                           \
        if (!gg_guard_admit(&c, &vd))                              \
            return refuse(&c, &vd);                                \
        CUresult r = CALL;                                         \
        return alloc_end(&c, &vd, r, r == CUDA_SUCCESS ? (KEY) : 0); \
    } while (0)

#define REAL(type, h, v) ((type)real_of(h, v))
#define MISSING(fn) \
    if (gg_unlikely(!fn)) \
        return CUDA_ERROR_NOT_INITIALIZED

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static CUresult body_DRV_ALLOC(enum gg_hook h, int v, CUdeviceptr *p, size_t n)
{
    alloc_fn real = REAL(alloc_fn, h, v);
    MISSING(real);
    ALLOC_BODY(h, v, n, -1, refusable(v), real(p, n), p ? (uintptr_t)*p : 0);
}

typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
static CUresult body_DRV_PITCH(enum gg_hook h, int v, CUdeviceptr *p, size_t *pitch, size_t w,
                               size_t hgt, unsigned elem)
{
    pitch_fn real = REAL(pitch_fn, h, v);
    uint64_t bytes;
    MISSING(real);
    if (__builtin_mul_overflow((uint64_t)w, (uint64_t)hgt, &bytes))
        bytes = UINT64_MAX; /* cannot be had: the guard refuses or the driver fails */
    struct gg_call c;
    struct gg_verdict vd;
    if (!begin(&c, h, bytes, -1, refusable(v)))
        return real(p, pitch, w, hgt, elem);
    if (!gg_guard_admit(&c, &vd))
        return refuse(&c, &vd);
    CUresult r = real(p, pitch, w, hgt, elem);
    if (r == CUDA_SUCCESS && pitch && !__builtin_mul_overflow((uint64_t)*pitch, (uint64_t)hgt, &bytes))
        c.bytes = bytes; /* what the device really gave */
    return alloc_end(&c, &vd, r, r == CUDA_SUCCESS && p ? (uintptr_t)*p : 0);
}

typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned);
static CUresult body_DRV_MANAGED(enum gg_hook h, int v, CUdeviceptr *p, size_t n, unsigned f)
{
    managed_fn real = REAL(managed_fn, h, v);
    MISSING(real);
    /* Managed memory may oversubscribe the device: counted, never refused. */
    ALLOC_BODY(h, v, n, -1, GG_REFUSABLE_NEVER, real(p, n, f), p ? (uintptr_t)*p : 0);
}

typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
static CUresult body_DRV_ASYNC(enum gg_hook h, int v, CUdeviceptr *p, size_t n, CUstream s)
{
    async_fn real = REAL(async_fn, h, v);
    MISSING(real);
    ALLOC_BODY(h, v, n, -1, refusable(v), real(p, n, s), p ? (uintptr_t)*p : 0);
}

typedef CUresult (*pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult body_DRV_POOL(enum gg_hook h, int v, CUdeviceptr *p, size_t n, CUmemoryPool m,
                              CUstream s)
{
    pool_fn real = REAL(pool_fn, h, v);
    MISSING(real);
    ALLOC_BODY(h, v, n, -1, refusable(v), real(p, n, m, s), p ? (uintptr_t)*p : 0);
}

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
static CUresult body_DRV_CREATE(enum gg_hook h, int v, CUmemGenericAllocationHandle *hd, size_t n,
                                const CUmemAllocationProp *prop, unsigned long long f)
{
    create_fn real = REAL(create_fn, h, v);
    MISSING(real);
    /* Only device memory is the guard's: host and NUMA locations (NCCL's
     * host buffers) pass through uncounted. */
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return real(hd, n, prop, f);
    ALLOC_BODY(h, v, n, prop->location.id, refusable(v), real(hd, n, prop, f),
               hd ? gg_ledger_handle_key(*hd) : 0);
}

typedef CUresult (*free_fn)(CUdeviceptr);
static CUresult body_DRV_FREE(enum gg_hook h, int v, CUdeviceptr p)
{
    free_fn real = REAL(free_fn, h, v);
    MISSING(real);
    if (!p || !gg_enter())
        return real(p);
    struct gg_entry e;
    struct gg_verdict vd;
    uint32_t ticket;
    bool known = gg_guard_release((uintptr_t)p, &e, &ticket, &vd);
    return free_end(known, &e, ticket, &vd, real(p));
}

typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
static CUresult body_DRV_FREE_ASYNC(enum gg_hook h, int v, CUdeviceptr p, CUstream s)
{
    free_async_fn real = REAL(free_async_fn, h, v);
    MISSING(real);
    if (!p || !gg_enter())
        return real(p, s);
    struct gg_entry e;
    struct gg_verdict vd;
    uint32_t ticket;
    bool known = gg_guard_release((uintptr_t)p, &e, &ticket, &vd);
    return free_end(known, &e, ticket, &vd, real(p, s));
}

typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
static CUresult body_DRV_RELEASE(enum gg_hook h, int v, CUmemGenericAllocationHandle hd)
{
    release_fn real = REAL(release_fn, h, v);
    MISSING(real);
    if (!gg_enter())
        return real(hd);
    CUresult r = real(hd);
    /* After the real call: a handle whose release failed still holds its
     * memory, and one that is still mapped keeps it until the unmap. */
    struct gg_verdict vd;
    if (r == CUDA_SUCCESS && gg_guard_release_handle(gg_ledger_handle_key(hd), &vd) &&
        gg_unlikely(gg_verdict_any(&vd)))
        gg_react_free(-1, &vd);
    gg_leave();
    return r;
}

typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
static CUresult body_DRV_MAP(enum gg_hook h, int v, CUdeviceptr p, size_t n, size_t off,
                             CUmemGenericAllocationHandle hd, unsigned long long f)
{
    map_fn real = REAL(map_fn, h, v);
    MISSING(real);
    CUresult r = real(p, n, off, hd, f);
    if (r == CUDA_SUCCESS && gg_enter()) {
        gg_guard_mapped((uintptr_t)p, n, gg_ledger_handle_key(hd));
        gg_leave();
    }
    return r;
}

typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
static CUresult body_DRV_UNMAP(enum gg_hook h, int v, CUdeviceptr p, size_t n)
{
    unmap_fn real = REAL(unmap_fn, h, v);
    MISSING(real);
    CUresult r = real(p, n);
    if (r == CUDA_SUCCESS && gg_enter()) {
        struct gg_verdict vd;
        gg_guard_unmapped((uintptr_t)p, n, &vd);
        if (gg_unlikely(gg_verdict_any(&vd)))
            gg_react_free(-1, &vd);
        gg_leave();
    }
    return r;
}

typedef CUresult (*meminfo_fn)(size_t *, size_t *);
static CUresult body_DRV_MEMINFO(enum gg_hook h, int v, size_t *free_b, size_t *total_b)
{
    meminfo_fn real = REAL(meminfo_fn, h, v);
    MISSING(real);
    CUresult r = real(free_b, total_b);
    if (r == CUDA_SUCCESS && gg_enter()) {
        gg_guard_meminfo(gg_driver_current_device(), free_b, total_b);
        gg_leave();
    }
    return r;
}

typedef CUresult (*getproc2_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
static CUresult body_DRV_GETPROC2(enum gg_hook h, int v, const char *sym, void **pfn, int ver,
                                  cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    getproc2_fn real = REAL(getproc2_fn, h, v);
    if (gg_active())
        gg_arch_poll(); /* a runtime starting up: new modules checked before their kernels */
    MISSING(real);
    CUresult r = real(sym, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && sym && pfn && *pfn && gg_hooks_driver_enabled() && !gg_passing_through())
        *pfn = gg_hook_driver_lookup(sym, *pfn, (enum gg_origin)(v >> 1), flags, ver);
    return r;
}

typedef CUresult (*getproc1_fn)(const char *, void **, int, cuuint64_t);
static CUresult body_DRV_GETPROC1(enum gg_hook h, int v, const char *sym, void **pfn, int ver,
                                  cuuint64_t flags)
{
    getproc1_fn real = REAL(getproc1_fn, h, v);
    if (gg_active())
        gg_arch_poll(); /* a runtime starting up: new modules checked before their kernels */
    MISSING(real);
    CUresult r = real(sym, pfn, ver, flags);
    if (r == CUDA_SUCCESS && sym && pfn && *pfn && gg_hooks_driver_enabled() && !gg_passing_through())
        *pfn = gg_hook_driver_lookup(sym, *pfn, (enum gg_origin)(v >> 1), flags, ver);
    return r;
}

/* ---- the variants, from hooks.def ------------------------------------------------ */

#define SIG_DRV_ALLOC (CUdeviceptr * p, size_t n)
#define ARGS_DRV_ALLOC (p, n)
#define SIG_DRV_PITCH (CUdeviceptr * p, size_t *pitch, size_t w, size_t hgt, unsigned elem)
#define ARGS_DRV_PITCH (p, pitch, w, hgt, elem)
#define SIG_DRV_MANAGED (CUdeviceptr * p, size_t n, unsigned f)
#define ARGS_DRV_MANAGED (p, n, f)
#define SIG_DRV_ASYNC (CUdeviceptr * p, size_t n, CUstream s)
#define ARGS_DRV_ASYNC (p, n, s)
#define SIG_DRV_POOL (CUdeviceptr * p, size_t n, CUmemoryPool m, CUstream s)
#define ARGS_DRV_POOL (p, n, m, s)
#define SIG_DRV_CREATE \
    (CUmemGenericAllocationHandle * hd, size_t n, const CUmemAllocationProp *prop, unsigned long long f)
#define ARGS_DRV_CREATE (hd, n, prop, f)
#define SIG_DRV_FREE (CUdeviceptr p)
#define ARGS_DRV_FREE (p)
#define SIG_DRV_FREE_ASYNC (CUdeviceptr p, CUstream s)
#define ARGS_DRV_FREE_ASYNC (p, s)
#define SIG_DRV_RELEASE (CUmemGenericAllocationHandle hd)
#define ARGS_DRV_RELEASE (hd)
#define SIG_DRV_MAP \
    (CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle hd, unsigned long long f)
#define ARGS_DRV_MAP (p, n, off, hd, f)
#define SIG_DRV_UNMAP (CUdeviceptr p, size_t n)
#define ARGS_DRV_UNMAP (p, n)
#define SIG_DRV_MEMINFO (size_t * free_b, size_t *total_b)
#define ARGS_DRV_MEMINFO (free_b, total_b)
#define SIG_DRV_GETPROC2 \
    (const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *status)
#define ARGS_DRV_GETPROC2 (sym, pfn, ver, flags, status)
#define SIG_DRV_GETPROC1 (const char *sym, void **pfn, int ver, cuuint64_t flags)
#define ARGS_DRV_GETPROC1 (sym, pfn, ver, flags)

#define EXPAND(...) __VA_ARGS__
#define VARIANT(id, shape, v) VARIANT_(id, shape, v, SIG_##shape, ARGS_##shape)
#define VARIANT_(id, shape, v, sig, args) \
    static CUresult CUDAAPI drv_##id##_##v sig { return body_##shape(GG_HOOK_##id, v, EXPAND args); }
#define HOOK_RT(id, shape)
#define HOOK_DRV(id, shape) VARIANT(id, shape, 0) VARIANT(id, shape, 1) VARIANT(id, shape, 2) VARIANT(id, shape, 3)
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) HOOK_##family(id, shape)
#include "hooks.def"
#undef HOOK
#undef HOOK_DRV

/* variant = origin * 2 + per-thread stream */
static void *const variants[GG_HOOK_COUNT][4] = {
#define HOOK_DRV(id, shape) \
    [GG_HOOK_##id] = {(void *)drv_##id##_0, (void *)drv_##id##_1, (void *)drv_##id##_2, (void *)drv_##id##_3},
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) HOOK_##family(id, shape)
#include "hooks.def"
#undef HOOK
};

/* ---- lookups --------------------------------------------------------------------- */

static bool is_ptsz_name(const char *name, size_t *stem)
{
    size_t n = strlen(name);
    *stem = n;
    if (n > 5 && !strcmp(name + n - 5, "_ptsz")) {
        *stem = n - 5;
        return true;
    }
    return false;
}

static int by_export(const char *name, int *ptsz)
{
    size_t stem;
    *ptsz = is_ptsz_name(name, &stem);
    for (int h = 0; h < GG_HOOK_COUNT; h++) {
        const struct gg_hook_info *i = &gg_hooks[h];
        if (i->driver && strlen(i->export) == stem && !strncmp(i->export, name, stem) &&
            (!*ptsz || i->ptsz))
            return h;
    }
    return -1;
}

static int by_base(const char *name, int version)
{
    for (int h = 0; h < GG_HOOK_COUNT; h++) {
        const struct gg_hook_info *i = &gg_hooks[h];
        if (i->driver && !strcmp(i->base, name) && version >= i->min &&
            (!i->max || version <= i->max))
            return h;
    }
    return -1;
}

bool gg_hook_driver_wanted(const char *name)
{
    int ptsz;
    return by_export(name, &ptsz) >= 0;
}

static bool is_hook(const void *fn, int *h_out, int *v_out)
{
    for (int h = 0; h < GG_HOOK_COUNT; h++)
        for (int v = 0; v < 4; v++)
            if (variants[h][v] && variants[h][v] == fn) {
                *h_out = h;
                *v_out = v;
                return true;
            }
    return false;
}

static void *hand_out(int h, void *real, enum gg_origin origin, int ptsz)
{
    int hh, hv;
    if (is_hook(real, &hh, &hv)) /* already ours: only the origin changes */
        return variants[hh][origin * 2 + (hv & 1)];
    ptsz = ptsz && gg_hooks[h].ptsz;
    void *expected = NULL;
    atomic_compare_exchange_strong(&real_fn[h][ptsz], &expected, real);
    return variants[h][origin * 2 + ptsz];
}

void *gg_hook_driver_lookup(const char *name, void *real, enum gg_origin origin,
                            unsigned long long flags, int version)
{
    int h, ptsz;
    if (version < 0) {
        h = by_export(name, &ptsz);
    } else {
        h = by_base(name, version);
        ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    }
    return h < 0 ? real : hand_out(h, real, origin, ptsz);
}

void *gg_hook_driver_entry(const char *symbol, void *fn, unsigned long long flags)
{
    if (!gg_hooks_driver_enabled() || !fn || !symbol || gg_passing_through())
        return fn;
    int h, v;
    if (is_hook(fn, &h, &v))
        return variants[h][GG_ORIGIN_ENTRY * 2 + (v & 1)];
    /* The runtime asked the driver directly: trust it with the newest
     * signature of the name. */
    return gg_hook_driver_lookup(symbol, fn, GG_ORIGIN_ENTRY, flags, 1 << 30);
}
