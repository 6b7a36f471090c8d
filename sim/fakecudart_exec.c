/*
 * fakecudart_exec.c - what real frameworks call besides memory (part of the
 * fake libcudart; see fakecudart.h): device properties, streams, events,
 * copies and sets, launches and occupancy, pointer queries, peers, host
 * registration, IPC and graphs (refused), the profiler.
 *
 * Every call goes to the driver function of the same job, resolved at the
 * runtime's version (D); driver errors keep their number, as in
 * fakecudart.c. The runtime of CUDA 12 fills CUDA 12's structures, which
 * are laid out differently from CUDA 13's (the headers this is built
 * against): cudaDeviceProp (1032 bytes in 12.x) and cudaPointerAttributes
 * (24 bytes in 12.x, 88 in 13). Writing 13's layout into a caller built
 * against 12 would overwrite its stack; the layouts below are CUDA 12.4's,
 * checked field by field against its driver_types.h.
 */
#include "fakecudart.h"

#include <cuda_profiler_api.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Device properties                                                         */

#if RT_VERSION < 13000
/* cudaDeviceProp of CUDA 12 (12.0-12.9 share it). */
struct prop12 {
    char name[256];
    cudaUUID_t uuid;
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem, sharedMemPerBlock;
    int regsPerBlock, warpSize;
    size_t memPitch;
    int maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3], clockRate;
    size_t totalConstMem;
    int major, minor;
    size_t textureAlignment, texturePitchAlignment;
    int deviceOverlap, multiProcessorCount, kernelExecTimeoutEnabled, integrated, canMapHostMemory,
        computeMode, maxTexture1D, maxTexture1DMipmap, maxTexture1DLinear, maxTexture2D[2],
        maxTexture2DMipmap[2], maxTexture2DLinear[3], maxTexture2DGather[2], maxTexture3D[3],
        maxTexture3DAlt[3], maxTextureCubemap, maxTexture1DLayered[2], maxTexture2DLayered[3],
        maxTextureCubemapLayered[2], maxSurface1D, maxSurface2D[2], maxSurface3D[3],
        maxSurface1DLayered[2], maxSurface2DLayered[3], maxSurfaceCubemap,
        maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels, ECCEnabled, pciBusID, pciDeviceID, pciDomainID, tccDriver,
        asyncEngineCount, unifiedAddressing, memoryClockRate, memoryBusWidth, l2CacheSize,
        persistingL2CacheMaxSize, maxThreadsPerMultiProcessor, streamPrioritiesSupported,
        globalL1CacheSupported, localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor, managedMemory, isMultiGpuBoard, multiGpuBoardGroupID,
        hostNativeAtomicSupported, singleToDoublePrecisionPerfRatio, pageableMemoryAccess,
        concurrentManagedAccess, computePreemptionSupported, canUseHostPointerForRegisteredMem,
        cooperativeLaunch, cooperativeMultiDeviceLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables, directManagedMemAccessFromHost,
        maxBlocksPerMultiProcessor, accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported, sparseCudaArraySupported, hostRegisterReadOnlySupported,
        timelineSemaphoreInteropSupported, memoryPoolsSupported, gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingCudaArraySupported, ipcEventSupported, clusterLaunch,
        unifiedFunctionPointers, reserved2[2], reserved1[1], reserved[60];
};
_Static_assert(sizeof(struct prop12) == 1032, "CUDA 12's cudaDeviceProp is 1032 bytes");
_Static_assert(offsetof(struct prop12, totalGlobalMem) == 288, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, major) == 360, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, multiProcessorCount) == 388, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, pciBusID) == 584, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, l2CacheSize) == 616, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, maxThreadsPerMultiProcessor) == 624, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, sharedMemPerMultiprocessor) == 640, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, sharedMemPerBlockOptin) == 696, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, maxBlocksPerMultiProcessor) == 712, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, memoryPoolsSupported) == 744, "CUDA 12 layout");
_Static_assert(offsetof(struct prop12, unifiedFunctionPointers) == 776, "CUDA 12 layout");
typedef struct prop12 prop_t;
#else
typedef struct cudaDeviceProp prop_t;
#endif

