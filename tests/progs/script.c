/*
 * script.c - an ordinary CUDA program driven by its arguments, for e2e tests.
 *
 *   script alloc:1G alloc:512M free:0 meminfo freeall
 *
 * One command per argument; every line it prints is deterministic.  Commands
 * are listed in tests/fake/README.md.  Linked against libcudart.so.13 like any
 * CUDA application; the driver is reached only through the runtime's entry
 * points, never linked.
 */
#define CUDA_ENABLE_DEPRECATED 1 /* cudaGetDriverEntryPoint */
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "size.h"

/* The per-thread-default-stream variants, called by name. */
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);

/* The legacy (v1) driver ABI, as cuda.h gives it to the library's own build:
 * 32-bit device pointers and sizes. */
typedef CUresult (*cuMemAlloc_v1_fn)(unsigned int *dptr, unsigned int bytesize);
typedef CUresult (*cuMemFree_v1_fn)(unsigned int dptr);
typedef CUresult (*cuMemGetInfo_v1_fn)(unsigned int *free, unsigned int *total);

enum kind {
    S_MALLOC, S_ASYNC, S_ASYNC_PTSZ, S_POOL, S_MANAGED, S_PITCH, S_DRV, S_VMM, S_VMMREL,
    S_ARRAY, S_ARRAY3D, S_MIPMAP, S_3D, S_CUARRAY, S_CUARRAY3D, S_CUMIPMAP,
    S_HOST, S_HOSTALLOC, S_CUHOST, S_VMMHOST, S_V1, S_V1SYM, S_POOLALLOC, S_CUASYNC, S_CUPOOL,
    S_DLSYM,
};

struct slot {
    enum kind kind;
    int live;
    void *p;        /* runtime pointer, host pointer, array handle */
    CUdeviceptr va; /* driver pointer (v1: its 32 bits) */
    size_t size;
    CUmemGenericAllocationHandle handle;
};

/* Pools made by pool:create (numbered from 0) */
#define MAXPOOLS 64
struct poolref {
    cudaMemPool_t pool;
    int dev; /* -1: on the host */
};
static struct poolref g_pools[MAXPOOLS];
static int g_npools;

static struct slot *g_slots;
static size_t g_nslots, g_cap;

static void *dlsym_nccl_init, *dlsym_nccl_destroy, *dlsym_nccl_rt_alloc, *dlsym_nccl_rt_free;

static void die(const char *msg, const char *arg)
{
    fprintf(stderr, "script: %s: %s\n", msg, arg);
    exit(2);
}


static size_t need_size(const char *s)
{
    size_t v;
    if (prog_parse_size(s, &v) != 0)
        die("bad size", s);
    return v;
}

static long need_int(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end)
        die("bad number", s);
    return v;
}

static struct slot *new_slot(void)
{
    if (g_nslots == g_cap) {
        g_cap = g_cap ? g_cap * 2 : 64;
        g_slots = realloc(g_slots, g_cap * sizeof *g_slots);
        if (!g_slots)
            die("out of memory", "slots");
    }
    struct slot *s = &g_slots[g_nslots++];
    memset(s, 0, sizeof *s);
    return s;
}

/* A driver function through the runtime: by_version 0 is
 * cudaGetDriverEntryPoint, otherwise the ABI of that CUDA version
 * (cudaGetDriverEntryPointByVersion). */
static void *entry(const char *name, int by_version)
{
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = by_version ? cudaGetDriverEntryPointByVersion(name, &fn, (unsigned)by_version,
                                                                  cudaEnableDefault, &st)
                               : cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &st);
    if (e != cudaSuccess || st != cudaDriverEntryPointSuccess)
        return NULL;
    return fn;
}

/* What a program does with dlsym on libcuda (JAX, TensorFlow, ctypes). */
static void *driver_sym(const char *name)
{
    int n;
    cudaGetDeviceCount(&n); /* the runtime loads its driver */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *fn = h ? dlsym(h, name) : NULL;
    if (h)
        dlclose(h);
    return fn;
}

/* The runtime's current device, with its primary context current. */
static int current_device(void)
{
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess)
        (void)cudaSetDevice(dev);
    return dev;
}

static int alloc_drv(struct slot *s)
{
    CUresult (*fn)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))entry("cuMemAlloc", 0);
    if (!fn)
        return CUDA_ERROR_NOT_FOUND;
    current_device();
    return (int)fn(&s->va, s->size);
}

