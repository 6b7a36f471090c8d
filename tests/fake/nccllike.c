/*
 * nccllike.c - an NCCL-like library (libnccllike.so) with no CUDA runtime.
 *
 * Like NCCL with its static runtime, it never calls libcudart: it dlopens
 * libcuda.so.1 itself (see open_driver), takes cuGetProcAddress_v2 with dlsym on
 * that handle and resolves every driver function through it.  Its buffers are
 * cuMemCreate + cuMemAddressReserve + cuMemMap (+ cuMemSetAccess), plus 1 MiB
 * of cuMemAlloc.
 * Only interception of the driver lookup can see them.
 *
 * nl_rt_alloc / nl_rt_free are the same library's static runtime: a
 * cudaMalloc / cudaFree of its own, hidden inside it (as libcudart_static.a
 * is inside libnccl.so), which a preloaded cudaMalloc never interposes, and
 * which reaches the driver through the same looked-up functions.
 */
#include <cuda.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

int nl_init(int dev, size_t bytes);
int nl_destroy(void);
int nl_rt_alloc(int dev, size_t bytes);
int nl_rt_free(void);

#define NL_VERSION 13000
#define NL_MAXBUF  64
#define NL_SMALL   (1ULL << 20)

typedef CUresult (*pfn_getproc)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
} N;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_loaded;
static CUresult g_load_res;

static struct nlbuf {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr small;
} g_buf[NL_MAXBUF];
static int g_nbuf;

static pfn_getproc g_getproc;

/* Like the real runtime: dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL).  A
 * libcuda.so.1 already loaded wins; then the fake beside this library (by full
 * path: under ASan the dlopen interceptor hides our RUNPATH, and a machine
 * with a real driver must never get it by accident); then the plain name. */
