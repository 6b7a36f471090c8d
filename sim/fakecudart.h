/*
 * fakecudart.h - what the parts of the fake runtime (libcudart.so.12 and
 * .13) share. Not installed: the runtime's API is cuda_runtime_api.h. The
 * parts:
 *   fakecudart.c       loading the driver, devices, memory, pools, arrays,
 *                      errors, entry points, registration of device code
 *   fakecudart_exec.c  what real frameworks also call: device properties,
 *                      streams, events, copies and sets, launches,
 *                      occupancy, pointer queries, peers, host registration,
 *                      IPC and graphs (refused), the profiler
 * Like the real runtime, every part reaches the driver only through the
 * functions it resolved with cuGetProcAddress_v2 (D below). Hidden: the
 * library exports CUDA's names only.
 */
#ifndef FAKECUDART_H
#define FAKECUDART_H

#define __CUDA_API_VERSION_INTERNAL 1 /* declares both foo and foo_ptsz */
#include <cuda.h>
#include <cuda_runtime_api.h>

/* 13000, or what the build says: the same source makes the fake
 * libcudart.so.12 (12080) and libcudart.so.13, each with its version node. */
#ifndef RT_VERSION
#define RT_VERSION 13000
#endif
#define MAXDEV 64

#define FR_HIDDEN __attribute__((visibility("hidden")))

typedef CUresult (*pfn_getproc)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

struct fr_driver {
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
    CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
    CUresult (*DeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*DeviceGetMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*DeviceSetMemPool)(CUdevice, CUmemoryPool);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);       /* below CUDA 13 */
    CUresult (*CtxSynchronize_v2)(CUcontext); /* CUDA 13 */
    CUresult (*CtxGetStreamPriorityRange)(int *, int *);
    CUresult (*CtxEnablePeerAccess)(CUcontext, unsigned int);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamSynchronize_ptsz)(CUstream);
    CUresult (*StreamCreateWithPriority)(CUstream *, unsigned int, int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamGetPriority)(CUstream, int *);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
    CUresult (*StreamBeginCapture)(CUstream, CUstreamCaptureMode);
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*StreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
    CUresult (*StreamGetCaptureInfo)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                     const CUgraphNode **, size_t *); /* the 11.3 ABI */
    CUresult (*ThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
    CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*MemHostRegister)(void *, size_t, unsigned int);
    CUresult (*MemHostUnregister)(void *);
    CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned int);
    CUresult (*PointerGetAttributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent);
    CUresult (*IpcOpenEventHandle)(CUevent *, CUipcEventHandle);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*MemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*MemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*MemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*MemPoolDestroy)(CUmemoryPool);
    CUresult (*MemPoolTrimTo)(CUmemoryPool, size_t);
    CUresult (*MemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*MemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*Array3DCreate)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*ArrayDestroy)(CUarray);
    CUresult (*MipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    CUresult (*MipmappedArrayDestroy)(CUmipmappedArray);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
    CUresult (*MemAllocHost)(void **, size_t);
    CUresult (*MemFreeHost)(void *);
};
FR_HIDDEN extern struct fr_driver D;

/* fakecudart.c: the driver loaded and resolved (no cuInit) / initialised;
 * the calling thread's device with its primary context current; errors kept
 * as the thread's last error on the way out. */
FR_HIDDEN cudaError_t fr_load(void);
FR_HIDDEN cudaError_t fr_init(void);
FR_HIDDEN cudaError_t fr_ensure_ctx(void);
FR_HIDDEN cudaError_t fr_ret(cudaError_t e);
FR_HIDDEN cudaError_t fr_ret_cu(CUresult r);
FR_HIDDEN int fr_device_count(void); /* after fr_init */
FR_HIDDEN int fr_current_device(void);
/* Device dev's primary context, retained once for the process. */
FR_HIDDEN cudaError_t fr_primary_context(int dev, CUcontext *ctx);

/* fakecudart_exec.c: a kernel launch of that shape on that stream, checked
 * as the runtime checks it (the fake device runs nothing). */
FR_HIDDEN cudaError_t fr_launch(dim3 grid, dim3 block, size_t shared, cudaStream_t stream);

#endif /* FAKECUDART_H */
