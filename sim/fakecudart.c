/*
 * fakecudart.c - a fake CUDA runtime (libcudart.so.13) for GPU-free tests.
 *
 * Behaves like the real one where the shim cares:
 *   - linked -Bsymbolic (DT_SYMBOLIC), no DT_NEEDED on libcuda;
 *   - on first use dlopens libcuda.so.1 (RTLD_NOW | RTLD_LOCAL; see
 *     open_driver for which one), takes cuGetProcAddress_v2 with dlsym on that
 *     handle and resolves every driver function it uses through it (with
 *     version 13000; legacy and per-thread variants of the stream-ordered ones);
 *   - cudaGetDriverEntryPoint* forward to that same cuGetProcAddress_v2;
 *   - per-thread current device (default 0) and last error; the primary
 *     context is retained on first use and made current per thread.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecudart.h"

/* The driver's functions this runtime uses (fakecudart.h), resolved once. */
struct fr_driver D;

static pfn_getproc g_getproc;
static pthread_once_t g_load_once = PTHREAD_ONCE_INIT;
static cudaError_t g_load_err;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init_err;
static int g_ndev;

static CUcontext g_prim[MAXDEV];
static pthread_mutex_t g_prim_mu = PTHREAD_MUTEX_INITIALIZER;

static __thread int t_dev;
static __thread int t_bound = -1; /* device whose primary context is current here */
static __thread cudaError_t t_last = cudaSuccess;

static cudaError_t map_err(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    default: return (cudaError_t)r;
    }
}

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

static cudaError_t ret_cu(CUresult r)
{
    return ret(map_err(r));
}

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

static void *resolve(const char *name, int version, cuuint64_t flags)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (g_getproc(name, &fn, version, flags, &st) != CUDA_SUCCESS ||
        st != CU_GET_PROC_ADDRESS_SUCCESS)
        return NULL;
    return fn;
}

/* A driver function at this runtime's version, or (_AT) at the version of
 * the ABI the field has. */
#define RESOLVE_AT(field, name, version, flags)                                            \
    do {                                                                                   \
        if (!(D.field = (__typeof__(D.field))resolve(name, version, flags)))               \
            missing = 1;                                                                   \
    } while (0)
#define RESOLVE(field, name, flags) RESOLVE_AT(field, name, RT_VERSION, flags)

