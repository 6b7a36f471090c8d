/*
 * torchlike.c - a PyTorch-like CUDA caching allocator (libtorchlike.so).
 *
 * What matters to the shim is copied from c10/cuda/CUDACachingAllocator.cpp:
 *   - requests are rounded to 512 bytes; those <= 1 MiB are carved from 2 MiB
 *     segments, those < 10 MiB from 20 MiB segments, larger ones get their own
 *     segment rounded up to 2 MiB;
 *   - cudaMalloc only for whole segments, cudaFree only when the cache is
 *     flushed (tl_empty_cache, or the OOM retry);
 *   - on cudaErrorMemoryAllocation (exactly that code) it frees every cached
 *     segment and retries once; any other code is returned at once;
 *   - the OOM message: "CUDA out of memory. Tried to allocate 2.00 GiB. ...";
 *   - expandable segments: cuMemCreate/cuMemAddressReserve/cuMemMap/
 *     cuMemSetAccess/cuMemUnmap/cuMemRelease/cuMemAddressFree taken through
 *     cudaGetDriverEntryPoint; only CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate
 *     is treated as an OOM.  Turned on with tl_set_expandable(1) or
 *     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
 * One mutex guards everything, as in PyTorch (per device there).
 */
#define CUDA_ENABLE_DEPRECATED 1 /* cudaGetDriverEntryPoint, as PyTorch uses it */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The exported C API. */
int tl_malloc(size_t size, void **out);
void tl_free(void *p);
void tl_empty_cache(void);
unsigned long long tl_reserved(void);
unsigned long long tl_max_reserved(void);
unsigned long long tl_allocated(void);
int tl_set_device(int dev);
void tl_set_expandable(int on);
const char *tl_last_error(void);

#define MiB          (1ULL << 20)
#define kMinBlock    512ULL
#define kSmallSize   (1 * MiB)
#define kSmallBuffer (2 * MiB)
#define kLargeBuffer (20 * MiB)
#define kMinLarge    (10 * MiB)
#define kRoundLarge  (2 * MiB)

enum { P_SMALL, P_MEDIUM, P_LARGE, NPOOL };

struct seg;

struct block {
    struct seg *seg;
    uintptr_t ptr;
    size_t size;
    int free;
    struct block *prev, *next;   /* neighbours in the segment, by address */
    struct block *fprev, *fnext; /* free list of the pool */
    struct block *hnext;         /* live-pointer hash chain */
};

struct seg {
    uintptr_t ptr;
    size_t size;
    int dev, pool, vmm;
    CUmemGenericAllocationHandle handle;
    struct block *first;
    struct seg *prev, *next;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg *g_segs;
static struct block *g_free[NPOOL];
static unsigned long long g_reserved, g_max_reserved, g_allocated;
static int g_expandable = -1; /* -1: not decided yet (environment) */

static struct block **g_ht;
static size_t g_ht_mask, g_ht_n;

static __thread char t_err[512];

/* Driver entry points for expandable segments. */
static struct {
    int loaded;
    CUresult (*Create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*Release)(CUmemGenericAllocationHandle);
    CUresult (*AddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*AddressFree)(CUdeviceptr, size_t);
    CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*Unmap)(CUdeviceptr, size_t);
    CUresult (*SetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
} V;

/* ------------------------------------------------------------------------ */

static size_t hslot(uintptr_t p)
{
    uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 32) & g_ht_mask;
}

static int ht_grow(void)
{
    size_t nb = g_ht ? (g_ht_mask + 1) * 2 : 1024;
    struct block **t = calloc(nb, sizeof *t);
    if (!t)
        return -1;
    struct block **old = g_ht;
    size_t oldn = g_ht ? g_ht_mask + 1 : 0;
    g_ht = t;
    g_ht_mask = nb - 1;
    for (size_t i = 0; i < oldn; i++) {
        struct block *b = old[i];
        while (b) {
            struct block *nx = b->hnext;
            size_t j = hslot(b->ptr);
            b->hnext = g_ht[j];
            g_ht[j] = b;
            b = nx;
        }
    }
    free(old);
    return 0;
}