struct vmm {
    CUresult (*Create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*Release)(CUmemGenericAllocationHandle);
    CUresult (*Reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*AddrFree)(CUdeviceptr, size_t);
    CUresult (*Map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*Unmap)(CUdeviceptr, size_t);
    CUresult (*SetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
};

static int get_vmm(struct vmm *v)
{
    v->Create = (__typeof__(v->Create))entry("cuMemCreate", 13000);
    v->Release = (__typeof__(v->Release))entry("cuMemRelease", 13000);
    v->Reserve = (__typeof__(v->Reserve))entry("cuMemAddressReserve", 13000);
    v->AddrFree = (__typeof__(v->AddrFree))entry("cuMemAddressFree", 13000);
    v->Map = (__typeof__(v->Map))entry("cuMemMap", 13000);
    v->Unmap = (__typeof__(v->Unmap))entry("cuMemUnmap", 13000);
    v->SetAccess = (__typeof__(v->SetAccess))entry("cuMemSetAccess", 13000);
    if (!v->Create || !v->Release || !v->Reserve || !v->AddrFree || !v->Map || !v->Unmap ||
        !v->SetAccess)
        return CUDA_ERROR_NOT_FOUND;
    return 0;
}

/* release_early: release the handle right after mapping it, as NVIDIA's
 * samples do; the memory lives until the unmap. host: physical memory on
 * the host, mapped for the device. */
static int alloc_vmm(struct slot *s, int release_early, int host)
{
    struct vmm v;
    int r = get_vmm(&v);
    if (r)
        return r;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = host ? 0 : current_device();
    if ((r = (int)v.Create(&s->handle, s->size, &prop, 0)))
        return r;
    if ((r = (int)v.Reserve(&s->va, s->size, 0, 0, 0))) {
        v.Release(s->handle);
        return r;
    }
    if ((r = (int)v.Map(s->va, s->size, 0, s->handle, 0))) {
        v.AddrFree(s->va, s->size);
        v.Release(s->handle);
        return r;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = current_device();
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = (int)v.SetAccess(s->va, s->size, &acc, 1))) {
        v.Unmap(s->va, s->size);
        v.AddrFree(s->va, s->size);
        v.Release(s->handle);
        return r;
    }
    if (release_early && (r = (int)v.Release(s->handle)))
        return r;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Arguments of the newer api kinds                                          */

/* Splits "a:b:c" in place into at most max fields; returns how many. */
static int split(char *args, char **f, int max)
{
    int n = 0;
    while (args && n < max) {
        f[n++] = args;
        char *c = strchr(args, ':');
        if (c)
            *c++ = 0;
        args = c;
    }
    if (args)
        die("too many fields", args);
    return n;
}

/* An element format: u8x1, s16x2, f32x4, f16 (one channel) ... */
struct fmt {
    char kind; /* u, s, f */
    int bits;
    unsigned ch;
};

static struct fmt need_fmt(const char *s)
{
    struct fmt f = {'u', 8, 1};
    if (!s)
        return f;
    char *end;
    f.kind = s[0];
    f.bits = (int)strtol(s + 1, &end, 10);
    if (*end == 'x')
        f.ch = (unsigned)strtoul(end + 1, &end, 10);
    if ((f.kind != 'u' && f.kind != 's' && f.kind != 'f') || *end ||
        (f.bits != 8 && f.bits != 16 && f.bits != 32) || (f.ch != 1 && f.ch != 2 && f.ch != 4) ||
        (f.kind == 'f' && f.bits == 8))
        die("bad format (u8x1, s16x2, f32x4 ...)", s);
    return f;
}

static struct cudaChannelFormatDesc channel_desc(struct fmt f)
{
    struct cudaChannelFormatDesc d;
    memset(&d, 0, sizeof d);
    d.x = f.bits;
    d.y = f.ch >= 2 ? f.bits : 0;
    d.z = d.w = f.ch == 4 ? f.bits : 0;
    d.f = f.kind == 'u' ? cudaChannelFormatKindUnsigned
          : f.kind == 's' ? cudaChannelFormatKindSigned
                          : cudaChannelFormatKindFloat;
    return d;
}

static CUarray_format array_format(struct fmt f)
{
    if (f.kind == 'f')
        return f.bits == 16 ? CU_AD_FORMAT_HALF : CU_AD_FORMAT_FLOAT;
    if (f.kind == 'u')
        return f.bits == 8 ? CU_AD_FORMAT_UNSIGNED_INT8
               : f.bits == 16 ? CU_AD_FORMAT_UNSIGNED_INT16 : CU_AD_FORMAT_UNSIGNED_INT32;
    return f.bits == 8 ? CU_AD_FORMAT_SIGNED_INT8
           : f.bits == 16 ? CU_AD_FORMAT_SIGNED_INT16 : CU_AD_FORMAT_SIGNED_INT32;
}

static unsigned need_flags(const char *s)
{
    if (!s)
        return 0;
    char *end;
    unsigned long v = strtoul(s, &end, 0);
    if (end == s || *end)
        die("bad flags", s);
    return (unsigned)v;
}

/* A pool: N (made by pool:create), dN (device N's default pool); none given:
 * the last one made, else the current device's default pool. */
static cudaMemPool_t need_pool(const char *s, int *dev)
{
    cudaMemPool_t pool = NULL;
    if (!s && g_npools) {
        *dev = g_pools[g_npools - 1].dev;
        return g_pools[g_npools - 1].pool;
    }
    if (!s || s[0] == 'd') {
        *dev = s ? (int)need_int(s + 1) : current_device();
        cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, *dev);
        if (e)
            printf("pool d%d: error %d\n", *dev, (int)e);
        return pool;
    }
    long i = need_int(s);
    if (i < 0 || i >= g_npools)
        die("no such pool", s);
    *dev = g_pools[i].dev;
    return g_pools[i].pool;
}