static void do_load(void)
{
    void *h = open_driver();
    if (!h) {
        g_load_err = cudaErrorInsufficientDriver;
        return;
    }
    g_getproc = (pfn_getproc)dlsym(h, "cuGetProcAddress_v2");
    if (!g_getproc) {
        g_load_err = cudaErrorInsufficientDriver;
        return;
    }
    const cuuint64_t L = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    const cuuint64_t P = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    int missing = 0;
    RESOLVE(Init, "cuInit", L);
    RESOLVE(DriverGetVersion, "cuDriverGetVersion", L);
    RESOLVE(DeviceGetCount, "cuDeviceGetCount", L);
    RESOLVE(DeviceGet, "cuDeviceGet", L);
    RESOLVE(DeviceGetName, "cuDeviceGetName", L);
    RESOLVE(DeviceTotalMem, "cuDeviceTotalMem", L);
    RESOLVE(DeviceGetAttribute, "cuDeviceGetAttribute", L);
    RESOLVE(DeviceGetUuid, "cuDeviceGetUuid", L);
    RESOLVE(DeviceGetPCIBusId, "cuDeviceGetPCIBusId", L);
    RESOLVE(DeviceCanAccessPeer, "cuDeviceCanAccessPeer", L);
    RESOLVE(DeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", L);
    RESOLVE(DeviceGetMemPool, "cuDeviceGetMemPool", L);
    RESOLVE(DeviceSetMemPool, "cuDeviceSetMemPool", L);
    RESOLVE(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", L);
    RESOLVE(CtxSetCurrent, "cuCtxSetCurrent", L);
    /* CUDA 13 changed cuCtxSynchronize's ABI: asked at our version, the
     * driver hands out the one of that version. */
    if (RT_VERSION >= 13000)
        RESOLVE(CtxSynchronize_v2, "cuCtxSynchronize", L);
    else
        RESOLVE(CtxSynchronize, "cuCtxSynchronize", L);
    RESOLVE(CtxGetStreamPriorityRange, "cuCtxGetStreamPriorityRange", L);
    RESOLVE(CtxEnablePeerAccess, "cuCtxEnablePeerAccess", L);
    RESOLVE(StreamCreateWithPriority, "cuStreamCreateWithPriority", L);
    RESOLVE(StreamDestroy, "cuStreamDestroy", L);
    RESOLVE(StreamGetPriority, "cuStreamGetPriority", L);
    RESOLVE(StreamQuery, "cuStreamQuery", L);
    RESOLVE(StreamWaitEvent, "cuStreamWaitEvent", L);
    RESOLVE(StreamBeginCapture, "cuStreamBeginCapture", L);
    RESOLVE(StreamEndCapture, "cuStreamEndCapture", L);
    RESOLVE(StreamIsCapturing, "cuStreamIsCapturing", L);
    RESOLVE_AT(StreamGetCaptureInfo, "cuStreamGetCaptureInfo", 11030, L);
    RESOLVE(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode", L);
    RESOLVE(LaunchHostFunc, "cuLaunchHostFunc", L);
    RESOLVE(EventCreate, "cuEventCreate", L);
    RESOLVE(EventDestroy, "cuEventDestroy", L);
    RESOLVE(EventRecord, "cuEventRecord", L);
    RESOLVE(EventQuery, "cuEventQuery", L);
    RESOLVE(EventSynchronize, "cuEventSynchronize", L);
    RESOLVE(EventElapsedTime, "cuEventElapsedTime", L);
    RESOLVE(Memcpy, "cuMemcpy", L);
    RESOLVE(MemcpyAsync, "cuMemcpyAsync", L);
    RESOLVE(MemcpyPeerAsync, "cuMemcpyPeerAsync", L);
    RESOLVE(MemsetD8, "cuMemsetD8", L);
    RESOLVE(MemsetD8Async, "cuMemsetD8Async", L);
    RESOLVE(MemHostRegister, "cuMemHostRegister", L);
    RESOLVE(MemHostUnregister, "cuMemHostUnregister", L);
    RESOLVE(MemHostGetDevicePointer, "cuMemHostGetDevicePointer", L);
    RESOLVE(PointerGetAttributes, "cuPointerGetAttributes", L);
    RESOLVE(IpcGetMemHandle, "cuIpcGetMemHandle", L);
    RESOLVE(IpcOpenMemHandle, "cuIpcOpenMemHandle", L);
    RESOLVE(IpcCloseMemHandle, "cuIpcCloseMemHandle", L);
    RESOLVE(IpcGetEventHandle, "cuIpcGetEventHandle", L);
    RESOLVE(IpcOpenEventHandle, "cuIpcOpenEventHandle", L);
    RESOLVE(StreamSynchronize, "cuStreamSynchronize", L);
    RESOLVE(StreamSynchronize_ptsz, "cuStreamSynchronize", P);
    RESOLVE(MemGetInfo, "cuMemGetInfo", L);
    RESOLVE(MemAlloc, "cuMemAlloc", L);
    RESOLVE(MemFree, "cuMemFree", L);
    RESOLVE(MemAllocManaged, "cuMemAllocManaged", L);
    RESOLVE(MemAllocPitch, "cuMemAllocPitch", L);
    RESOLVE(MemAllocAsync, "cuMemAllocAsync", L);
    RESOLVE(MemAllocAsync_ptsz, "cuMemAllocAsync", P);
    RESOLVE(MemFreeAsync, "cuMemFreeAsync", L);
    RESOLVE(MemFreeAsync_ptsz, "cuMemFreeAsync", P);
    RESOLVE(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", L);
    RESOLVE(MemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", P);
    RESOLVE(MemPoolCreate, "cuMemPoolCreate", L);
    RESOLVE(MemPoolDestroy, "cuMemPoolDestroy", L);
    RESOLVE(MemPoolTrimTo, "cuMemPoolTrimTo", L);
    RESOLVE(MemPoolSetAttribute, "cuMemPoolSetAttribute", L);
    RESOLVE(MemPoolGetAttribute, "cuMemPoolGetAttribute", L);
    RESOLVE(Array3DCreate, "cuArray3DCreate", L);
    RESOLVE(ArrayDestroy, "cuArrayDestroy", L);
    RESOLVE(MipmappedArrayCreate, "cuMipmappedArrayCreate", L);
    RESOLVE(MipmappedArrayDestroy, "cuMipmappedArrayDestroy", L);
    RESOLVE(MemHostAlloc, "cuMemHostAlloc", L);
    RESOLVE(MemAllocHost, "cuMemAllocHost", L);
    RESOLVE(MemFreeHost, "cuMemFreeHost", L);
    if (missing)
        g_load_err = cudaErrorInsufficientDriver;
}

/* The driver is loaded and its functions resolved (no cuInit). */
static cudaError_t rt_load(void)
{
    pthread_once(&g_load_once, do_load);
    return g_load_err;
}

static void do_init(void)
{
    if ((g_init_err = rt_load()) != cudaSuccess)
        return;
    /* Like the real runtime: a driver of an older major version cannot run it. */
    int drv = 0;
    if (D.DriverGetVersion(&drv) == CUDA_SUCCESS && drv / 1000 < RT_VERSION / 1000) {
        g_init_err = cudaErrorInsufficientDriver;
        return;
    }
    CUresult r = D.Init(0);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetCount(&g_ndev);
    g_init_err = map_err(r);
}

/* The driver is initialised. */
static cudaError_t rt_init(void)
{
    pthread_once(&g_init_once, do_init);
    return g_init_err;
}

/* Entry points that pick a D.* before ensure_ctx need a loaded driver. */
#define NEED_LOAD()                                                                        \
    do {                                                                                   \
        cudaError_t le_ = rt_load();                                                       \
        if (le_ != cudaSuccess)                                                            \
            return ret(le_);                                                               \
    } while (0)

/* The current device's primary context is current on this thread. */
static cudaError_t ensure_ctx(void)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    if (t_bound == t_dev)
        return cudaSuccess;
    if (t_dev < 0 || t_dev >= g_ndev || t_dev >= MAXDEV)
        return cudaErrorInvalidDevice;
    CUcontext c;
    cudaError_t pe = fr_primary_context(t_dev, &c);
    if (pe != cudaSuccess)
        return pe;
    CUresult r = D.CtxSetCurrent(c);
    if (r != CUDA_SUCCESS)
        return map_err(r);
    t_bound = t_dev;
    return cudaSuccess;
}

/* What the other part of the runtime uses (fakecudart.h). */
cudaError_t fr_load(void)
{
    return rt_load();
}

cudaError_t fr_init(void)
{
    return rt_init();
}

cudaError_t fr_ensure_ctx(void)
{
    return ensure_ctx();
}

cudaError_t fr_ret(cudaError_t e)
{
    return ret(e);
}

cudaError_t fr_ret_cu(CUresult r)
{
    return ret_cu(r);
}

int fr_device_count(void)
{
    return g_ndev;
}

int fr_current_device(void)
{
    return t_dev;
}

cudaError_t fr_primary_context(int dev, CUcontext *ctx)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return e;
    if (dev < 0 || dev >= g_ndev || dev >= MAXDEV)
        return cudaErrorInvalidDevice;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&g_prim_mu);
    if (!g_prim[dev]) {
        CUdevice d;
        r = D.DeviceGet(&d, dev);
        if (r == CUDA_SUCCESS)
            r = D.DevicePrimaryCtxRetain(&g_prim[dev], d);
    }
    *ctx = g_prim[dev];
    pthread_mutex_unlock(&g_prim_mu);
    return map_err(r);
}

/* ------------------------------------------------------------------------ */
/* Devices                                                                   */

cudaError_t CUDARTAPI cudaGetDeviceCount(int *count)
{
    if (!count)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    *count = e == cudaSuccess ? g_ndev : 0;
    return ret(e);
}

cudaError_t CUDARTAPI cudaGetDevice(int *device)
{
    if (!device)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return ret(e);
    *device = t_dev;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return ret(e);
    if (device < 0 || device >= g_ndev || device >= MAXDEV)
        return ret(cudaErrorInvalidDevice);
    t_dev = device;
    return ret(ensure_ctx());
}

cudaError_t CUDARTAPI cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return ret(e);
    if (!value)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    CUdevice d;
    CUresult r = D.DeviceGet(&d, device);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetAttribute(value, (CUdevice_attribute)attr, d);
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return ret(e);
    if (!memPool)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    CUdevice d;
    CUresult r = D.DeviceGet(&d, device);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetDefaultMemPool((CUmemoryPool *)memPool, d);
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return ret(e);
    if (!memPool)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    CUdevice d;
    CUresult r = D.DeviceGet(&d, device);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetMemPool((CUmemoryPool *)memPool, d);
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
    cudaError_t e = rt_init();
    if (e != cudaSuccess)
        return ret(e);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    CUdevice d;
    CUresult r = D.DeviceGet(&d, device);
    if (r == CUDA_SUCCESS)
        r = D.DeviceSetMemPool(d, (CUmemoryPool)memPool);
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.CtxSynchronize ? D.CtxSynchronize() : D.CtxSynchronize_v2(NULL));
}