static void *open_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (h)
        return h;
    Dl_info di;
    if (dladdr((void *)&open_driver, &di) && di.dli_fname) {
        const char *slash = strrchr(di.dli_fname, '/');
        char path[4096];
        if (slash && (size_t)(slash - di.dli_fname) + sizeof "/libcuda.so.1" <= sizeof path) {
            memcpy(path, di.dli_fname, (size_t)(slash - di.dli_fname));
            memcpy(path + (slash - di.dli_fname), "/libcuda.so.1", sizeof "/libcuda.so.1");
            if (access(path, F_OK) == 0 && (h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
                return h;
        }
    }
    return dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
}

static void *resolve(const char *name, int *missing)
{
    void *fn = NULL;
    if (g_getproc(name, &fn, NL_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, NULL) != CUDA_SUCCESS || !fn)
        *missing = 1;
    return fn;
}

#define RESOLVE(field, name) N.field = (__typeof__(N.field))resolve(name, &missing)

static CUresult load(void)
{
    if (g_loaded)
        return g_load_res;
    g_loaded = 1;
    void *h = open_driver();
    if (!h || !(g_getproc = (pfn_getproc)dlsym(h, "cuGetProcAddress_v2")))
        return g_load_res = CUDA_ERROR_NOT_FOUND;
    int missing = 0;
    RESOLVE(Init, "cuInit");
    RESOLVE(DeviceGet, "cuDeviceGet");
    RESOLVE(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    RESOLVE(CtxSetCurrent, "cuCtxSetCurrent");
    RESOLVE(MemCreate, "cuMemCreate");
    RESOLVE(MemRelease, "cuMemRelease");
    RESOLVE(MemAddressReserve, "cuMemAddressReserve");
    RESOLVE(MemAddressFree, "cuMemAddressFree");
    RESOLVE(MemMap, "cuMemMap");
    RESOLVE(MemUnmap, "cuMemUnmap");
    RESOLVE(MemSetAccess, "cuMemSetAccess");
    RESOLVE(MemAlloc, "cuMemAlloc");
    RESOLVE(MemFree, "cuMemFree");
    g_load_res = missing ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
    if (g_load_res == CUDA_SUCCESS)
        g_load_res = N.Init(0);
    return g_load_res;
}

static void undo(struct nlbuf *b, int mapped)
{
    if (mapped)
        N.MemUnmap(b->va, b->size);
    if (b->va)
        N.MemAddressFree(b->va, b->size);
    if (b->handle)
        N.MemRelease(b->handle);
}

int nl_init(int dev, size_t bytes)
{
    pthread_mutex_lock(&g_mu);
    CUresult r = load();
    if (r != CUDA_SUCCESS)
        goto out;
    if (g_nbuf >= NL_MAXBUF) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    CUdevice d;
    CUcontext ctx;
    if ((r = N.DeviceGet(&d, dev)) || (r = N.DevicePrimaryCtxRetain(&ctx, d)) ||
        (r = N.CtxSetCurrent(ctx)))
        goto out;

    struct nlbuf b;
    memset(&b, 0, sizeof b);
    b.size = bytes;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d;
    if ((r = N.MemCreate(&b.handle, bytes, &prop, 0))) {
        b.handle = 0;
        goto out;
    }
    if ((r = N.MemAddressReserve(&b.va, bytes, 0, 0, 0))) {
        b.va = 0;
        undo(&b, 0);
        goto out;
    }
    if ((r = N.MemMap(b.va, bytes, 0, b.handle, 0))) {
        undo(&b, 0);
        goto out;
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = N.MemSetAccess(b.va, bytes, &acc, 1)) || (r = N.MemAlloc(&b.small, NL_SMALL))) {
        undo(&b, 1);
        goto out;
    }
    g_buf[g_nbuf++] = b;
out:
    pthread_mutex_unlock(&g_mu);
    return (int)r;
}

int nl_destroy(void)
{
    pthread_mutex_lock(&g_mu);
    CUresult first = CUDA_SUCCESS, r;
    while (g_nbuf > 0) {
        struct nlbuf *b = &g_buf[--g_nbuf];
        if ((r = N.MemFree(b->small)) && !first)
            first = r;
        if ((r = N.MemUnmap(b->va, b->size)) && !first)
            first = r;
        if ((r = N.MemRelease(b->handle)) && !first)
            first = r;
        if ((r = N.MemAddressFree(b->va, b->size)) && !first)
            first = r;
    }
    pthread_mutex_unlock(&g_mu);
    return (int)first;
}

/* ---- the static runtime inside the library ------------------------------------ */

typedef int nl_cuda_error; /* cudaError_t: the driver's code, OOM as cudaErrorMemoryAllocation */

__attribute__((visibility("hidden"))) nl_cuda_error cudaMalloc(void **p, size_t n);
__attribute__((visibility("hidden"))) nl_cuda_error cudaFree(void *p);

nl_cuda_error cudaMalloc(void **p, size_t n)
{
    CUdeviceptr d = 0;
    CUresult r = N.MemAlloc(&d, n);
    *p = (void *)(uintptr_t)d;
    return r == CUDA_ERROR_OUT_OF_MEMORY ? 2 : (nl_cuda_error)r;
}

nl_cuda_error cudaFree(void *p)
{
    return (nl_cuda_error)N.MemFree((CUdeviceptr)(uintptr_t)p);
}

static void *g_rt[NL_MAXBUF];
static int g_nrt;

int nl_rt_alloc(int dev, size_t bytes)
{
    pthread_mutex_lock(&g_mu);
    CUdevice d;
    CUcontext ctx;
    void *p = NULL;
    CUresult r = load();
    if (!r && g_nrt >= NL_MAXBUF)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r && !(r = N.DeviceGet(&d, dev)) && !(r = N.DevicePrimaryCtxRetain(&ctx, d)))
        r = N.CtxSetCurrent(ctx);
    int e = r ? (int)r : cudaMalloc(&p, bytes);
    if (!e)
        g_rt[g_nrt++] = p;
    pthread_mutex_unlock(&g_mu);
    return e;
}

int nl_rt_free(void)
{
    pthread_mutex_lock(&g_mu);
    int first = 0, e;
    while (g_nrt > 0)
        if ((e = cudaFree(g_rt[--g_nrt])) && !first)
            first = e;
    pthread_mutex_unlock(&g_mu);
    return first;
}