/* ------------------------------------------------------------------------ */
/* Allocation and free of a slot                                             */

static int alloc_array(enum kind k, char *args, struct slot *s)
{
    char *f[6] = {0};
    int n = split(args, f, 6);
    size_t w = need_size(f[0]), h = 0, d = 0;
    unsigned levels = 0;
    int i = 1;
    if (k == S_ARRAY || k == S_CUARRAY) {
        h = n > 1 ? need_size(f[1]) : 0;
        i = 2;
    } else {
        if (n < 3 + (k == S_MIPMAP || k == S_CUMIPMAP))
            die("need W:H:D", args);
        h = need_size(f[1]);
        d = need_size(f[2]);
        i = 3;
        if (k == S_MIPMAP || k == S_CUMIPMAP)
            levels = (unsigned)need_int(f[i++]);
    }
    struct fmt fm = need_fmt(i < n ? f[i] : NULL);
    unsigned flags = need_flags(i + 1 < n ? f[i + 1] : NULL);
    if (k == S_ARRAY || k == S_ARRAY3D || k == S_MIPMAP) {
        struct cudaChannelFormatDesc desc = channel_desc(fm);
        struct cudaExtent ext = {w, h, d};
        cudaArray_t a = NULL;
        cudaMipmappedArray_t m = NULL;
        cudaError_t e = k == S_ARRAY     ? cudaMallocArray(&a, &desc, w, h, flags)
                        : k == S_ARRAY3D ? cudaMalloc3DArray(&a, &desc, ext, flags)
                                         : cudaMallocMipmappedArray(&m, &desc, ext, levels, flags);
        s->p = k == S_MIPMAP ? (void *)m : (void *)a;
        return (int)e;
    }
    current_device();
    CUDA_ARRAY3D_DESCRIPTOR a3;
    memset(&a3, 0, sizeof a3);
    a3.Width = w;
    a3.Height = h;
    a3.Depth = d;
    a3.Format = array_format(fm);
    a3.NumChannels = fm.ch;
    a3.Flags = flags;
    CUarray a = NULL;
    CUmipmappedArray m = NULL;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (k == S_CUARRAY) {
        CUresult (*fn)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *) =
            (CUresult(*)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *))entry("cuArrayCreate", 13000);
        CUDA_ARRAY_DESCRIPTOR a2 = {w, h, a3.Format, fm.ch};
        if (fn)
            r = fn(&a, &a2);
    } else if (k == S_CUARRAY3D) {
        CUresult (*fn)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *) =
            (CUresult(*)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *))entry("cuArray3DCreate", 13000);
        if (fn)
            r = fn(&a, &a3);
    } else {
        CUresult (*fn)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned) =
            (CUresult(*)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned))entry(
                "cuMipmappedArrayCreate", 13000);
        if (fn)
            r = fn(&m, &a3, levels);
    }
    s->p = k == S_CUMIPMAP ? (void *)m : (void *)a;
    return (int)r;
}

/* Slots of the legacy ABI keep 32-bit pointers and sizes. */
static unsigned int need_u32(size_t size, const char *what)
{
    if (size > UINT32_MAX)
        die("a v1 size must fit 32 bits", what);
    return (unsigned int)size;
}

/* Inlined (as run is into main): the journal tests expect an allocation of
 * `alloc:` to be called from main's own frame. */