static cudaError_t stream_sync(CUresult (*fn)(CUstream), cudaStream_t stream)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(fn((CUstream)stream));
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream)
{
    NEED_LOAD();
    return stream_sync(D.StreamSynchronize, stream);
}

cudaError_t CUDARTAPI cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    NEED_LOAD();
    return stream_sync(D.StreamSynchronize_ptsz, stream);
}

cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return ret(cudaErrorInvalidValue);
    if (rt_load() != cudaSuccess) {
        *driverVersion = 0;
        return cudaSuccess;
    }
    return ret_cu(D.DriverGetVersion(driverVersion));
}

cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return ret(cudaErrorInvalidValue);
    *runtimeVersion = RT_VERSION;
    return cudaSuccess;
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                    */

cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    *devPtr = NULL;
    if (size == 0)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    CUdeviceptr p = 0;
    CUresult r = D.MemAlloc(&p, size);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaFree(void *devPtr)
{
    if (!devPtr)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemFree((CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t CUDARTAPI cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr || size == 0)
        return ret(cudaErrorInvalidValue);
    *devPtr = NULL;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    CUdeviceptr p = 0;
    CUresult r = D.MemAllocManaged(&p, size, flags);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    if (!devPtr || !pitch)
        return ret(cudaErrorInvalidValue);
    *devPtr = NULL;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    CUdeviceptr p = 0;
    CUresult r = D.MemAllocPitch(&p, pitch, width, height, 16);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    return ret_cu(r);
}

static cudaError_t malloc_async(CUresult (*fn)(CUdeviceptr *, size_t, CUstream), void **devPtr,
                                size_t size, cudaStream_t stream)
{
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    *devPtr = NULL;
    if (size == 0)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    CUdeviceptr p = 0;
    CUresult r = fn(&p, size, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    return ret_cu(r);
}

static cudaError_t free_async(CUresult (*fn)(CUdeviceptr, CUstream), void *devPtr,
                              cudaStream_t stream)
{
    if (!devPtr)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(fn((CUdeviceptr)(uintptr_t)devPtr, (CUstream)stream));
}

static cudaError_t malloc_pool(CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream),
                               void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream)
{
    if (!ptr || !pool)
        return ret(cudaErrorInvalidValue);
    *ptr = NULL;
    if (size == 0)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    CUdeviceptr p = 0;
    CUresult r = fn(&p, size, (CUmemoryPool)pool, (CUstream)stream);
    if (r == CUDA_SUCCESS)
        *ptr = (void *)(uintptr_t)p;
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    NEED_LOAD();
    return malloc_async(D.MemAllocAsync, devPtr, size, hStream);
}

cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    NEED_LOAD();
    return malloc_async(D.MemAllocAsync_ptsz, devPtr, size, hStream);
}

cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    NEED_LOAD();
    return free_async(D.MemFreeAsync, devPtr, hStream);
}

cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    NEED_LOAD();
    return free_async(D.MemFreeAsync_ptsz, devPtr, hStream);
}

cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                              cudaStream_t stream)
{
    NEED_LOAD();
    return malloc_pool(D.MemAllocFromPoolAsync, ptr, size, memPool, stream);
}

cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                   cudaStream_t stream)
{
    NEED_LOAD();
    return malloc_pool(D.MemAllocFromPoolAsync_ptsz, ptr, size, memPool, stream);
}

/* ------------------------------------------------------------------------ */
/* Memory pools: straight to the driver's (the pools are the driver's).     */

cudaError_t CUDARTAPI cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *poolProps)
{
    if (!memPool || !poolProps)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    CUmemPoolProps p;
    memset(&p, 0, sizeof p);
    p.allocType = (CUmemAllocationType)poolProps->allocType;
    p.handleTypes = (CUmemAllocationHandleType)poolProps->handleTypes;
    p.location.type = (CUmemLocationType)poolProps->location.type;
    p.location.id = poolProps->location.id;
    p.win32SecurityAttributes = poolProps->win32SecurityAttributes;
    p.maxSize = poolProps->maxSize;
    p.usage = poolProps->usage;
    return ret_cu(D.MemPoolCreate((CUmemoryPool *)memPool, &p));
}