static int ht_insert(struct block *b)
{
    if ((!g_ht || g_ht_n >= g_ht_mask + 1) && ht_grow() != 0 && !g_ht)
        return -1;
    size_t j = hslot(b->ptr);
    b->hnext = g_ht[j];
    g_ht[j] = b;
    g_ht_n++;
    return 0;
}

static struct block *ht_remove(uintptr_t p)
{
    if (!g_ht)
        return NULL;
    for (struct block **pp = &g_ht[hslot(p)]; *pp; pp = &(*pp)->hnext) {
        if ((*pp)->ptr == p) {
            struct block *b = *pp;
            *pp = b->hnext;
            g_ht_n--;
            return b;
        }
    }
    return NULL;
}

static void free_list_add(struct block *b)
{
    int pool = b->seg->pool;
    b->free = 1;
    b->fprev = NULL;
    b->fnext = g_free[pool];
    if (g_free[pool])
        g_free[pool]->fprev = b;
    g_free[pool] = b;
}

static void free_list_del(struct block *b)
{
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        g_free[b->seg->pool] = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
    b->free = 0;
}

static const char *fmt_size(char *buf, size_t n, unsigned long long size)
{
    if (size <= 1024)
        snprintf(buf, n, "%llu bytes", size);
    else if (size <= 1048576)
        snprintf(buf, n, "%.2f KiB", size / 1024.0);
    else if (size <= 1073741824ULL)
        snprintf(buf, n, "%.2f MiB", size / 1048576.0);
    else
        snprintf(buf, n, "%.2f GiB", size / 1073741824.0);
    return buf;
}

/* ------------------------------------------------------------------------ */
/* Segments                                                                  */

static int load_vmm(void)
{
    if (V.loaded)
        return 0;
    static const char *names[] = {"cuMemCreate", "cuMemRelease", "cuMemAddressReserve",
                                  "cuMemAddressFree", "cuMemMap", "cuMemUnmap", "cuMemSetAccess"};
    void *fns[7];
    for (int i = 0; i < 7; i++) {
        enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
        cudaError_t e = cudaGetDriverEntryPoint(names[i], &fns[i], cudaEnableDefault, &st);
        if (e != cudaSuccess)
            return (int)e;
        if (!fns[i] || st != cudaDriverEntryPointSuccess)
            return (int)cudaErrorNotSupported;
    }
    V.Create = (__typeof__(V.Create))fns[0];
    V.Release = (__typeof__(V.Release))fns[1];
    V.AddressReserve = (__typeof__(V.AddressReserve))fns[2];
    V.AddressFree = (__typeof__(V.AddressFree))fns[3];
    V.Map = (__typeof__(V.Map))fns[4];
    V.Unmap = (__typeof__(V.Unmap))fns[5];
    V.SetAccess = (__typeof__(V.SetAccess))fns[6];
    V.loaded = 1;
    return 0;
}

/* Returns a cudaError_t value; cudaErrorMemoryAllocation means "out of memory". */
static int seg_map_vmm(int dev, size_t size, uintptr_t *out, CUmemGenericAllocationHandle *hout)
{
    int e = load_vmm();
    if (e)
        return e;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    CUmemGenericAllocationHandle h;
    CUresult r = V.Create(&h, size, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return (int)cudaErrorMemoryAllocation;
    if (r != CUDA_SUCCESS)
        return (int)r;
    CUdeviceptr va = 0;
    if ((r = V.AddressReserve(&va, size, 0, 0, 0)) != CUDA_SUCCESS) {
        V.Release(h);
        return (int)r;
    }
    if ((r = V.Map(va, size, 0, h, 0)) != CUDA_SUCCESS) {
        V.AddressFree(va, size);
        V.Release(h);
        return (int)r;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = V.SetAccess(va, size, &acc, 1)) != CUDA_SUCCESS) {
        V.Unmap(va, size);
        V.AddressFree(va, size);
        V.Release(h);
        return (int)r;
    }
    *out = (uintptr_t)va;
    *hout = h;
    return 0;
}