__attribute__((always_inline)) static inline int do_alloc(enum kind k, char *args, struct slot *s)
{
    s->kind = k;
    switch (k) {
    case S_ARRAY: case S_ARRAY3D: case S_MIPMAP:
    case S_CUARRAY: case S_CUARRAY3D: case S_CUMIPMAP: return alloc_array(k, args, s);
    case S_3D: {
        char *f[3];
        if (split(args, f, 3) != 3)
            die("need W:H:D", args);
        struct cudaPitchedPtr pp;
        struct cudaExtent ext = {need_size(f[0]), need_size(f[1]), need_size(f[2])};
        int r = (int)cudaMalloc3D(&pp, ext);
        s->p = pp.ptr;
        return r;
    }
    case S_POOLALLOC:
    case S_CUPOOL: {
        char *f[2] = {0};
        int n = split(args, f, 2), dev;
        s->size = need_size(f[0]);
        cudaMemPool_t pool = need_pool(n > 1 ? f[1] : NULL, &dev);
        current_device();
        if (k == S_POOLALLOC)
            return (int)cudaMallocFromPoolAsync(&s->p, s->size, pool, 0);
        CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
            (CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))entry(
                "cuMemAllocFromPoolAsync", 13000);
        return fn ? (int)fn(&s->va, s->size, (CUmemoryPool)pool, 0) : CUDA_ERROR_NOT_FOUND;
    }
    default: break;
    }
    size_t size = need_size(args);
    s->size = size;
    switch (k) {
    case S_MALLOC: return (int)cudaMalloc(&s->p, size);
    case S_ASYNC: return (int)cudaMallocAsync(&s->p, size, 0);
    case S_ASYNC_PTSZ: return (int)cudaMallocAsync_ptsz(&s->p, size, 0);
    case S_POOL: {
        cudaMemPool_t pool = NULL;
        int dev = current_device();
        cudaError_t e = cudaDeviceGetDefaultMemPool(&pool, dev);
        if (e != cudaSuccess)
            return (int)e;
        return (int)cudaMallocFromPoolAsync(&s->p, size, pool, 0);
    }
    case S_MANAGED: return (int)cudaMallocManaged(&s->p, size, cudaMemAttachGlobal);
    case S_PITCH: {
        size_t pitch = 0;
        return (int)cudaMallocPitch(&s->p, &pitch, size, 1);
    }
    case S_DRV: return alloc_drv(s);
    case S_DLSYM: {
        CUresult (*fn)(CUdeviceptr *, size_t) =
            (CUresult(*)(CUdeviceptr *, size_t))driver_sym("cuMemAlloc_v2");
        current_device();
        return fn ? (int)fn(&s->va, size) : CUDA_ERROR_NOT_FOUND;
    }
    case S_VMM: return alloc_vmm(s, 0, 0);
    case S_VMMREL: return alloc_vmm(s, 1, 0);
    case S_VMMHOST: return alloc_vmm(s, 0, 1);
    case S_HOST: return (int)cudaMallocHost(&s->p, size);
    case S_HOSTALLOC: return (int)cudaHostAlloc(&s->p, size, cudaHostAllocPortable);
    case S_CUHOST: {
        CUresult (*fn)(void **, size_t, unsigned) =
            (CUresult(*)(void **, size_t, unsigned))entry("cuMemHostAlloc", 13000);
        current_device();
        return fn ? (int)fn(&s->p, size, 0) : CUDA_ERROR_NOT_FOUND;
    }
    case S_V1:
    case S_V1SYM: {
        unsigned int bytes = need_u32(size, args);
        /* below 3020 the driver hands out the legacy ABI, which writes 32
         * bits: a second cell catches a function that writes 64 */
        unsigned int dptr[2] = {0, 0};
        cuMemAlloc_v1_fn fn = (cuMemAlloc_v1_fn)(k == S_V1 ? entry("cuMemAlloc", 3000)
                                                           : driver_sym("cuMemAlloc"));
        current_device();
        int r = fn ? (int)fn(dptr, bytes) : CUDA_ERROR_NOT_FOUND;
        if (dptr[1])
            printf("api %s %s: a 64-bit pointer was written\n", k == S_V1 ? "v1" : "v1sym", args);
        s->va = dptr[0];
        return r;
    }
    case S_CUASYNC: {
        CUresult (*fn)(CUdeviceptr *, size_t, CUstream) =
            (CUresult(*)(CUdeviceptr *, size_t, CUstream))entry("cuMemAllocAsync", 13000);
        current_device();
        return fn ? (int)fn(&s->va, size, 0) : CUDA_ERROR_NOT_FOUND;
    }
    default: return 1;
    }
}

/* A driver function of the current ABI, through the runtime. */
static CUresult drv_call1(const char *name, void *arg)
{
    CUresult (*fn)(void *) = (CUresult(*)(void *))entry(name, 13000);
    return fn ? fn(arg) : CUDA_ERROR_NOT_FOUND;
}