cudaError_t CUDARTAPI cudaMemPoolDestroy(cudaMemPool_t memPool)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemPoolDestroy((CUmemoryPool)memPool));
}

cudaError_t CUDARTAPI cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemPoolTrimTo((CUmemoryPool)memPool, minBytesToKeep));
}

/* cudaMemPoolAttr and CUmemPool_attribute share their values. */
cudaError_t CUDARTAPI cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                              void *value)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemPoolSetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

cudaError_t CUDARTAPI cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                              void *value)
{
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemPoolGetAttribute((CUmemoryPool)memPool, (CUmemPool_attribute)attr, value));
}

/* ------------------------------------------------------------------------ */
/* Arrays and 3-D memory: through the driver's cuArray3DCreate,             */
/* cuMipmappedArrayCreate and cuMemAllocPitch.                               */

/* A channel descriptor as the driver's format and channel count: 1, 2 or 4
 * channels of the same size, signed, unsigned or float (16 or 32 bits). */
static cudaError_t channel_format(const struct cudaChannelFormatDesc *d, CUarray_format *fmt,
                                  unsigned *nch)
{
    int bits = d->x;
    unsigned n = !d->y ? 1 : !d->z ? 2 : 4;
    if (bits <= 0 || (n == 2 && d->w) || (n == 4 && !d->w) || (n == 1 && (d->z || d->w)) ||
        (n >= 2 && d->y != bits) || (n == 4 && (d->z != bits || d->w != bits)))
        return cudaErrorInvalidChannelDescriptor;
    switch (d->f) {
    case cudaChannelFormatKindSigned:
        *fmt = bits == 8    ? CU_AD_FORMAT_SIGNED_INT8
               : bits == 16 ? CU_AD_FORMAT_SIGNED_INT16
               : bits == 32 ? CU_AD_FORMAT_SIGNED_INT32
                            : CU_AD_FORMAT_MAX;
        break;
    case cudaChannelFormatKindUnsigned:
        *fmt = bits == 8    ? CU_AD_FORMAT_UNSIGNED_INT8
               : bits == 16 ? CU_AD_FORMAT_UNSIGNED_INT16
               : bits == 32 ? CU_AD_FORMAT_UNSIGNED_INT32
                            : CU_AD_FORMAT_MAX;
        break;
    case cudaChannelFormatKindFloat:
        *fmt = bits == 16 ? CU_AD_FORMAT_HALF : bits == 32 ? CU_AD_FORMAT_FLOAT : CU_AD_FORMAT_MAX;
        break;
    default: *fmt = CU_AD_FORMAT_MAX; break;
    }
    if (*fmt == CU_AD_FORMAT_MAX)
        return cudaErrorInvalidChannelDescriptor;
    *nch = n;
    return cudaSuccess;
}

