/* hook_driver.c - layer 6: the driver's allocation functions (docs/how-it-works.md,
 * "Seeing every allocation, counting each once").
 *
 * Every DRV row of hooks.def gets two variants, by stream: the legacy or
 * the per-thread default stream (the driver hands out a different real
 * function for each). A variant is
 *   - exported under the driver's own name (export, export_ptsz), so a
 *     program linked with -lcuda binds its calls to the shim;
 *   - handed out in place of the driver's function wherever a pointer to
 *     it is looked up: dlsym on libcuda (JAX, TensorFlow, ctypes, and
 *     libcudart and static runtimes taking cuGetProcAddress), the driver's
 *     cuGetProcAddress at the version asked (each ABI of a name is its own
 *     row: a legacy v1 name gets a v1 hook, with 32-bit pointers and sizes),
 *     cudaGetDriverEntryPoint.
 * However a call arrives, who may be refused is decided by the module that
 * asked (the return address, guard.h), so a library whose driver calls bind
 * to the exports through libcuda's own tables changes nothing. A driver
 * call made inside a runtime hook (the runtime calling its driver) passes
 * through: the gate's depth (life.h) counts it once, at the runtime.
 *
 * The real function behind a variant is libcuda's, taken from libcuda's own
 * handle (never the global scope, where the exports would be found).
 */
#define __CUDA_API_VERSION_INTERNAL 1 /* the legacy (v1) declarations, as libcuda has them */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "hook_body.h"
#include "hook_shapes.def"
#include "ledger.h"
#include "settings.h"

/* ---- the real functions ------------------------------------------------------- */

static void *_Atomic real_fn[GG_HOOK_COUNT][2];

/* Not stored by a lookup (a program bound to the export, a race with the
 * lookup that handed the hook out): ask libcuda itself. */
static GG_COLD void *real_slow(enum gg_hook h, int ptsz)
{
    char name[80], why[128];
    snprintf(name, sizeof name, "%s%s", gg_hooks[h].export, ptsz ? "_ptsz" : "");
    void *p = gg_driver_sym(name);
    if (!p && gg_driver_open(false, why, sizeof why) == 0)
        p = gg_driver_sym(name);
    if (p)
        atomic_store_explicit(&real_fn[h][ptsz], p, memory_order_release);
    return p;
}

static inline void *real_of(enum gg_hook h, int ptsz)
{
    ptsz = ptsz && gg_hooks[h].ptsz;
    void *p = atomic_load_explicit(&real_fn[h][ptsz], memory_order_acquire);
    return gg_likely(p != NULL) ? p : real_slow(h, ptsz);
}

/* ---- the bodies, one per shape ------------------------------------------------- */

/* The shared body (hook_body.h), on the driver's side. Its codes are the
 * shared ones. */
_Static_assert(CUDA_SUCCESS == GG_OK && CUDA_ERROR_OUT_OF_MEMORY == GG_OOM,
               "the driver's codes are hook_body.h's");
#define SIDE GG_SIDE_DRIVER

/* Is this call the guard's to count (the pool, map and meminfo bodies)? */
static inline bool enter(void)
{
    return gg_hook_enter(SIDE);
}

/* What the caller's pointer holds (0: no pointer). */
#define KEY_OF(P) ((P) ? (uintptr_t) * (P) : 0)

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
static CUresult body_DRV_ALLOC(enum gg_hook h, int v, uintptr_t ra, CUdeviceptr *p, size_t n)
{
    alloc_fn real = (alloc_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, n, -1, GG_REFUSABLE))
        return real(p, n);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(p, n);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(p) : 0);
}

/* The legacy ABI: 32-bit device pointers and sizes (cuda.h's _v1). */
typedef CUresult (*alloc_v1_fn)(CUdeviceptr_v1 *, unsigned int);
static CUresult body_DRV_ALLOC_V1(enum gg_hook h, int v, uintptr_t ra, CUdeviceptr_v1 *p,
                                  unsigned int n)
{
    alloc_v1_fn real = (alloc_v1_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, n, -1, GG_REFUSABLE))
        return real(p, n);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(p, n);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(p) : 0);
}