/* Fields both layouts have, from the driver's attributes (as the real
 * runtime builds them). */
static cudaError_t fill_props(prop_t *p, int device)
{
    CUdevice d;
    CUresult r = D.DeviceGet(&d, device);
    if (r != CUDA_SUCCESS)
        return fr_ret_cu(r);
    memset(p, 0, sizeof *p);
    size_t total = 0;
    CUuuid uuid;
    if ((r = D.DeviceGetName(p->name, sizeof p->name, d)) != CUDA_SUCCESS ||
        (r = D.DeviceTotalMem(&total, d)) != CUDA_SUCCESS ||
        (r = D.DeviceGetUuid(&uuid, d)) != CUDA_SUCCESS)
        return fr_ret_cu(r);
    p->totalGlobalMem = total;
    memcpy(p->uuid.bytes, uuid.bytes, sizeof uuid.bytes);
#define A(field, attr)                                                                        \
    do {                                                                                      \
        int v_ = 0;                                                                           \
        if ((r = D.DeviceGetAttribute(&v_, CU_DEVICE_ATTRIBUTE_##attr, d)) != CUDA_SUCCESS)   \
            return fr_ret_cu(r);                                                              \
        p->field = (__typeof__(p->field))v_;                                                  \
    } while (0)
    A(major, COMPUTE_CAPABILITY_MAJOR);
    A(minor, COMPUTE_CAPABILITY_MINOR);
    A(sharedMemPerBlock, MAX_SHARED_MEMORY_PER_BLOCK);
    A(regsPerBlock, MAX_REGISTERS_PER_BLOCK);
    A(warpSize, WARP_SIZE);
    A(memPitch, MAX_PITCH);
    A(maxThreadsPerBlock, MAX_THREADS_PER_BLOCK);
    A(maxThreadsDim[0], MAX_BLOCK_DIM_X);
    A(maxThreadsDim[1], MAX_BLOCK_DIM_Y);
    A(maxThreadsDim[2], MAX_BLOCK_DIM_Z);
    A(maxGridSize[0], MAX_GRID_DIM_X);
    A(maxGridSize[1], MAX_GRID_DIM_Y);
    A(maxGridSize[2], MAX_GRID_DIM_Z);
    A(totalConstMem, TOTAL_CONSTANT_MEMORY);
    A(textureAlignment, TEXTURE_ALIGNMENT);
    A(texturePitchAlignment, TEXTURE_PITCH_ALIGNMENT);
    A(multiProcessorCount, MULTIPROCESSOR_COUNT);
    A(integrated, INTEGRATED);
    A(canMapHostMemory, CAN_MAP_HOST_MEMORY);
    A(surfaceAlignment, SURFACE_ALIGNMENT);
    A(concurrentKernels, CONCURRENT_KERNELS);
    A(ECCEnabled, ECC_ENABLED);
    A(pciBusID, PCI_BUS_ID);
    A(pciDeviceID, PCI_DEVICE_ID);
    A(pciDomainID, PCI_DOMAIN_ID);
    A(asyncEngineCount, ASYNC_ENGINE_COUNT);
    A(unifiedAddressing, UNIFIED_ADDRESSING);
    A(l2CacheSize, L2_CACHE_SIZE);
    A(persistingL2CacheMaxSize, MAX_PERSISTING_L2_CACHE_SIZE);
    A(maxThreadsPerMultiProcessor, MAX_THREADS_PER_MULTIPROCESSOR);
    A(streamPrioritiesSupported, STREAM_PRIORITIES_SUPPORTED);
    A(globalL1CacheSupported, GLOBAL_L1_CACHE_SUPPORTED);
    A(localL1CacheSupported, LOCAL_L1_CACHE_SUPPORTED);
    A(sharedMemPerMultiprocessor, MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
    A(regsPerMultiprocessor, MAX_REGISTERS_PER_MULTIPROCESSOR);
    A(managedMemory, MANAGED_MEMORY);
    A(concurrentManagedAccess, CONCURRENT_MANAGED_ACCESS);
    A(computePreemptionSupported, COMPUTE_PREEMPTION_SUPPORTED);
    A(cooperativeLaunch, COOPERATIVE_LAUNCH);
    A(sharedMemPerBlockOptin, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    A(maxBlocksPerMultiProcessor, MAX_BLOCKS_PER_MULTIPROCESSOR);
    A(accessPolicyMaxWindowSize, MAX_ACCESS_POLICY_WINDOW_SIZE);
    A(reservedSharedMemPerBlock, RESERVED_SHARED_MEMORY_PER_BLOCK);
    A(hostRegisterSupported, HOST_REGISTER_SUPPORTED);
    A(memoryPoolsSupported, MEMORY_POOLS_SUPPORTED);
    A(memoryPoolSupportedHandleTypes, MEMPOOL_SUPPORTED_HANDLE_TYPES);
    A(clusterLaunch, CLUSTER_LAUNCH);
#if RT_VERSION < 13000
    /* Gone from CUDA 13's structure. */
    A(clockRate, CLOCK_RATE);
    A(memoryClockRate, MEMORY_CLOCK_RATE);
    A(deviceOverlap, GPU_OVERLAP);
    A(kernelExecTimeoutEnabled, KERNEL_EXEC_TIMEOUT);
    A(computeMode, COMPUTE_MODE);
    A(singleToDoublePrecisionPerfRatio, SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO);
#endif
    A(memoryBusWidth, GLOBAL_MEMORY_BUS_WIDTH);
#undef A
    return cudaSuccess;
}

static cudaError_t device_properties(prop_t *prop, int device)
{
    cudaError_t e = fr_init();
    if (e != cudaSuccess)
        return fr_ret(e);
    if (!prop)
        return fr_ret(cudaErrorInvalidValue);
    if (device < 0 || device >= fr_device_count())
        return fr_ret(cudaErrorInvalidDevice);
    return fill_props(prop, device);
}

#if RT_VERSION < 13000
cudaError_t CUDARTAPI cudaGetDeviceProperties_v2(struct prop12 *prop, int device);
cudaError_t CUDARTAPI cudaGetDeviceProperties_v2(struct prop12 *prop, int device)
{
    return device_properties(prop, device);
}
#else
cudaError_t CUDARTAPI cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    return device_properties(prop, device);
}
#endif

cudaError_t CUDARTAPI cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
    cudaError_t e = fr_init();
    if (e != cudaSuccess)
        return fr_ret(e);
    CUdevice d;
    CUresult r = D.DeviceGet(&d, device);
    return fr_ret_cu(r ? r : D.DeviceGetPCIBusId(pciBusId, len, d));
}

cudaError_t CUDARTAPI cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    cudaError_t e = fr_ensure_ctx();
    if (e != cudaSuccess)
        return fr_ret(e);
    return fr_ret_cu(D.CtxGetStreamPriorityRange(leastPriority, greatestPriority));
}

cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
    cudaError_t e = fr_init();
    if (e != cudaSuccess)
        return fr_ret(e);
    CUdevice a, b;
    CUresult r = D.DeviceGet(&a, device);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGet(&b, peerDevice);
    return fr_ret_cu(r ? r : D.DeviceCanAccessPeer(canAccessPeer, a, b));
}

cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags)
{
    cudaError_t e = fr_ensure_ctx();
    if (e != cudaSuccess)
        return fr_ret(e);
    CUcontext peer;
    if ((e = fr_primary_context(peerDevice, &peer)) != cudaSuccess)
        return fr_ret(e);
    return fr_ret_cu(D.CtxEnablePeerAccess(peer, flags));
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

#define IN_CONTEXT()                                  \
    do {                                              \
        cudaError_t e_ = fr_ensure_ctx();             \
        if (e_ != cudaSuccess)                        \
            return fr_ret(e_);                        \
    } while (0)

cudaError_t CUDARTAPI cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                   int priority)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamCreateWithPriority((CUstream *)pStream, flags, priority));
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamDestroy((CUstream)stream));
}