/* cudaArray_t and CUarray are the same handles, as are the mipmapped ones. */
static cudaError_t array3d(void **out, const struct cudaChannelFormatDesc *desc, size_t w, size_t h,
                           size_t d, unsigned flags, unsigned levels)
{
    if (!out || !desc)
        return ret(cudaErrorInvalidValue);
    *out = NULL;
    CUDA_ARRAY3D_DESCRIPTOR a;
    memset(&a, 0, sizeof a);
    cudaError_t e = channel_format(desc, &a.Format, &a.NumChannels);
    if (e != cudaSuccess)
        return ret(e);
    if ((e = ensure_ctx()) != cudaSuccess)
        return ret(e);
    a.Width = w;
    a.Height = h;
    a.Depth = d;
    a.Flags = flags; /* cudaArray* flags have the CUDA_ARRAY3D_* values */
    CUresult r = levels ? D.MipmappedArrayCreate((CUmipmappedArray *)out, &a, levels)
                        : D.Array3DCreate((CUarray *)out, &a);
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                      size_t width, size_t height, unsigned int flags)
{
    return array3d((void **)array, desc, width, height, 0, flags, 0);
}

cudaError_t CUDARTAPI cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
                                        struct cudaExtent extent, unsigned int flags)
{
    return array3d((void **)array, desc, extent.width, extent.height, extent.depth, flags, 0);
}

cudaError_t CUDARTAPI cudaMallocMipmappedArray(cudaMipmappedArray_t *mipmappedArray,
                                               const struct cudaChannelFormatDesc *desc,
                                               struct cudaExtent extent, unsigned int numLevels,
                                               unsigned int flags)
{
    /* numLevels 0 would mean a plain array here: the driver rejects it */
    if (numLevels == 0)
        return ret(cudaErrorInvalidValue);
    return array3d((void **)mipmappedArray, desc, extent.width, extent.height, extent.depth, flags,
                   numLevels);
}

cudaError_t CUDARTAPI cudaFreeArray(cudaArray_t array)
{
    if (!array)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.ArrayDestroy((CUarray)array));
}

cudaError_t CUDARTAPI cudaFreeMipmappedArray(cudaMipmappedArray_t mipmappedArray)
{
    if (!mipmappedArray)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MipmappedArrayDestroy((CUmipmappedArray)mipmappedArray));
}

/* Pitched linear memory: width bytes rounded up to the pitch, for each of
 * height x depth rows (one cuMemAllocPitch of height x depth rows). */
cudaError_t CUDARTAPI cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
    if (!pitchedDevPtr)
        return ret(cudaErrorInvalidValue);
    memset(pitchedDevPtr, 0, sizeof *pitchedDevPtr);
    size_t rows;
    if (__builtin_mul_overflow(extent.height, extent.depth, &rows))
        return ret(cudaErrorInvalidValue);
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    CUdeviceptr p = 0;
    size_t pitch = 0;
    CUresult r = D.MemAllocPitch(&p, &pitch, extent.width, rows, 16);
    if (r == CUDA_SUCCESS) {
        pitchedDevPtr->ptr = (void *)(uintptr_t)p;
        pitchedDevPtr->pitch = pitch;
        pitchedDevPtr->xsize = extent.width;
        pitchedDevPtr->ysize = extent.height;
    }
    return ret_cu(r);
}

/* ------------------------------------------------------------------------ */
/* Host memory: the driver's page-locked host allocations.                   */

cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size)
{
    if (!ptr)
        return ret(cudaErrorInvalidValue);
    *ptr = NULL;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemAllocHost(ptr, size));
}