/* Pitched memory: judged by what was asked, counted by what the device
 * gave (hook_body.h). */
typedef CUresult (*pitch_fn)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
static CUresult body_DRV_PITCH(enum gg_hook h, int v, uintptr_t ra, CUdeviceptr *p, size_t *pitch,
                               size_t w, size_t hgt, unsigned elem)
{
    pitch_fn real = (pitch_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, gg_hook_pitch_bytes(w, hgt), -1,
                                    GG_REFUSABLE))
        return real(p, pitch, w, hgt, elem);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(p, pitch, w, hgt, elem);
    if (r == CUDA_SUCCESS && pitch)
        gg_hook_pitched(&c, *pitch, hgt);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(p) : 0);
}

typedef CUresult (*pitch_v1_fn)(CUdeviceptr_v1 *, unsigned int *, unsigned int, unsigned int,
                                unsigned int);
static CUresult body_DRV_PITCH_V1(enum gg_hook h, int v, uintptr_t ra, CUdeviceptr_v1 *p,
                                  unsigned int *pitch, unsigned int w, unsigned int hgt,
                                  unsigned int elem)
{
    pitch_v1_fn real = (pitch_v1_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, gg_hook_pitch_bytes(w, hgt), -1,
                                    GG_REFUSABLE))
        return real(p, pitch, w, hgt, elem);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(p, pitch, w, hgt, elem);
    if (r == CUDA_SUCCESS && pitch)
        gg_hook_pitched(&c, *pitch, hgt);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(p) : 0);
}

typedef CUresult (*managed_fn)(CUdeviceptr *, size_t, unsigned);
static CUresult body_DRV_MANAGED(enum gg_hook h, int v, uintptr_t ra, CUdeviceptr *p, size_t n,
                                 unsigned f)
{
    managed_fn real = (managed_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    /* Managed memory may oversubscribe the device: counted, never refused. */
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, n, -1, GG_REFUSABLE_NEVER))
        return real(p, n, f);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(p, n, f);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(p) : 0);
}

/* Stream-ordered requests (hook_body.h's gg_hook_pool_admit): the shim sees every
 * change of a device's current pool through the driver, so what it last
 * knew is trusted. */
typedef CUresult (*async_fn)(CUdeviceptr *, size_t, CUstream);
static CUresult body_DRV_ASYNC(enum gg_hook h, int v, uintptr_t ra, CUdeviceptr *p, size_t n,
                               CUstream s)
{
    async_fn real = (async_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, n, gg_driver_stream_device(s), GG_REFUSABLE))
        return real(p, n, s);
    if (!gg_guard_pool(&c, 0, c.dev, true)) { /* a host pool's */
        CUresult r = real(p, n, s);
        return gg_hook_host_end(r, KEY_OF(p));
    }
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(p, n, s);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(p) : 0);
}

typedef CUresult (*pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult body_DRV_POOL(enum gg_hook h, int v, uintptr_t ra, CUdeviceptr *p, size_t n,
                              CUmemoryPool m, CUstream s)
{
    pool_fn real = (pool_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!m) /* no pool: the driver says what is wrong */
        return real(p, n, m, s);
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, n, -1, GG_REFUSABLE))
        return real(p, n, m, s);
    if (!gg_guard_pool(&c, (uint64_t)(uintptr_t)m, c.dev, true)) { /* a host pool's */
        CUresult r = real(p, n, m, s);
        return gg_hook_host_end(r, KEY_OF(p));
    }
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(p, n, m, s);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(p) : 0);
}

typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
static CUresult body_DRV_CREATE(enum gg_hook h, int v, uintptr_t ra,
                                CUmemGenericAllocationHandle *hd, size_t n,
                                const CUmemAllocationProp *prop, unsigned long long f)
{
    create_fn real = (create_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    /* Only device memory is the guard's: host and NUMA locations (NCCL's
     * host buffers) pass through uncounted. */
    if (!prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return real(hd, n, prop, f);
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, n, prop->location.id, GG_REFUSABLE))
        return real(hd, n, prop, f);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(hd, n, prop, f);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS && hd ? gg_ledger_handle_key(*hd) : 0);
}