static int seg_alloc(int dev, size_t size, int pool, struct seg **out)
{
    struct seg *s = calloc(1, sizeof *s);
    struct block *b = calloc(1, sizeof *b);
    if (!s || !b) {
        free(s);
        free(b);
        return (int)cudaErrorMemoryAllocation;
    }
    int e;
    if (g_expandable > 0) {
        e = seg_map_vmm(dev, size, &s->ptr, &s->handle);
        s->vmm = 1;
    } else {
        void *p = NULL;
        e = (int)cudaMalloc(&p, size);
        s->ptr = (uintptr_t)p;
    }
    if (e) {
        free(s);
        free(b);
        return e;
    }
    s->size = size;
    s->dev = dev;
    s->pool = pool;
    s->first = b;
    b->seg = s;
    b->ptr = s->ptr;
    b->size = size;
    s->next = g_segs;
    if (g_segs)
        g_segs->prev = s;
    g_segs = s;
    g_reserved += size;
    if (g_reserved > g_max_reserved)
        g_max_reserved = g_reserved;
    free_list_add(b);
    *out = s;
    return 0;
}

static void seg_release(struct seg *s)
{
    if (s->vmm) {
        V.Unmap((CUdeviceptr)s->ptr, s->size);
        V.Release(s->handle);
        V.AddressFree((CUdeviceptr)s->ptr, s->size);
    } else {
        (void)cudaFree((void *)s->ptr);
    }
    g_reserved -= s->size;
    if (s->prev)
        s->prev->next = s->next;
    else
        g_segs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s->first);
    free(s);
}

/* Every segment that is one free block goes back to the device. */
static void release_cached(void)
{
    struct seg *s = g_segs;
    while (s) {
        struct seg *nx = s->next;
        struct block *b = s->first;
        if (b->free && !b->next && b->size == s->size) {
            free_list_del(b);
            seg_release(s);
        }
        s = nx;
    }
}

static struct block *find_free(int pool, int dev, size_t size)
{
    struct block *best = NULL;
    for (struct block *b = g_free[pool]; b; b = b->fnext) {
        if (b->seg->dev != dev || b->size < size)
            continue;
        if (pool == P_LARGE && b->size != b->seg->size)
            continue;
        if (!best || b->size < best->size)
            best = b;
    }
    return best;
}

/* ------------------------------------------------------------------------ */
/* API                                                                       */

static void decide_expandable(void)
{
    if (g_expandable >= 0)
        return;
    const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    g_expandable = conf && strstr(conf, "expandable_segments:True") ? 1 : 0;
}

static void oom_message(size_t alloc_size, int dev)
{
    size_t free_b = 0, total = 0;
    (void)cudaMemGetInfo(&free_b, &total);
    (void)cudaGetLastError();
    char a[32], t[32], f[32], al[32], un[32];
    snprintf(t_err, sizeof t_err,
             "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of "
             "which %s is free. Of the allocated memory %s is allocated by PyTorch, and %s is "
             "reserved by PyTorch but unallocated.",
             fmt_size(a, sizeof a, alloc_size), dev, fmt_size(t, sizeof t, total),
             fmt_size(f, sizeof f, free_b), fmt_size(al, sizeof al, g_allocated),
             fmt_size(un, sizeof un, g_reserved - g_allocated));
}