static int do_free(struct slot *s)
{
    switch (s->kind) {
    case S_MALLOC:
    case S_MANAGED:
    case S_PITCH:
    case S_3D: return (int)cudaFree(s->p);
    case S_ASYNC:
    case S_POOL:
    case S_POOLALLOC: return (int)cudaFreeAsync(s->p, 0);
    case S_ASYNC_PTSZ: return (int)cudaFreeAsync_ptsz(s->p, 0);
    case S_ARRAY:
    case S_ARRAY3D: return (int)cudaFreeArray((cudaArray_t)s->p);
    case S_MIPMAP: return (int)cudaFreeMipmappedArray((cudaMipmappedArray_t)s->p);
    case S_CUARRAY:
    case S_CUARRAY3D: return (int)drv_call1("cuArrayDestroy", s->p);
    case S_CUMIPMAP: return (int)drv_call1("cuMipmappedArrayDestroy", s->p);
    case S_HOST:
    case S_HOSTALLOC: return (int)cudaFreeHost(s->p);
    case S_CUHOST: return (int)drv_call1("cuMemFreeHost", s->p);
    case S_DRV:
    case S_DLSYM: {
        CUresult (*fn)(CUdeviceptr) =
            (CUresult(*)(CUdeviceptr))(s->kind == S_DRV ? entry("cuMemFree", 0)
                                                        : driver_sym("cuMemFree_v2"));
        return fn ? (int)fn(s->va) : CUDA_ERROR_NOT_FOUND;
    }
    case S_CUASYNC:
    case S_CUPOOL: {
        CUresult (*fn)(CUdeviceptr, CUstream) =
            (CUresult(*)(CUdeviceptr, CUstream))entry("cuMemFreeAsync", 13000);
        return fn ? (int)fn(s->va, 0) : CUDA_ERROR_NOT_FOUND;
    }
    case S_V1:
    case S_V1SYM: {
        cuMemFree_v1_fn fn = (cuMemFree_v1_fn)(s->kind == S_V1 ? entry("cuMemFree", 3000)
                                                               : driver_sym("cuMemFree"));
        return fn ? (int)fn((unsigned int)s->va) : CUDA_ERROR_NOT_FOUND;
    }
    case S_VMM:
    case S_VMMREL:
    case S_VMMHOST: {
        struct vmm v;
        int r = get_vmm(&v);
        if (r)
            return r;
        if ((r = (int)v.Unmap(s->va, s->size)))
            return r;
        if (s->kind != S_VMMREL && (r = (int)v.Release(s->handle)))
            return r;
        return (int)v.AddrFree(s->va, s->size);
    }
    }
    return 1;
}

static void free_slot(size_t i)
{
    if (i >= g_nslots) {
        printf("free %zu: no such slot\n", i);
        return;
    }
    int r = do_free(&g_slots[i]);
    g_slots[i].live = 0;
    if (r)
        printf("free %zu: error %d\n", i, r);
}

/* ------------------------------------------------------------------------ */
/* threads:N:OPS:SIZE                                                        */

struct tharg {
    int dev;
    long ops;
    size_t size;
    void *keep;
    int err;
};

static void *thread_main(void *arg)
{
    struct tharg *a = arg;
    cudaError_t e = cudaSetDevice(a->dev);
    for (long i = 0; e == cudaSuccess && i < a->ops; i++) {
        void *p = NULL;
        if ((e = cudaMalloc(&p, a->size)) == cudaSuccess)
            e = cudaFree(p);
    }
    if (e == cudaSuccess)
        e = cudaMalloc(&a->keep, a->size);
    a->err = (int)e;
    return NULL;
}

static void run_threads(long n, long ops, size_t size)
{
    if (n <= 0 || n > 4096 || ops < 0)
        die("bad threads command", "N:OPS:SIZE");
    int dev = 0;
    (void)cudaGetDevice(&dev);
    struct tharg *args = calloc((size_t)n, sizeof *args);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!args || !th)
        die("out of memory", "threads");
    for (long i = 0; i < n; i++) {
        args[i].dev = dev;
        args[i].ops = ops;
        args[i].size = size;
        if (pthread_create(&th[i], NULL, thread_main, &args[i]) != 0)
            die("pthread_create failed", "threads");
    }
    for (long i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    int first = 0;
    for (long i = 0; i < n; i++) {
        if (args[i].err && !first)
            first = args[i].err;
        if (args[i].keep)
            (void)cudaFree(args[i].keep);
    }
    if (first)
        printf("threads: error %d\n", first);
    else
        printf("threads: %ld x %ld ok\n", n, ops);
    free(args);
    free(th);
}

/* ------------------------------------------------------------------------ */
/* nccl:DEV:SIZE                                                             */