/* Arrays: the bytes their extent and element size hold (arrays.h), the
 * element size from the descriptor's format and channels; one the driver
 * will reject (no descriptor, an extent it cannot hold) passes through
 * uncounted, its error the driver's. */
#define ARRAY_BYTES(D, DEPTH, FLAGS, LEVELS, BYTES)                                          \
    ((D) && gg_array_bytes((D)->Width, (D)->Height, DEPTH,                                 \
                           gg_array_format_bytes((D)->Format, (D)->NumChannels), FLAGS, LEVELS, \
                           BYTES))

typedef CUresult (*array_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
static CUresult body_DRV_ARRAY(enum gg_hook h, int v, uintptr_t ra, CUarray *a,
                               const CUDA_ARRAY_DESCRIPTOR *d)
{
    array_fn real = (array_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes;
    if (!ARRAY_BYTES(d, 0, 0, 1, &bytes))
        return real(a, d);
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, d);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(a, d);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(a) : 0);
}

typedef CUresult (*array_v1_fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR_v1 *);
static CUresult body_DRV_ARRAY_V1(enum gg_hook h, int v, uintptr_t ra, CUarray *a,
                                  const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    array_v1_fn real = (array_v1_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes;
    if (!ARRAY_BYTES(d, 0, 0, 1, &bytes))
        return real(a, d);
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, d);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(a, d);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(a) : 0);
}

typedef CUresult (*array3d_fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
static CUresult body_DRV_ARRAY3D(enum gg_hook h, int v, uintptr_t ra, CUarray *a,
                                 const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    array3d_fn real = (array3d_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes;
    if (!ARRAY_BYTES(d, d->Depth, d->Flags, 1, &bytes))
        return real(a, d);
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, d);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(a, d);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(a) : 0);
}

typedef CUresult (*array3d_v1_fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR_v1 *);
static CUresult body_DRV_ARRAY3D_V1(enum gg_hook h, int v, uintptr_t ra, CUarray *a,
                                    const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    array3d_v1_fn real = (array3d_v1_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes;
    if (!ARRAY_BYTES(d, d->Depth, d->Flags, 1, &bytes))
        return real(a, d);
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, d);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(a, d);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(a) : 0);
}

typedef CUresult (*mipmap_fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
static CUresult body_DRV_MIPMAP(enum gg_hook h, int v, uintptr_t ra, CUmipmappedArray *a,
                                const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    mipmap_fn real = (mipmap_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t bytes;
    if (!ARRAY_BYTES(d, d->Depth, d->Flags, levels, &bytes))
        return real(a, d, levels);
    struct gg_call c;
    struct gg_verdict vd;
    if (!gg_hook_begin(&c, SIDE, h, ra, bytes, -1, GG_REFUSABLE))
        return real(a, d, levels);
    if (!gg_guard_admit(&c, &vd))
        return gg_hook_refuse(SIDE, &c, &vd, NULL);
    CUresult r = real(a, d, levels);
    return gg_hook_end(&c, &vd, r, r == CUDA_SUCCESS ? KEY_OF(a) : 0);
}

typedef CUresult (*free_fn)(CUdeviceptr);
static CUresult body_DRV_FREE(enum gg_hook h, int v, CUdeviceptr p)
{
    free_fn real = (free_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, SIDE, h, (uintptr_t)p))
        return real(p);
    return gg_hook_free_done(&f, SIDE, h, false, real(p));
}

typedef CUresult (*free_v1_fn)(CUdeviceptr_v1);
static CUresult body_DRV_FREE_V1(enum gg_hook h, int v, CUdeviceptr_v1 p)
{
    free_v1_fn real = (free_v1_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, SIDE, h, (uintptr_t)p))
        return real(p);
    return gg_hook_free_done(&f, SIDE, h, false, real(p));
}

typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);
static CUresult body_DRV_FREE_ASYNC(enum gg_hook h, int v, CUdeviceptr p, CUstream s)
{
    free_async_fn real = (free_async_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, SIDE, h, (uintptr_t)p))
        return real(p, s);
    return gg_hook_free_done(&f, SIDE, h, false, real(p, s));
}