/* cudaHostAlloc* flags have the CU_MEMHOSTALLOC_* values. */
cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (!pHost)
        return ret(cudaErrorInvalidValue);
    *pHost = NULL;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemHostAlloc(pHost, size, flags));
}

cudaError_t CUDARTAPI cudaFreeHost(void *ptr)
{
    if (!ptr)
        return cudaSuccess;
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemFreeHost(ptr));
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (!free_bytes || !total)
        return ret(cudaErrorInvalidValue);
    cudaError_t e = ensure_ctx();
    if (e != cudaSuccess)
        return ret(e);
    return ret_cu(D.MemGetInfo(free_bytes, total));
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

static const struct {
    cudaError_t code;
    const char *name, *str;
} g_errs[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorOperatingSystem, "cudaErrorOperatingSystem",
     "OS call failed or operation not supported on this OS"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
     "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice",
     "no kernel image is available for execution on the device"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access has not been enabled"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *CUDARTAPI cudaGetErrorString(cudaError_t error)
{
    for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++)
        if (g_errs[i].code == error)
            return g_errs[i].str;
    return "unrecognized error code";
}

const char *CUDARTAPI cudaGetErrorName(cudaError_t error)
{
    for (size_t i = 0; i < sizeof g_errs / sizeof g_errs[0]; i++)
        if (g_errs[i].code == error)
            return g_errs[i].name;
    return "unrecognized error code";
}

cudaError_t CUDARTAPI cudaGetLastError(void)
{
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void)
{
    return t_last;
}

/* ------------------------------------------------------------------------ */
/* Driver entry points: straight through the driver's cuGetProcAddress_v2.   */

static cudaError_t entry_point(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *driverStatus, int ptsz)
{
    if (!symbol || !funcPtr)
        return ret(cudaErrorInvalidValue);
    if (flags & ~(unsigned long long)(cudaEnableLegacyStream | cudaEnablePerThreadDefaultStream))
        return ret(cudaErrorInvalidValue);
    cudaError_t e = rt_load();
    if (e != cudaSuccess)
        return ret(e);
    cuuint64_t cf = flags;
    if (cf == cudaEnableDefault)
        cf = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    CUdriverProcAddressQueryResult qs = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    *funcPtr = NULL;
    CUresult r = g_getproc(symbol, funcPtr, (int)cudaVersion, cf, &qs);
    if (driverStatus)
        *driverStatus = (enum cudaDriverEntryPointQueryResult)qs;
    if (r == CUDA_ERROR_NOT_FOUND) {
        *funcPtr = NULL;
        return cudaSuccess;
    }
    return ret_cu(r);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                              unsigned long long flags,
                                              enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, RT_VERSION, flags, driverStatus, 0);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr,
                                                   unsigned long long flags,
                                                   enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, RT_VERSION, flags, driverStatus, 1);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                                       unsigned int cudaVersion,
                                                       unsigned long long flags,
                                                       enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, 0);
}

cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, 1);
}

/* ------------------------------------------------------------------------ */
/* What nvcc-generated host code calls (crt/host_runtime.h): at load time, a
 * library's constructor registers each fat binary, then its kernels and
 * variables; a launch pushes and pops its configuration. The handle keeps
 * the wrapper, as the real one does; the fake device loads no module and
 * runs no kernel: a launch is checked and succeeds without running.       */

/* Declared by crt/host_runtime.h and crt/device_functions.h, C++ only. */
void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin);
void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle);
void CUDARTAPI __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                      const char *deviceName, int thread_limit, uint3 *tid,
                                      uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
void CUDARTAPI __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                                 const char *deviceName, int ext, size_t size, int constant,
                                 int global);
void CUDARTAPI __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                                        char *deviceAddress, const char *deviceName, int ext,
                                        size_t size, int constant, int global);
char CUDARTAPI __cudaInitModule(void **fatCubinHandle);
unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                               struct CUstream_st *stream);
cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                                 void *stream);
cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                         void **args, size_t sharedMem, cudaStream_t stream);
cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                              void **args, size_t sharedMem, cudaStream_t stream);

