/*
 * srtlike.c - a stand-in for a program built with plain nvcc (NVIDIA's
 * static runtime linked in), which cannot run on the fake driver: that
 * runtime needs the driver's private export tables (see tests/fake/README.md).
 *
 * Labelled as what it is: a "static-runtime-like" program. It carries its
 * own cudaMalloc, cudaFree, ... (defined here, so bound inside the
 * executable: a preloaded library exporting cudaMalloc never sees them) and
 * reaches the driver exactly the way NVIDIA's static runtime does (observed
 * with FAKECUDA_TRACE on nvccprog): dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2 on that handle, then cuGetProcAddress_v2(name, &fn,
 * VERSION, 0, &status) for every function, VERSION being the CUDA version
 * that introduced the ABI it was compiled against (cuMemAlloc at 3020: the
 * _v2; cuInit at 2000). What it skips is the private interface.
 * Commands: tests/progs/rtcmds.h.
 */
#include <cuda.h>

#include "rtcmds.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemFreeHost)(void *);
} D;

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static cudaError_t g_init;
static __thread cudaError_t t_last;

static cudaError_t map_err(CUresult r)
{
    return r == CUDA_ERROR_OUT_OF_MEMORY ? cudaErrorMemoryAllocation
           : r == CUDA_ERROR_INVALID_VALUE ? cudaErrorInvalidValue
                                           : (cudaError_t)r;
}

static cudaError_t ret(CUresult r)
{
    cudaError_t e = map_err(r);
    if (e)
        t_last = e;
    return e;
}

static void start(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    getproc_fn getproc = h ? (getproc_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!getproc) {
        g_init = cudaErrorInsufficientDriver;
        return;
    }
    static const struct {
        const char *name;
        int version;
        size_t offset;
    } want[] = {
#define W(field, name, version) {name, version, offsetof(__typeof__(D), field)}
        W(Init, "cuInit", 2000),
        W(DeviceGet, "cuDeviceGet", 2000),
        W(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000),
        W(CtxSetCurrent, "cuCtxSetCurrent", 4000),
        W(CtxSynchronize, "cuCtxSynchronize", 2000),
        W(MemGetInfo, "cuMemGetInfo", 3020),
        W(MemAlloc, "cuMemAlloc", 3020),
        W(MemFree, "cuMemFree", 3020),
        W(MemAllocAsync, "cuMemAllocAsync", 11020),
        W(MemFreeAsync, "cuMemFreeAsync", 11020),
        W(MemHostAlloc, "cuMemHostAlloc", 2020),
        W(MemFreeHost, "cuMemFreeHost", 2000),
#undef W
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (getproc(want[i].name, &fn, want[i].version, CU_GET_PROC_ADDRESS_DEFAULT, &st) ||
            st != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
            g_init = cudaErrorCallRequiresNewerDriver;
            return;
        }
        memcpy((char *)&D + want[i].offset, &fn, sizeof fn);
    }
    CUdevice dev;
    CUcontext ctx;
    CUresult r = D.Init(0);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGet(&dev, 0);
    if (r == CUDA_SUCCESS)
        r = D.DevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS)
        r = D.CtxSetCurrent(ctx);
    g_init = map_err(r);
}

/* The driver is found, initialised, and device 0's primary context current
 * on this (the only) thread. */
static cudaError_t ready(void)
{
    pthread_once(&g_once, start);
    if (g_init)
        t_last = g_init;
    return g_init;
}

cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return t_last = cudaErrorInvalidValue;
    *devPtr = NULL;
    if (size == 0)
        return cudaSuccess;
    cudaError_t e = ready();
    if (e)
        return e;
    CUdeviceptr p = 0;
    CUresult r = D.MemAlloc(&p, size);
    *devPtr = (void *)(uintptr_t)p;
    return ret(r);
}

cudaError_t CUDARTAPI cudaFree(void *devPtr)
{
    cudaError_t e = devPtr ? ready() : cudaSuccess;
    return e ? e : devPtr ? ret(D.MemFree((CUdeviceptr)(uintptr_t)devPtr)) : cudaSuccess;
}

cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    cudaError_t e = ready();
    if (e)
        return e;
    CUdeviceptr p = 0;
    CUresult r = D.MemAllocAsync(&p, size, (CUstream)stream);
    *devPtr = (void *)(uintptr_t)p;
    return ret(r);
}

cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    cudaError_t e = ready();
    return e ? e : ret(D.MemFreeAsync((CUdeviceptr)(uintptr_t)devPtr, (CUstream)stream));
}

cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size)
{
    cudaError_t e = ready();
    return e ? e : ret(D.MemHostAlloc(ptr, size, 0));
}

cudaError_t CUDARTAPI cudaFreeHost(void *ptr)
{
    cudaError_t e = ready();
    return e ? e : ret(D.MemFreeHost(ptr));
}

cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    cudaError_t e = ready();
    return e ? e : ret(D.MemGetInfo(free_bytes, total));
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void)
{
    cudaError_t e = ready();
    return e ? e : ret(D.CtxSynchronize());
}

cudaError_t CUDARTAPI cudaGetLastError(void)
{
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

const char *CUDARTAPI cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorCallRequiresNewerDriver: return "cudaErrorCallRequiresNewerDriver";
    default: return "unrecognized error code";
    }
}

int main(int argc, char **argv)
{
    return rt_main("srtlike", argc, argv);
}