typedef CUresult (*array_free_fn)(CUarray);
static CUresult body_DRV_ARRAY_FREE(enum gg_hook h, int v, CUarray a)
{
    array_free_fn real = (array_free_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, SIDE, h, (uintptr_t)a))
        return real(a);
    return gg_hook_free_done(&f, SIDE, h, false, real(a));
}

typedef CUresult (*mipmap_free_fn)(CUmipmappedArray);
static CUresult body_DRV_MIPMAP_FREE(enum gg_hook h, int v, CUmipmappedArray a)
{
    mipmap_free_fn real = (mipmap_free_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    struct gg_hook_free f;
    if (!gg_hook_free_begin(&f, SIDE, h, (uintptr_t)a))
        return real(a);
    return gg_hook_free_done(&f, SIDE, h, false, real(a));
}

typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
static CUresult body_DRV_RELEASE(enum gg_hook h, int v,
                                 CUmemGenericAllocationHandle hd)
{
    release_fn real = (release_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!enter())
        return real(hd);
    if (gg_tracing()) /* before: the handle may be handed out again when it returns */
        gg_trace_release(gg_ledger_handle_key(hd));
    CUresult r = real(hd);
    if (r != CUDA_SUCCESS && gg_tracing())
        gg_trace_failed("release", gg_hooks[h].journal, gg_ledger_handle_key(hd), r);
    /* After the real call: a handle whose release failed still holds its
     * memory, and one that is still mapped keeps it until the unmap. */
    struct gg_verdict vd;
    if (r == CUDA_SUCCESS && gg_guard_release_handle(gg_ledger_handle_key(hd), &vd) &&
        gg_unlikely(gg_verdict_any(&vd)))
        gg_react_free(&vd);
    gg_leave();
    return r;
}

typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
static CUresult body_DRV_MAP(enum gg_hook h, int v, CUdeviceptr p, size_t n,
                             size_t off, CUmemGenericAllocationHandle hd, unsigned long long f)
{
    map_fn real = (map_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(p, n, off, hd, f);
    if (enter()) {
        if (r == CUDA_SUCCESS) {
            gg_guard_mapped((uintptr_t)p, n, gg_ledger_handle_key(hd));
            if (gg_unlikely(gg_guard_retrying)) /* a VMM retry's handles, mapped */
                gg_react_mapped();
        }
        if (gg_tracing())
            gg_trace_map((uintptr_t)p, n, gg_ledger_handle_key(hd), r);
        gg_leave();
    }
    return r;
}

typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
static CUresult body_DRV_UNMAP(enum gg_hook h, int v, CUdeviceptr p, size_t n)
{
    unmap_fn real = (unmap_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!enter())
        return real(p, n);
    if (gg_tracing()) /* before: the range may be mapped again when it returns */
        gg_trace_unmap((uintptr_t)p, n);
    CUresult r = real(p, n);
    struct gg_verdict vd;
    if (r == CUDA_SUCCESS) {
        gg_guard_unmapped((uintptr_t)p, n, &vd);
        if (gg_unlikely(gg_verdict_any(&vd)))
            gg_react_free(&vd);
    } else if (gg_tracing()) {
        gg_trace_failed("unmap", gg_hooks[h].journal, (uintptr_t)p, r);
    }
    gg_leave();
    return r;
}

/* ---- pools: made, trimmed, destroyed; synchronisations give memory back ---------- */

/* An attribute's value as a number: the thresholds and highs are 64-bit,
 * the reuse flags int; anything else is not read (its size is unknown). */
static unsigned long long attr_value(CUmemPool_attribute attr, const void *value)
{
    if (!value)
        return 0;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: return (unsigned)*(const int *)value;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: return *(const cuuint64_t *)value;
    default: return 0;
    }
}

/* A pool operation's last step, after the real call returned r and the
 * guard and the trace were told (by the outermost hook only: `in`, from
 * enter()): what the timeline must say of memory given back (vd), then the
 * gate left. */
static inline CUresult pool_op_end(const struct gg_verdict *vd, CUresult r)
{
    if (gg_unlikely(gg_verdict_any(vd)))
        gg_react_free(vd);
    gg_leave();
    return r;
}

typedef CUresult (*pool_create_fn)(CUmemoryPool *, const CUmemPoolProps *);
static CUresult body_DRV_POOL_CREATE(enum gg_hook h, int v, CUmemoryPool *pool,
                                     const CUmemPoolProps *props)
{
    pool_create_fn real = (pool_create_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    CUresult r = real(pool, props);
    if (!in)
        return r;
    /* Where its memory lives is in its properties: a device's, or the
     * host's (never counted). */
    bool device = props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    if (r == CUDA_SUCCESS && pool && props)
        gg_guard_pool_created((uint64_t)(uintptr_t)*pool, props->location.id, !device);
    if (gg_tracing())
        gg_trace_pool("create", r == CUDA_SUCCESS && pool ? (uint64_t)(uintptr_t)*pool : 0,
                      device ? props->location.id : -1, r);
    gg_leave();
    return r;
}

typedef CUresult (*pool_destroy_fn)(CUmemoryPool);
static CUresult body_DRV_POOL_DESTROY(enum gg_hook h, int v, CUmemoryPool pool)
{
    pool_destroy_fn real = (pool_destroy_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    CUresult r = real(pool);
    if (!in)
        return r;
    struct gg_verdict vd = {0};
    if (r == CUDA_SUCCESS)
        gg_guard_pool_destroyed((uint64_t)(uintptr_t)pool, &vd);
    if (gg_tracing())
        gg_trace_pool("destroy", (uint64_t)(uintptr_t)pool, 0, r);
    return pool_op_end(&vd, r);
}

typedef CUresult (*pool_trim_fn)(CUmemoryPool, size_t);
static CUresult body_DRV_POOL_TRIM(enum gg_hook h, int v, CUmemoryPool pool, size_t keep)
{
    pool_trim_fn real = (pool_trim_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    CUresult r = real(pool, keep);
    if (!in)
        return r;
    struct gg_verdict vd = {0};
    if (r == CUDA_SUCCESS)
        gg_guard_pool_trimmed((uint64_t)(uintptr_t)pool, keep, &vd);
    if (gg_tracing())
        gg_trace_pool("trim", (uint64_t)(uintptr_t)pool, (long long)keep, r);
    return pool_op_end(&vd, r);
}

typedef CUresult (*set_pool_fn)(CUdevice, CUmemoryPool);
static CUresult body_DRV_SET_POOL(enum gg_hook h, int v, CUdevice dev, CUmemoryPool pool)
{
    set_pool_fn real = (set_pool_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    CUresult r = real(dev, pool);
    if (!in)
        return r;
    if (r == CUDA_SUCCESS)
        gg_guard_current_pool((int)dev, (uint64_t)(uintptr_t)pool);
    if (gg_tracing())
        gg_trace_pool("current", (uint64_t)(uintptr_t)pool, dev, r);
    gg_leave();
    return r;
}

/* A pool's attribute: nothing the guard keeps (it reads what pools hold
 * from the driver), but what decides whether a synchronisation gives
 * memory back (the release threshold): traced. */
typedef CUresult (*pool_attr_fn)(CUmemoryPool, CUmemPool_attribute, void *);
static CUresult body_DRV_POOL_ATTR(enum gg_hook h, int v, CUmemoryPool pool,
                                   CUmemPool_attribute attr, void *value)
{
    pool_attr_fn real = (pool_attr_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    CUresult r = real(pool, attr, value);
    if (!in)
        return r;
    if (gg_tracing())
        gg_trace_pool_attr((uint64_t)(uintptr_t)pool, (int)attr, attr_value(attr, value), r);
    gg_leave();
    return r;
}

/* A synchronisation returned r: the pools may have given memory back. */
static CUresult synced(bool in, CUresult r)
{
    if (!in)
        return r;
    struct gg_verdict vd = {0};
    if (r == CUDA_SUCCESS)
        gg_guard_pools_synced(&vd);
    if (gg_tracing())
        gg_trace_pool("sync", 0, 0, r);
    return pool_op_end(&vd, r);
}

typedef CUresult (*stream_sync_fn)(CUstream);
static CUresult body_DRV_STREAM_SYNC(enum gg_hook h, int v, CUstream s)
{
    stream_sync_fn real = (stream_sync_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    return synced(in, real(s));
}

typedef CUresult (*ctx_sync_fn)(void);
static CUresult body_DRV_CTX_SYNC(enum gg_hook h, int v)
{
    ctx_sync_fn real = (ctx_sync_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    return synced(in, real());
}

typedef CUresult (*ctx_sync2_fn)(CUcontext);
static CUresult body_DRV_CTX_SYNC2(enum gg_hook h, int v, CUcontext ctx)
{
    ctx_sync2_fn real = (ctx_sync2_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter();
    return synced(in, real(ctx));
}

/* ---- what the process sees of the device ---------------------------------------- */

typedef CUresult (*meminfo_fn)(size_t *, size_t *);
static CUresult body_DRV_MEMINFO(enum gg_hook h, int v, size_t *free_b,
                                 size_t *total_b)
{
    meminfo_fn real = (meminfo_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(free_b, total_b);
    if (r == CUDA_SUCCESS && enter()) {
        int dev = gg_driver_current_device();
        gg_guard_meminfo(dev, free_b, total_b);
        if (gg_tracing() && free_b && total_b)
            gg_trace_meminfo(gg_hooks[h].journal, dev, *free_b, *total_b);
        gg_leave();
    }
    return r;
}

/* The legacy ABI reads 32-bit sizes: the driver's own clamped answer,
 * virtualized and clamped again. */
typedef CUresult (*meminfo_v1_fn)(unsigned int *, unsigned int *);
static CUresult body_DRV_MEMINFO_V1(enum gg_hook h, int v, unsigned int *free_b,
                                    unsigned int *total_b)
{
    meminfo_v1_fn real = (meminfo_v1_fn)real_of(h, v);
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    bool in = enter(); /* a driver that answers through its _v2 answers once */
    CUresult r = real(free_b, total_b);
    if (in) {
        if (r == CUDA_SUCCESS && free_b && total_b) {
            size_t f = *free_b, t = *total_b;
            gg_guard_meminfo(gg_driver_current_device(), &f, &t);
            *free_b = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
            *total_b = t > UINT32_MAX ? UINT32_MAX : (unsigned int)t;
        }
        gg_leave();
    }
    return r;
}

/* The hook for a driver function cuGetProcAddress found, traced with the
 * module that asked (ra). */
static void *getproc_handed(const char *sym, void *real, cuuint64_t flags, int ver, uintptr_t ra)
{
    void *hook = gg_hook_driver_lookup(sym, real, flags, ver);
    if ((gg_tracing() || gg_trace_early()) && gg_hook_driver_is_hook(hook))
        gg_trace_lookup("getproc", sym, ver, flags, ra);
    return hook;
}

typedef CUresult (*getproc2_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);
static CUresult body_DRV_GETPROC2(enum gg_hook h, int v, uintptr_t ra, const char *sym, void **pfn,
                                  int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    getproc2_fn real = (getproc2_fn)real_of(h, v);
    if (gg_active())
        gg_arch_poll(); /* a runtime starting up: new modules checked before their kernels */
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(sym, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS && sym && pfn && *pfn && gg_hooks_driver_enabled() && !gg_passing_through())
        *pfn = getproc_handed(sym, *pfn, flags, ver, ra);
    return r;
}

typedef CUresult (*getproc1_fn)(const char *, void **, int, cuuint64_t);
static CUresult body_DRV_GETPROC1(enum gg_hook h, int v, uintptr_t ra, const char *sym, void **pfn,
                                  int ver, cuuint64_t flags)
{
    getproc1_fn real = (getproc1_fn)real_of(h, v);
    if (gg_active())
        gg_arch_poll(); /* a runtime starting up: new modules checked before their kernels */
    if (gg_unlikely(!real))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = real(sym, pfn, ver, flags);
    if (r == CUDA_SUCCESS && sym && pfn && *pfn && gg_hooks_driver_enabled() && !gg_passing_through())
        *pfn = getproc_handed(sym, *pfn, flags, ver, ra);
    return r;
}

/* ---- the variants and exports, from hooks.def -------------------------------------- */

/* Variant v of a row: its signature, and whether its body is given the
 * caller's return address (the call that entered the shim, the module that
 * asked), from hook_shapes.def. */
#define VARIANT(id, shape, v) GG_SHAPE(VARIANT_, shape, id, shape, v)
#define VARIANT_(id, shape, v, ret, caller, params, args)                                   \
    static ret CUDAAPI drv_##id##_##v params                                                \
    {                                                                                       \
        return body_##shape(GG_HOOK_##id, v GG_SHAPE_CALLER_##caller GG_SHAPE_ARGS args);   \
    }

/* variant v of a row exported under `name`, as libcuda exports it (no
 * symbol version: a program linked against libcuda asks for none). */
#define EXPORT(id, v, name) \
    extern __typeof__(drv_##id##_##v) name __attribute__((alias("drv_" #id "_" #v), visibility("default")));

#define HOOK_RT(id, export, shape, ptsz)
#define HOOK_DRV(id, export, shape, ptsz) \
    VARIANT(id, shape, 0) VARIANT(id, shape, 1) EXPORT(id, 0, export) EXPORT_PTSZ_##ptsz(id, export)
#define EXPORT_PTSZ_0(id, export)
#define EXPORT_PTSZ_1(id, export) EXPORT(id, 1, export##_ptsz)
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) \
    HOOK_##family(id, export, shape, ptsz)
#include "hooks.def"
#undef HOOK
#undef HOOK_DRV

/* variant = per-thread default stream (0: legacy) */
static void *const variants[GG_HOOK_COUNT][2] = {
#define HOOK_DRV(id, export, shape, ptsz) [GG_HOOK_##id] = {(void *)drv_##id##_0, (void *)drv_##id##_1},
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) \
    HOOK_##family(id, export, shape, ptsz)
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
        for (int v = 0; v < 2; v++)
            if (variants[h][v] && variants[h][v] == fn) {
                *h_out = h;
                *v_out = v;
                return true;
            }
    return false;
}

bool gg_hook_driver_is_hook(const void *fn)
{
    int h, v;
    return fn && is_hook(fn, &h, &v);
}

static void *hand_out(int h, void *real, int ptsz)
{
    int hh, hv;
    if (is_hook(real, &hh, &hv)) /* already ours (libcuda's tables may hold the exports) */
        return real;
    ptsz = ptsz && gg_hooks[h].ptsz;
    void *expected = NULL;
    atomic_compare_exchange_strong(&real_fn[h][ptsz], &expected, real);
    return variants[h][ptsz];
}

void *gg_hook_driver_lookup(const char *name, void *real, unsigned long long flags, int version)
{
    int h, ptsz;
    if (version < 0) {
        h = by_export(name, &ptsz);
    } else {
        h = by_base(name, version);
        ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    }
    return h < 0 ? real : hand_out(h, real, ptsz);
}

void *gg_hook_driver_entry(const char *symbol, void *fn, unsigned long long flags, int version)
{
    if (!gg_hooks_driver_enabled() || !fn || !symbol || gg_passing_through())
        return fn;
    int h, v;
    if (is_hook(fn, &h, &v))
        return fn;
    /* The runtime asked the driver without the shim's cuGetProcAddress:
     * which ABI is it? The driver's export it is, else the one of the
     * version the runtime asked for. Never a newer one: a legacy caller
     * handed a _v2 would get a 64-bit pointer in its 32-bit slot. */
    for (h = 0; h < GG_HOOK_COUNT; h++) {
        const struct gg_hook_info *i = &gg_hooks[h];
        char name[80];
        if (!i->driver || strcmp(i->base, symbol) != 0)
            continue;
        if (gg_driver_sym(i->export) == fn)
            return hand_out(h, fn, 0);
        snprintf(name, sizeof name, "%s_ptsz", i->export);
        if (i->ptsz && gg_driver_sym(name) == fn)
            return hand_out(h, fn, 1);
    }
    return version > 0 ? gg_hook_driver_lookup(symbol, fn, flags, version) : fn;
}