cudaError_t CUDARTAPI cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamGetPriority((CUstream)hStream, priority));
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamQuery((CUstream)stream));
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamWaitEvent((CUstream)stream, (CUevent)event, flags));
}

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamBeginCapture((CUstream)stream, (CUstreamCaptureMode)mode));
}

cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamEndCapture((CUstream)stream, (CUgraph *)pGraph));
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus *pCaptureStatus)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamIsCapturing((CUstream)stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

/* CUDA 12's name for the 11.3 ABI (CUDA 13 made the edge-data form the
 * plain one). */
cudaError_t CUDARTAPI cudaStreamGetCaptureInfo_v2(cudaStream_t stream,
                                                  enum cudaStreamCaptureStatus *captureStatus_out,
                                                  unsigned long long *id_out, cudaGraph_t *graph_out,
                                                  const cudaGraphNode_t **dependencies_out,
                                                  size_t *numDependencies_out);
cudaError_t CUDARTAPI cudaStreamGetCaptureInfo_v2(cudaStream_t stream,
                                                  enum cudaStreamCaptureStatus *captureStatus_out,
                                                  unsigned long long *id_out, cudaGraph_t *graph_out,
                                                  const cudaGraphNode_t **dependencies_out,
                                                  size_t *numDependencies_out)
{
    IN_CONTEXT();
    return fr_ret_cu(D.StreamGetCaptureInfo((CUstream)stream, (CUstreamCaptureStatus *)captureStatus_out,
                                            (cuuint64_t *)id_out, (CUgraph *)graph_out,
                                            (const CUgraphNode **)dependencies_out,
                                            numDependencies_out));
}

cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
    cudaError_t e = fr_init();
    if (e != cudaSuccess)
        return fr_ret(e);
    return fr_ret_cu(D.ThreadExchangeStreamCaptureMode((CUstreamCaptureMode *)mode));
}