static void *load_nccl(void)
{
    static void *h;
    if (h)
        return h;
    char dir[PATH_MAX + 64] = "";
    void *rt = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
    if (rt) {
        if (dlinfo(rt, RTLD_DI_ORIGIN, dir) != 0)
            dir[0] = 0;
        dlclose(rt);
    }
    char path[sizeof dir + 64];
    if (dir[0]) {
        snprintf(path, sizeof path, "%s/libnccllike.so", dir);
        h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
    if (!h) {
        ssize_t n = readlink("/proc/self/exe", dir, PATH_MAX);
        if (n > 0) {
            dir[n] = 0;
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = 0;
            snprintf(path, sizeof path, "%s/../../fake/libnccllike.so", dir);
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
    }
    if (!h) {
        fprintf(stderr, "script: %s\n", dlerror());
        return NULL;
    }
    dlsym_nccl_init = dlsym(h, "nl_init");
    dlsym_nccl_destroy = dlsym(h, "nl_destroy");
    dlsym_nccl_rt_alloc = dlsym(h, "nl_rt_alloc");
    dlsym_nccl_rt_free = dlsym(h, "nl_rt_free");
    return h;
}

/* ------------------------------------------------------------------------ */

/* pool:create:DEV:device|host|hostnuma[:MAXSIZE], pool:cucreate:... (the
 * driver's cuMemPoolCreate), pool:trim:BYTES[:P], pool:cutrim:BYTES[:P],
 * pool:threshold:BYTES[:P], pool:destroy[:P], pool:cudestroy[:P],
 * pool:current[:P], pool:info[:P] */
static void pool_cmd(char *arg)
{
    char *f[4] = {0};
    char shown[256];
    snprintf(shown, sizeof shown, "%s", arg);
    int n = split(arg, f, 4), dev = 0, r = 0;
    const char *op = f[0];
    if (!strcmp(op, "create") || !strcmp(op, "cucreate")) {
        if (n < 3)
            die("need pool:create:DEV:device|host|hostnuma", shown);
        if (g_npools == MAXPOOLS)
            die("too many pools", shown);
        struct cudaMemPoolProps props;
        memset(&props, 0, sizeof props);
        props.allocType = cudaMemAllocationTypePinned;
        props.location.id = (int)need_int(f[1]);
        props.location.type = !strcmp(f[2], "device")   ? cudaMemLocationTypeDevice
                              : !strcmp(f[2], "host")     ? cudaMemLocationTypeHost
                              : !strcmp(f[2], "hostnuma") ? cudaMemLocationTypeHostNuma
                                                          : (die("bad location", f[2]), 0);
        props.maxSize = n > 3 ? need_size(f[3]) : 0;
        cudaMemPool_t pool = NULL;
        if (!strcmp(op, "create")) {
            r = (int)cudaMemPoolCreate(&pool, &props);
        } else {
            CUresult (*fn)(CUmemoryPool *, const CUmemPoolProps *) =
                (CUresult(*)(CUmemoryPool *, const CUmemPoolProps *))entry("cuMemPoolCreate", 13000);
            current_device();
            /* cudaMemPoolProps and CUmemPoolProps have the same layout */
            r = fn ? (int)fn((CUmemoryPool *)&pool, (const CUmemPoolProps *)&props)
                   : CUDA_ERROR_NOT_FOUND;
        }
        if (r == 0) {
            g_pools[g_npools].pool = pool;
            g_pools[g_npools++].dev = props.location.type == cudaMemLocationTypeDevice
                                          ? props.location.id : -1;
        }
    } else if (!strcmp(op, "trim") || !strcmp(op, "cutrim") || !strcmp(op, "threshold")) {
        if (n < 2)
            die("need BYTES", shown);
        size_t bytes = need_size(f[1]);
        cudaMemPool_t pool = need_pool(n > 2 ? f[2] : NULL, &dev);
        if (!strcmp(op, "trim")) {
            r = (int)cudaMemPoolTrimTo(pool, bytes);
        } else if (!strcmp(op, "cutrim")) {
            CUresult (*fn)(CUmemoryPool, size_t) =
                (CUresult(*)(CUmemoryPool, size_t))entry("cuMemPoolTrimTo", 13000);
            r = fn ? (int)fn((CUmemoryPool)pool, bytes) : CUDA_ERROR_NOT_FOUND;
        } else {
            cuuint64_t v = bytes;
            r = (int)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &v);
        }
    } else if (!strcmp(op, "destroy") || !strcmp(op, "cudestroy")) {
        cudaMemPool_t pool = need_pool(n > 1 ? f[1] : NULL, &dev);
        if (!strcmp(op, "destroy"))
            r = (int)cudaMemPoolDestroy(pool);
        else
            r = (int)drv_call1("cuMemPoolDestroy", pool);
    } else if (!strcmp(op, "current")) {
        cudaMemPool_t pool = need_pool(n > 1 ? f[1] : NULL, &dev);
        r = (int)cudaDeviceSetMemPool(dev, pool);
    } else if (!strcmp(op, "info")) {
        cudaMemPool_t pool = need_pool(n > 1 ? f[1] : NULL, &dev);
        static const enum cudaMemPoolAttr attrs[] = {
            cudaMemPoolAttrReservedMemCurrent, cudaMemPoolAttrReservedMemHigh,
            cudaMemPoolAttrUsedMemCurrent, cudaMemPoolAttrUsedMemHigh,
            cudaMemPoolAttrReleaseThreshold};
        cuuint64_t v[5] = {0};
        for (int i = 0; i < 5 && !r; i++)
            r = (int)cudaMemPoolGetAttribute(pool, attrs[i], &v[i]);
        if (!r)
            printf("pool %s reserved=%llu reserved_high=%llu used=%llu used_high=%llu "
                   "threshold=%llu\n",
                   n > 1 ? f[1] : g_npools ? "last" : "default", (unsigned long long)v[0],
                   (unsigned long long)v[1], (unsigned long long)v[2], (unsigned long long)v[3],
                   (unsigned long long)v[4]);
    } else {
        die("unknown pool command", shown);
    }
    if (r)
        printf("pool %s: error %d\n", shown, r);
}

static int api_kind(const char *name, enum kind *k)
{
    static const struct {
        const char *name;
        enum kind kind;
    } t[] = {
        {"malloc", S_MALLOC}, {"async", S_ASYNC},     {"async_ptsz", S_ASYNC_PTSZ},
        {"pool", S_POOL},     {"managed", S_MANAGED}, {"pitch", S_PITCH},
        {"drv", S_DRV},       {"vmm", S_VMM},         {"vmmrel", S_VMMREL},
        {"array", S_ARRAY},   {"array3d", S_ARRAY3D}, {"mipmap", S_MIPMAP},
        {"3d", S_3D},         {"cuarray", S_CUARRAY}, {"cuarray3d", S_CUARRAY3D},
        {"cumipmap", S_CUMIPMAP}, {"host", S_HOST},   {"hostalloc", S_HOSTALLOC},
        {"cuhost", S_CUHOST}, {"vmmhost", S_VMMHOST}, {"v1", S_V1},
        {"v1sym", S_V1SYM},   {"poolalloc", S_POOLALLOC}, {"cuasync", S_CUASYNC},
        {"cupoolalloc", S_CUPOOL}, {"dlsym", S_DLSYM},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (strcmp(t[i].name, name) == 0) {
            *k = t[i].kind;
            return 0;
        }
    }
    return -1;
}

__attribute__((always_inline)) static inline void run(char *cmd)
{
    char *arg = strchr(cmd, ':');
    if (arg)
        *arg++ = 0;

    if (strcmp(cmd, "alloc") == 0 && arg) {
        struct slot *s = new_slot();
        int r = do_alloc(S_MALLOC, arg, s);
        s->live = r == 0;
        if (r)
            printf("alloc %s: error %d\n", arg, r);
    } else if (strcmp(cmd, "api") == 0 && arg) {
        char *sz = strchr(arg, ':');
        enum kind k;
        if (!sz)
            die("bad api command", arg);
        *sz++ = 0;
        if (api_kind(arg, &k) != 0)
            die("unknown api", arg);
        char shown[256];
        snprintf(shown, sizeof shown, "%s", sz);
        struct slot *s = new_slot();
        int r = do_alloc(k, sz, s);
        s->live = r == 0;
        if (r)
            printf("api %s %s: error %d\n", arg, shown, r);
    } else if (strcmp(cmd, "free") == 0 && arg) {
        free_slot((size_t)need_int(arg));
    } else if (strcmp(cmd, "freeall") == 0) {
        for (size_t i = 0; i < g_nslots; i++)
            if (g_slots[i].live)
                free_slot(i);
    } else if (strcmp(cmd, "free0") == 0) {
        printf("free0: %d\n", (int)cudaFree(NULL));
    } else if (strcmp(cmd, "bogusfree") == 0) {
        printf("bogusfree: %d\n", (int)cudaFree((void *)(uintptr_t)0x1234500));
    } else if (strcmp(cmd, "setdev") == 0 && arg) {
        cudaError_t e = cudaSetDevice((int)need_int(arg));
        if (e)
            printf("setdev %s: error %d\n", arg, (int)e);
    } else if (strcmp(cmd, "lasterror") == 0) {
        printf("lasterror: %d\n", (int)cudaGetLastError());
    } else if (strcmp(cmd, "dlsym") == 0 && arg) {
        /* Whose function does a lookup on libcuda's handle hand out? */
        int n;
        cudaGetDeviceCount(&n); /* the runtime loads its driver */
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        void *fn = h ? dlsym(h, arg) : NULL;
        Dl_info di;
        const char *mod = fn && dladdr(fn, &di) && di.dli_fname ? di.dli_fname : "(none)";
        const char *base = strrchr(mod, '/');
        printf("dlsym %s: %s\n", arg, base ? base + 1 : mod);
    } else if (strcmp(cmd, "closefds") == 0) {
        /* What a daemon does: close every descriptor past stderr. */
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
    } else if (strcmp(cmd, "openfile") == 0 && arg) {
        int fd = open(arg, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        printf("openfile: fd %d\n", fd);
    } else if (strcmp(cmd, "pool") == 0 && arg) {
        pool_cmd(arg);
    } else if (strcmp(cmd, "sync") == 0) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e)
            printf("sync: error %d\n", (int)e);
    } else if (strcmp(cmd, "streamsync") == 0) {
        cudaError_t e = cudaStreamSynchronize(0);
        if (e)
            printf("streamsync: error %d\n", (int)e);
    } else if (strcmp(cmd, "devused") == 0) {
        /* what the fake device holds, whatever anyone reports */
        int dev = arg ? (int)need_int(arg) : current_device();
        unsigned long long (*used)(int) = (unsigned long long (*)(int))driver_sym("fakecuda_used");
        if (used)
            printf("devused %d=%llu\n", dev, used(dev));
        else
            printf("devused: not the fake driver\n");
    } else if (strcmp(cmd, "devhigh") == 0) {
        /* the most the fake device ever held at once (every process sharing it) */
        int dev = arg ? (int)need_int(arg) : current_device();
        unsigned long long (*high)(int) =
            (unsigned long long (*)(int))driver_sym("fakecuda_high_water");
        if (high)
            printf("devhigh %d=%llu\n", dev, high(dev));
        else
            printf("devhigh: not the fake driver\n");
    } else if (strcmp(cmd, "until") == 0 && arg) {
        /* wait (spinning) until the file ARG exists: processes that have
         * started act at the moment a test creates it */
        while (access(arg, F_OK) != 0)
            sched_yield();
    } else if (strcmp(cmd, "at") == 0 && arg) {
        /* wait until the wall clock reaches ARG ns since the epoch: processes
         * started apart act at the same moment */
        long long at = need_int(arg);
        struct timespec now;
        do
            clock_gettime(CLOCK_REALTIME, &now);
        while ((long long)now.tv_sec * 1000000000LL + now.tv_nsec < at);
    } else if (strcmp(cmd, "meminfo1") == 0) {
        unsigned int f = 0, t = 0;
        cuMemGetInfo_v1_fn fn = (cuMemGetInfo_v1_fn)entry("cuMemGetInfo", 3000);
        current_device();
        int r = fn ? (int)fn(&f, &t) : CUDA_ERROR_NOT_FOUND;
        if (r)
            printf("meminfo1: error %d\n", r);
        else
            printf("meminfo1 free=%u total=%u\n", f, t);
    } else if (strcmp(cmd, "meminfo") == 0) {
        size_t f = 0, t = 0;
        cudaError_t e = cudaMemGetInfo(&f, &t);
        if (e)
            printf("meminfo: error %d\n", (int)e);
        else
            printf("meminfo free=%zu total=%zu\n", f, t);
    } else if (strcmp(cmd, "sleep") == 0 && arg) {
        long ms = need_int(arg);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    } else if (strcmp(cmd, "print") == 0) {
        printf("%s\n", arg ? arg : "");
    } else if (strcmp(cmd, "threads") == 0 && arg) {
        char *a2 = strchr(arg, ':'), *a3 = a2 ? strchr(a2 + 1, ':') : NULL;
        if (!a2 || !a3)
            die("bad threads command", arg);
        *a2++ = 0;
        *a3++ = 0;
        run_threads(need_int(arg), need_int(a2), need_size(a3));
    } else if (strcmp(cmd, "fork") == 0 || strcmp(cmd, "forkexit") == 0) {
        int normal = strcmp(cmd, "forkexit") == 0;
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0)
            die("fork failed", cmd);
        if (pid == 0) {
            if (normal)
                exit(0);
            _exit(0);
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0) {
        }
        printf("%s: child exited %d\n", cmd, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    } else if (strcmp(cmd, "exit") == 0 && arg) {
        fflush(stdout);
        exit((int)need_int(arg));
    } else if ((strcmp(cmd, "nccl") == 0 || strcmp(cmd, "ncclrt") == 0) && arg) {
        /* nccl: its driver buffers; ncclrt: a cudaMalloc of its static runtime */
        char *sz = strchr(arg, ':');
        if (!sz)
            die("bad nccl command", arg);
        *sz++ = 0;
        int dev = (int)need_int(arg);
        size_t size = need_size(sz);
        void *fn = load_nccl() ? (cmd[4] ? dlsym_nccl_rt_alloc : dlsym_nccl_init) : NULL;
        if (!fn) {
            printf("nccl: cannot load libnccllike.so\n");
            return;
        }
        int r = ((int (*)(int, size_t))fn)(dev, size);
        if (r)
            printf("%s %s %s: error %d\n", cmd, arg, sz, r);
    } else if (strcmp(cmd, "ncclfree") == 0) {
        if (!load_nccl() || !dlsym_nccl_destroy || !dlsym_nccl_rt_free) {
            printf("nccl: cannot load libnccllike.so\n");
            return;
        }
        int r = ((int (*)(void))dlsym_nccl_destroy)();
        int r2 = ((int (*)(void))dlsym_nccl_rt_free)();
        if (r || r2)
            printf("ncclfree: error %d\n", r ? r : r2);
    } else {
        die("unknown command", cmd);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++)
        run(argv[i]);
    printf("script: done\n");
    free(g_slots);
    return 0;
}