struct fake_module {
    void *wrapper; /* {int magic; int version; const void *data; void *extra} */
    unsigned functions, variables;
};

static pthread_mutex_t g_mod_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_modules; /* registered and not yet unregistered */

void **CUDARTAPI __cudaRegisterFatBinary(void *fatCubin)
{
    struct fake_module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->wrapper = fatCubin;
    pthread_mutex_lock(&g_mod_mu);
    g_modules++;
    pthread_mutex_unlock(&g_mod_mu);
    return (void **)m; /* *handle is the wrapper */
}

void CUDARTAPI __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
    (void)fatCubinHandle;
}

void CUDARTAPI __cudaUnregisterFatBinary(void **fatCubinHandle)
{
    if (!fatCubinHandle)
        return;
    pthread_mutex_lock(&g_mod_mu);
    g_modules--;
    pthread_mutex_unlock(&g_mod_mu);
    free(fatCubinHandle);
}

void CUDARTAPI __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                      const char *deviceName, int thread_limit, uint3 *tid,
                                      uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
    (void)hostFun, (void)deviceFun, (void)deviceName, (void)thread_limit, (void)tid, (void)bid;
    (void)bDim, (void)gDim, (void)wSize;
    if (fatCubinHandle)
        ((struct fake_module *)fatCubinHandle)->functions++;
}

void CUDARTAPI __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                                 const char *deviceName, int ext, size_t size, int constant,
                                 int global)
{
    (void)hostVar, (void)deviceAddress, (void)deviceName, (void)ext, (void)size, (void)constant;
    (void)global;
    if (fatCubinHandle)
        ((struct fake_module *)fatCubinHandle)->variables++;
}

void CUDARTAPI __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
                                        char *deviceAddress, const char *deviceName, int ext,
                                        size_t size, int constant, int global)
{
    (void)hostVarPtrAddress;
    __cudaRegisterVar(fatCubinHandle, NULL, deviceAddress, deviceName, ext, size, constant, global);
}

char CUDARTAPI __cudaInitModule(void **fatCubinHandle)
{
    return fatCubinHandle != NULL;
}

static __thread struct {
    dim3 grid, block;
    size_t shared;
    void *stream;
} t_launch;

unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                               struct CUstream_st *stream)
{
    t_launch.grid = gridDim;
    t_launch.block = blockDim;
    t_launch.shared = sharedMem;
    t_launch.stream = stream;
    return 0;
}

cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                                 void *stream)
{
    *gridDim = t_launch.grid;
    *blockDim = t_launch.block;
    *sharedMem = t_launch.shared;
    *(void **)stream = t_launch.stream;
    return cudaSuccess;
}

cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun)
{
    if (!kernel || !hostFun)
        return ret(cudaErrorInvalidValue);
    *kernel = (cudaKernel_t)(uintptr_t)hostFun;
    return cudaSuccess;
}

/* A launch is checked as the runtime checks it and runs nothing
 * (fakecudart_exec.c). */
cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                         void **args, size_t sharedMem, cudaStream_t stream)
{
    (void)args;
    return kernel ? fr_launch(gridDim, blockDim, sharedMem, stream)
                  : ret(cudaErrorInvalidDeviceFunction);
}

cudaError_t CUDARTAPI __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                              void **args, size_t sharedMem, cudaStream_t stream)
{
    return __cudaLaunchKernel(kernel, gridDim, blockDim, args, sharedMem, stream);
}

cudaError_t CUDARTAPI cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                       size_t sharedMem, cudaStream_t stream)
{
    (void)args;
    return func ? fr_launch(gridDim, blockDim, sharedMem, stream)
                : ret(cudaErrorInvalidDeviceFunction);
}

/* Test hook: the fat binaries registered and not unregistered (it proves a
 * registration reached this runtime). */
unsigned fakecudart_modules(void);
unsigned fakecudart_modules(void)
{
    pthread_mutex_lock(&g_mod_mu);
    unsigned n = g_modules;
    pthread_mutex_unlock(&g_mod_mu);
    return n;
}