cudaError_t CUDARTAPI cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    IN_CONTEXT();
    return fr_ret_cu(D.LaunchHostFunc((CUstream)stream, (CUhostFn)fn, userData));
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    IN_CONTEXT();
    return fr_ret_cu(D.EventCreate((CUevent *)event, flags));
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event)
{
    IN_CONTEXT();
    return fr_ret_cu(D.EventDestroy((CUevent)event));
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    IN_CONTEXT();
    return fr_ret_cu(D.EventRecord((CUevent)event, (CUstream)stream));
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event)
{
    IN_CONTEXT();
    return fr_ret_cu(D.EventQuery((CUevent)event));
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event)
{
    IN_CONTEXT();
    return fr_ret_cu(D.EventSynchronize((CUevent)event));
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    IN_CONTEXT();
    return fr_ret_cu(D.EventElapsedTime(ms, (CUevent)start, (CUevent)end));
}

/* ------------------------------------------------------------------------ */
/* Copies and sets: the driver knows which side is the device's             */

cudaError_t CUDARTAPI cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    IN_CONTEXT();
    if ((unsigned)kind > cudaMemcpyDefault)
        return fr_ret(cudaErrorInvalidMemcpyDirection);
    return fr_ret_cu(D.Memcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count));
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                      enum cudaMemcpyKind kind, cudaStream_t stream)
{
    IN_CONTEXT();
    if ((unsigned)kind > cudaMemcpyDefault)
        return fr_ret(cudaErrorInvalidMemcpyDirection);
    return fr_ret_cu(D.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, count,
                                   (CUstream)stream));
}