int tl_malloc(size_t size, void **out)
{
    if (!out)
        return (int)cudaErrorInvalidValue;
    *out = NULL;
    t_err[0] = 0;
    if (size == 0)
        return 0;
    int dev = 0;
    cudaError_t ce = cudaGetDevice(&dev);
    if (ce != cudaSuccess) {
        snprintf(t_err, sizeof t_err, "CUDA error: %s", cudaGetErrorString(ce));
        return (int)ce;
    }
    size_t rs = size < kMinBlock ? kMinBlock : (size + kMinBlock - 1) & ~(size_t)(kMinBlock - 1);
    int pool = rs <= kSmallSize ? P_SMALL : rs < kMinLarge ? P_MEDIUM : P_LARGE;
    size_t seg_size = pool == P_SMALL    ? kSmallBuffer
                      : pool == P_MEDIUM ? kLargeBuffer
                                         : (rs + kRoundLarge - 1) & ~(size_t)(kRoundLarge - 1);

    pthread_mutex_lock(&g_mu);
    decide_expandable();
    struct block *b = find_free(pool, dev, rs);
    if (!b) {
        struct seg *s = NULL;
        int e = seg_alloc(dev, seg_size, pool, &s);
        if (e == (int)cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            release_cached();
            e = seg_alloc(dev, seg_size, pool, &s);
        }
        if (e) {
            if (e == (int)cudaErrorMemoryAllocation)
                oom_message(seg_size, dev);
            else
                snprintf(t_err, sizeof t_err, "CUDA error: %s",
                         cudaGetErrorString((cudaError_t)e));
            (void)cudaGetLastError();
            pthread_mutex_unlock(&g_mu);
            return e;
        }
        b = s->first;
    }
    free_list_del(b);
    if (pool != P_LARGE && b->size - rs >= kMinBlock) {
        struct block *rest = calloc(1, sizeof *rest);
        if (rest) {
            rest->seg = b->seg;
            rest->ptr = b->ptr + rs;
            rest->size = b->size - rs;
            rest->prev = b;
            rest->next = b->next;
            if (b->next)
                b->next->prev = rest;
            b->next = rest;
            b->size = rs;
            free_list_add(rest);
        }
    }
    if (ht_insert(b) != 0) {
        free_list_add(b);
        snprintf(t_err, sizeof t_err, "CUDA error: out of host memory");
        pthread_mutex_unlock(&g_mu);
        return (int)cudaErrorMemoryAllocation;
    }
    g_allocated += b->size;
    *out = (void *)b->ptr;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

void tl_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&g_mu);
    struct block *b = ht_remove((uintptr_t)p);
    if (!b) {
        pthread_mutex_unlock(&g_mu);
        snprintf(t_err, sizeof t_err, "invalid device pointer: %p", p);
        return;
    }
    g_allocated -= b->size;
    /* Merge with free neighbours in the same segment. */
    struct block *n = b->next;
    if (n && n->free) {
        free_list_del(n);
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        free(n);
    }
    struct block *pv = b->prev;
    if (pv && pv->free) {
        free_list_del(pv);
        pv->size += b->size;
        pv->next = b->next;
        if (b->next)
            b->next->prev = pv;
        free(b);
        b = pv;
    }
    free_list_add(b);
    pthread_mutex_unlock(&g_mu);
}

void tl_empty_cache(void)
{
    pthread_mutex_lock(&g_mu);
    release_cached();
    pthread_mutex_unlock(&g_mu);
}

unsigned long long tl_reserved(void)
{
    pthread_mutex_lock(&g_mu);
    unsigned long long v = g_reserved;
    pthread_mutex_unlock(&g_mu);
    return v;
}

unsigned long long tl_max_reserved(void)
{
    pthread_mutex_lock(&g_mu);
    unsigned long long v = g_max_reserved;
    pthread_mutex_unlock(&g_mu);
    return v;
}

unsigned long long tl_allocated(void)
{
    pthread_mutex_lock(&g_mu);
    unsigned long long v = g_allocated;
    pthread_mutex_unlock(&g_mu);
    return v;
}

int tl_set_device(int dev)
{
    return (int)cudaSetDevice(dev);
}

void tl_set_expandable(int on)
{
    pthread_mutex_lock(&g_mu);
    g_expandable = on ? 1 : 0;
    pthread_mutex_unlock(&g_mu);
}

const char *tl_last_error(void)
{
    return t_err;
}