cudaError_t CUDARTAPI cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
                                          size_t count, cudaStream_t stream)
{
    IN_CONTEXT();
    CUcontext dc, sc;
    cudaError_t e = fr_primary_context(dstDevice, &dc);
    if (e == cudaSuccess)
        e = fr_primary_context(srcDevice, &sc);
    if (e != cudaSuccess)
        return fr_ret(e);
    return fr_ret_cu(D.MemcpyPeerAsync((CUdeviceptr)(uintptr_t)dst, dc, (CUdeviceptr)(uintptr_t)src,
                                       sc, count, (CUstream)stream));
}

cudaError_t CUDARTAPI cudaMemset(void *devPtr, int value, size_t count)
{
    IN_CONTEXT();
    return fr_ret_cu(D.MemsetD8((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count));
}

cudaError_t CUDARTAPI cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    IN_CONTEXT();
    return fr_ret_cu(D.MemsetD8Async((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count,
                                     (CUstream)stream));
}

/* ------------------------------------------------------------------------ */
/* Host memory the device may use, and what a pointer is                     */

cudaError_t CUDARTAPI cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    IN_CONTEXT();
    return fr_ret_cu(D.MemHostRegister(ptr, size, flags));
}

cudaError_t CUDARTAPI cudaHostUnregister(void *ptr)
{
    IN_CONTEXT();
    return fr_ret_cu(D.MemHostUnregister(ptr));
}

cudaError_t CUDARTAPI cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    IN_CONTEXT();
    return fr_ret_cu(D.MemHostGetDevicePointer((CUdeviceptr *)pDevice, pHost, flags));
}

/* The four fields CUDA 12's cudaPointerAttributes has (24 bytes): CUDA 13
 * added reserved space after them, which a CUDA 12 caller does not have. */
struct pointer_head {
    enum cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
_Static_assert(sizeof(struct pointer_head) == 24, "CUDA 12's cudaPointerAttributes");
_Static_assert(offsetof(struct cudaPointerAttributes, hostPointer) ==
                   offsetof(struct pointer_head, hostPointer),
               "CUDA 13 keeps CUDA 12's fields first");

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                               const void *ptr)
{
    cudaError_t e = fr_init();
    if (e != cudaSuccess)
        return fr_ret(e);
    if (!attributes)
        return fr_ret(cudaErrorInvalidValue);
    unsigned int type = 0;
    int device = -2;
    CUdeviceptr dptr = 0;
    void *hptr = NULL;
    CUpointer_attribute what[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                  CU_POINTER_ATTRIBUTE_DEVICE_POINTER, CU_POINTER_ATTRIBUTE_HOST_POINTER};
    void *out[] = {&type, &device, &dptr, &hptr};
    CUresult r = D.PointerGetAttributes(4, what, out, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS)
        return fr_ret_cu(r);
#if RT_VERSION >= 13000
    memset(attributes, 0, sizeof *attributes);
#endif
    struct pointer_head *h = (struct pointer_head *)attributes;
    /* Memory the driver does not know is ordinary host memory: no device. */
    h->type = type == CU_MEMORYTYPE_DEVICE ? cudaMemoryTypeDevice
              : type == CU_MEMORYTYPE_HOST ? cudaMemoryTypeHost
                                           : cudaMemoryTypeUnregistered;
    h->device = type ? device : -2;
    h->devicePointer = type ? (void *)(uintptr_t)dptr : NULL;
    h->hostPointer = type == CU_MEMORYTYPE_HOST ? hptr : type ? NULL : (void *)ptr;
    return cudaSuccess;
}

/* ------------------------------------------------------------------------ */
/* Launches and what they are planned from                                   */

/* A stream handle the runtime takes: the default streams, or a live one. */
static cudaError_t check_stream(cudaStream_t stream)
{
    CUresult r = D.StreamQuery((CUstream)stream);
    return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY ? cudaSuccess
                                                          : fr_ret(cudaErrorInvalidResourceHandle);
}

cudaError_t fr_launch(dim3 grid, dim3 block, size_t shared, cudaStream_t stream)
{
    cudaError_t e = fr_ensure_ctx();
    if (e != cudaSuccess)
        return fr_ret(e);
    if ((e = check_stream(stream)) != cudaSuccess)
        return e;
    CUdevice d;
    CUresult r = D.DeviceGet(&d, fr_current_device());
    int max_threads = 1024, max_smem = 49152;
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetAttribute(&max_smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d);
    if (r != CUDA_SUCCESS)
        return fr_ret_cu(r);
    if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z ||
        (uint64_t)block.x * block.y * block.z > (uint64_t)max_threads || block.x > 1024 ||
        block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 ||
        shared > (size_t)max_smem)
        return fr_ret(cudaErrorInvalidConfiguration);
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                          void **args)
{
    (void)args;
    if (!config)
        return fr_ret(cudaErrorInvalidValue);
    if (!func)
        return fr_ret(cudaErrorInvalidDeviceFunction);
    return fr_launch(config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream);
}

/* A kernel's attributes: what a typical compiled kernel has (the fake reads
 * no device code), and the dynamic shared memory it was allowed, per
 * function (a small table: frameworks set it for a few kernels). */
#define MAX_SMEM_FUNCS 256
static struct {
    const void *func;
    int bytes;
} g_smem[MAX_SMEM_FUNCS];
static int g_nsmem;
static pthread_mutex_t g_smem_mu = PTHREAD_MUTEX_INITIALIZER;

static int max_dynamic_smem(const void *func)
{
    int bytes = 49152;
    pthread_mutex_lock(&g_smem_mu);
    for (int i = 0; i < g_nsmem; i++)
        if (g_smem[i].func == func)
            bytes = g_smem[i].bytes;
    pthread_mutex_unlock(&g_smem_mu);
    return bytes;
}

static void set_max_dynamic_smem(const void *func, int bytes)
{
    pthread_mutex_lock(&g_smem_mu);
    int i = 0;
    while (i < g_nsmem && g_smem[i].func != func)
        i++;
    if (i < MAX_SMEM_FUNCS) {
        g_smem[i].func = func;
        g_smem[i].bytes = bytes;
        if (i == g_nsmem)
            g_nsmem++;
    }
    pthread_mutex_unlock(&g_smem_mu);
}

cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
    IN_CONTEXT();
    if (!attr)
        return fr_ret(cudaErrorInvalidValue);
    if (!func)
        return fr_ret(cudaErrorInvalidDeviceFunction);
    CUdevice d;
    int major = 0, minor = 0;
    CUresult r = D.DeviceGet(&d, fr_current_device());
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
    if (r != CUDA_SUCCESS)
        return fr_ret_cu(r);
    memset(attr, 0, sizeof *attr);
    attr->maxThreadsPerBlock = 1024;
    attr->numRegs = 32;
    attr->ptxVersion = attr->binaryVersion = major * 10 + minor;
    attr->maxDynamicSharedSizeBytes = max_dynamic_smem(func);
    attr->preferredShmemCarveout = -1;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    IN_CONTEXT();
    if (!func)
        return fr_ret(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        CUdevice d;
        int optin = 0;
        CUresult r = D.DeviceGet(&d, fr_current_device());
        if (r == CUDA_SUCCESS)
            r = D.DeviceGetAttribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d);
        if (r != CUDA_SUCCESS)
            return fr_ret_cu(r);
        if (value < 0 || value > optin)
            return fr_ret(cudaErrorInvalidValue);
        set_max_dynamic_smem(func, value);
    }
    return cudaSuccess;
}

/* Blocks that fit a multiprocessor by threads, by the architecture's block
 * limit and by shared memory (registers taken as never binding). */
cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks,
                                                                            const void *func,
                                                                            int blockSize,
                                                                            size_t dynamicSMemSize,
                                                                            unsigned int flags)
{
    (void)flags;
    IN_CONTEXT();
    if (!numBlocks || blockSize <= 0 || blockSize > 1024)
        return fr_ret(cudaErrorInvalidValue);
    if (!func)
        return fr_ret(cudaErrorInvalidDeviceFunction);
    CUdevice d;
    int threads = 0, blocks = 0, smem = 0;
    CUresult r = D.DeviceGet(&d, fr_current_device());
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, d);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetAttribute(&blocks, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, d);
    if (r == CUDA_SUCCESS)
        r = D.DeviceGetAttribute(&smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, d);
    if (r != CUDA_SUCCESS)
        return fr_ret_cu(r);
    int n = threads / blockSize < blocks ? threads / blockSize : blocks;
    if (dynamicSMemSize && (size_t)smem / dynamicSMemSize < (size_t)n)
        n = (int)((size_t)smem / dynamicSMemSize);
    *numBlocks = n;
    return cudaSuccess;
}

cudaError_t CUDARTAPI cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func,
                                                                   int blockSize,
                                                                   size_t dynamicSMemSize)
{
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                  dynamicSMemSize, 0);
}

/* ------------------------------------------------------------------------ */
/* Pools: access from other devices                                          */

cudaError_t CUDARTAPI cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc *descList,
                                           size_t count)
{
    IN_CONTEXT();
    if (!memPool || (count && !descList))
        return fr_ret(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* ------------------------------------------------------------------------ */
/* What the fake refuses: IPC (the driver says not supported) and graphs.    */

cudaError_t CUDARTAPI cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    IN_CONTEXT();
    return fr_ret_cu(D.IpcGetMemHandle((CUipcMemHandle *)handle, (CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t CUDARTAPI cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    IN_CONTEXT();
    CUipcMemHandle h;
    memcpy(&h, &handle, sizeof h);
    return fr_ret_cu(D.IpcOpenMemHandle((CUdeviceptr *)devPtr, h, flags));
}

cudaError_t CUDARTAPI cudaIpcCloseMemHandle(void *devPtr)
{
    IN_CONTEXT();
    return fr_ret_cu(D.IpcCloseMemHandle((CUdeviceptr)(uintptr_t)devPtr));
}

cudaError_t CUDARTAPI cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    IN_CONTEXT();
    return fr_ret_cu(D.IpcGetEventHandle((CUipcEventHandle *)handle, (CUevent)event));
}

cudaError_t CUDARTAPI cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    IN_CONTEXT();
    CUipcEventHandle h;
    memcpy(&h, &handle, sizeof h);
    return fr_ret_cu(D.IpcOpenEventHandle((CUevent *)event, h));
}

/* No graph is ever made (capture is refused), so every graph handle is bad. */
cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                           unsigned long long flags)
{
    (void)pGraphExec, (void)graph, (void)flags;
    return fr_ret(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                                    unsigned long long flags)
{
    return cudaGraphInstantiate(pGraphExec, graph, flags);
}

cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    (void)graphExec, (void)stream;
    return fr_ret(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes)
{
    (void)graph, (void)nodes, (void)numNodes;
    return fr_ret(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaGraphDebugDotPrint(cudaGraph_t graph, const char *path, unsigned int flags)
{
    (void)graph, (void)path, (void)flags;
    return fr_ret(cudaErrorNotSupported);
}

cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph)
{
    return fr_ret(graph ? cudaErrorNotSupported : cudaErrorInvalidValue);
}

cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    return fr_ret(graphExec ? cudaErrorNotSupported : cudaErrorInvalidValue);
}

/* ------------------------------------------------------------------------ */
/* The profiler: nothing to start.                                           */

cudaError_t CUDARTAPI cudaProfilerStart(void)
{
    return fr_ret(fr_init());
}

cudaError_t CUDARTAPI cudaProfilerStop(void)
{
    return fr_ret(fr_init());
}
