/*
 * fakecuda_exec.c - what runs on a fake device (part of libcuda.so.1; see
 * fakecuda.h): streams, events, modules and launches, copies and sets,
 * pointer queries, page-locked host ranges, peers, PCI ids and UUIDs, and the
 * interfaces the fake refuses (IPC, shareable handles, multicast, graphs).
 *
 * Nothing runs: the device finishes all work the moment it is queued. So a
 * stream or event is always complete, a host function queued on a stream is
 * called at once, elapsed time is the host time between two records, and a
 * kernel launch succeeds without running. Device memory is never backed:
 * a copy to the host writes zeros, a copy between host buffers copies, a
 * set or a copy into device memory does nothing but check its arguments.
 * Page-locked host memory is real, so a write to it (cuStreamWriteValue32,
 * a set) really happens.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"

/* The current ABIs behind names cuda.h declares only in their legacy form
 * here (the library's own build). */
CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream);
CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent);
CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags);
CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags);
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options,
                                 void **optionValues, CUlinkState *stateOut);
CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                  const char *name, unsigned int numOptions, CUjit_option *options,
                                  void **optionValues);

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

struct fk_stream {
    uint32_t magic;
    int dev;
    unsigned flags;
    int priority;
    unsigned long long id;
};
#define STREAM_MAGIC 0xfac75743u
#define STREAM_DEAD  0xdeadfac7u

static _Atomic unsigned long long g_stream_ids = 16; /* the default streams' ids are below */

/* The greatest (most urgent) priority; 0 is the least. */
#define PRIORITY_GREATEST (-5)

/* The stream behind a handle: NULL (with *dev the current context's) for
 * the legacy and per-thread default streams; -1 in *dev for a bad handle or
 * no context. */
static struct fk_stream *stream_of(CUstream h, int *dev)
{
    uintptr_t v = (uintptr_t)h;
    if (v == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        *dev = fk_current_device();
        return NULL;
    }
    struct fk_stream *s = (struct fk_stream *)h;
    *dev = s->magic == STREAM_MAGIC ? s->dev : -1;
    return *dev >= 0 ? s : NULL;
}

/* The usual prologue: a driver that is ready, a stream that is valid. */
static CUresult check_stream(CUstream h, struct fk_stream **s, int *dev)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    *s = stream_of(h, dev);
    if (*dev < 0)
        return h && h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD ? CUDA_ERROR_INVALID_HANDLE
                                                                         : CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!phStream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    int dev = fk_current_device();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fk_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Out of range is clamped, as the driver does. */
    if (priority > 0)
        priority = 0;
    if (priority < PRIORITY_GREATEST)
        priority = PRIORITY_GREATEST;
    *s = (struct fk_stream){STREAM_MAGIC, dev, flags, priority, atomic_fetch_add(&g_stream_ids, 1)};
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

/* A destroyed stream stays readable (marked dead) so that a late use of its
 * handle is an error, not a crash. */
CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (r)
        return r;
    if (!s)
        return CUDA_ERROR_INVALID_HANDLE;
    s->magic = STREAM_DEAD;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
    return cuStreamDestroy_v2(hStream);
}

#define STREAM_QUERY(name, type, VALUE)                               \
    CUresult CUDAAPI name(CUstream hStream, type out)                 \
    {                                                                 \
        struct fk_stream *s;                                          \
        int dev;                                                      \
        CUresult r = check_stream(hStream, &s, &dev);                 \
        if (r)                                                        \
            return r;                                                 \
        if (!out)                                                     \
            return CUDA_ERROR_INVALID_VALUE;                          \
        *out = VALUE;                                                 \
        return CUDA_SUCCESS;                                          \
    }
STREAM_QUERY(cuStreamGetPriority, int *, s ? s->priority : 0)
STREAM_QUERY(cuStreamGetFlags, unsigned int *, s ? s->flags : 0)
STREAM_QUERY(cuStreamGetDevice, CUdevice *, dev)
STREAM_QUERY(cuStreamGetId, unsigned long long *,
             s ? s->id : hStream == CU_STREAM_PER_THREAD ? 2 : 1)

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice d = dev;
    return cuDevicePrimaryCtxRetain(pctx, d) == CUDA_SUCCESS && cuDevicePrimaryCtxRelease_v2(d) == CUDA_SUCCESS
               ? CUDA_SUCCESS
               : CUDA_ERROR_INVALID_CONTEXT;
}

/* Work queued on a stream is done the moment it is queued. */
CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    struct fk_stream *s;
    int dev;
    return check_stream(hStream, &s, &dev);
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (r)
        return r;
    return hEvent && !(Flags & ~1u) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (r)
        return r;
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    fn(userData);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData,
                                     unsigned int flags)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (r)
        return r;
    if (!callback || flags)
        return CUDA_ERROR_INVALID_VALUE;
    callback(hStream, CUDA_SUCCESS, userData);
    return CUDA_SUCCESS;
}

/* Graphs are not simulated: capture is refused, and no stream is ever
 * capturing (what every allocator asks before it allocates). */
CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    (void)mode;
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (phGraph)
        *phGraph = NULL;
    return r ? r : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (r)
        return r;
    if (!captureStatus)
        return CUDA_ERROR_INVALID_VALUE;
    *captureStatus = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *status,
                                           cuuint64_t *id, CUgraph *graph,
                                           const CUgraphNode **deps, size_t *ndeps)
{
    CUresult r = cuStreamIsCapturing(hStream, status);
    if (r)
        return r;
    if (id)
        *id = 0;
    if (graph)
        *graph = NULL;
    if (deps)
        *deps = NULL;
    if (ndeps)
        *ndeps = 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *status,
                                           cuuint64_t *id, CUgraph *graph,
                                           const CUgraphNode **deps, const CUgraphEdgeData **edges,
                                           size_t *ndeps)
{
    if (edges)
        *edges = NULL;
    return cuStreamGetCaptureInfo_v2(hStream, status, id, graph, deps, ndeps);
}

static __thread CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = t_capture_mode;
    t_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (fk_current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = PRIORITY_GREATEST;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Events                                                                    */

struct fk_event {
    uint32_t magic;
    unsigned flags;
    int recorded;
    struct timespec at;
};
#define EVENT_MAGIC 0xfac7e7e7u

static struct fk_event *event_of(CUevent h)
{
    struct fk_event *e = (struct fk_event *)h;
    return e && e->magic == EVENT_MAGIC ? e : NULL;
}

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!phEvent || (Flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                                         CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    if (fk_current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fk_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    e->flags = Flags;
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_event *e = event_of(hEvent);
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
    return cuEventDestroy_v2(hEvent);
}

CUresult CUDAAPI cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    struct fk_stream *s;
    int dev;
    CUresult r = check_stream(hStream, &s, &dev);
    if (r)
        return r;
    struct fk_event *e = event_of(hEvent);
    if (!e || (flags & ~1u))
        return e ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
    clock_gettime(CLOCK_MONOTONIC, &e->at);
    e->recorded = 1;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return cuEventRecordWithFlags(hEvent, hStream, 0);
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    return event_of(hEvent) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    return cuEventQuery(hEvent);
}

CUresult CUDAAPI cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_event *a = event_of(hStart), *b = event_of(hEnd);
    if (!a || !b)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    *pMilliseconds = (float)((double)(b->at.tv_sec - a->at.tv_sec) * 1e3 +
                             (double)(b->at.tv_nsec - a->at.tv_nsec) / 1e6);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

/* ------------------------------------------------------------------------ */
/* Page-locked host ranges and pointer queries                              */

struct host_range {
    uintptr_t base;
    uint64_t size;
    int registered; /* cuMemHostRegister (else allocated by the driver) */
};

static pthread_mutex_t g_host_mu = PTHREAD_MUTEX_INITIALIZER;
static struct host_range *g_host;
static size_t g_nhost, g_caphost;

void fk_host_range_add(const void *p, uint64_t size, int registered)
{
    pthread_mutex_lock(&g_host_mu);
    if (g_nhost == g_caphost) {
        size_t cap = g_caphost ? 2 * g_caphost : 16;
        struct host_range *n = realloc(g_host, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&g_host_mu);
            return;
        }
        g_host = n;
        g_caphost = cap;
    }
    g_host[g_nhost++] = (struct host_range){(uintptr_t)p, size, registered};
    pthread_mutex_unlock(&g_host_mu);
}

void fk_host_range_remove(const void *p)
{
    pthread_mutex_lock(&g_host_mu);
    for (size_t i = 0; i < g_nhost; i++)
        if (g_host[i].base == (uintptr_t)p) {
            g_host[i] = g_host[--g_nhost];
            break;
        }
    pthread_mutex_unlock(&g_host_mu);
}

/* The page-locked range holding [p, p + n): 1 (with *base), else 0. */
static int host_range_of(uintptr_t p, uint64_t n, uintptr_t *base, int *registered)
{
    int found = 0;
    pthread_mutex_lock(&g_host_mu);
    for (size_t i = 0; i < g_nhost; i++) {
        const struct host_range *h = &g_host[i];
        if (p >= h->base && p - h->base < h->size && n <= h->size - (p - h->base)) {
            if (base)
                *base = h->base;
            if (registered)
                *registered = h->registered;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_host_mu);
    return found;
}

CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    (void)Flags;
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!p || !bytesize)
        return CUDA_ERROR_INVALID_VALUE;
    if (fk_current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (host_range_of((uintptr_t)p, 1, NULL, NULL) ||
        host_range_of((uintptr_t)p + bytesize - 1, 1, NULL, NULL))
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    fk_host_range_add(p, bytesize, 1);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return cuMemHostRegister_v2(p, bytesize, Flags);
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    uintptr_t base;
    int registered;
    if (!host_range_of((uintptr_t)p, 1, &base, &registered) || base != (uintptr_t)p || !registered)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    fk_host_range_remove(p);
    return CUDA_SUCCESS;
}

/* Unified addressing: page-locked host memory has the same address on the
 * device. */
CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!pdptr || Flags)
        return CUDA_ERROR_INVALID_VALUE;
    if (!host_range_of((uintptr_t)p, 1, NULL, NULL))
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

enum { MEM_NONE, MEM_DEVICE, MEM_HOST };

/* What p is: device memory (the device is the current context's: the fake
 * keeps no map from an address inside an allocation to its device), page-
 * locked host memory, or neither. */
static int memory_of(uint64_t p, int *dev)
{
    *dev = fk_current_device();
    if (fk_is_device_address(p))
        return MEM_DEVICE;
    if (host_range_of((uintptr_t)p, 1, NULL, NULL))
        return MEM_HOST;
    return MEM_NONE;
}

/* One attribute; CUDA_ERROR_INVALID_VALUE for a pointer the driver does not
 * know (cuPointerGetAttributes turns that into zeros). */
static CUresult pointer_attribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    int dev;
    int kind = memory_of((uint64_t)ptr, &dev);
    if (kind == MEM_NONE || !data)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = kind == MEM_DEVICE ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_CONTEXT: {
        CUcontext c = NULL;
        CUresult r = dev >= 0 ? cuCtxGetCurrent(&c) : CUDA_ERROR_INVALID_CONTEXT;
        *(CUcontext *)data = c;
        return r;
    }
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = dev < 0 ? 0 : dev; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (kind != MEM_HOST)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned int *)data = 0; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(unsigned int *)data = 1; return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = (uint64_t)ptr; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    CUresult r = fk_ready();
    return r ? r : pointer_attribute(data, attribute, ptr);
}

/* Size of what an attribute writes, for the zeros of an unknown pointer. */
static size_t attribute_size(CUpointer_attribute a)
{
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: return sizeof(void *);
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: return sizeof(unsigned long long);
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: return sizeof(size_t);
    case CU_POINTER_ATTRIBUTE_P2P_TOKENS: return sizeof(CUDA_POINTER_ATTRIBUTE_P2P_TOKENS);
    default: return sizeof(unsigned int);
    }
}

CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                        void **data, CUdeviceptr ptr)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!attributes || !data)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numAttributes; i++) {
        if (!data[i])
            continue;
        if (pointer_attribute(data[i], attributes[i], ptr) != CUDA_SUCCESS) {
            memset(data[i], 0, attribute_size(attributes[i]));
            if (attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
                *(int *)data[i] = -2; /* as the driver says of a pointer it does not know */
        }
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Copies and sets                                                           */

/* Where a transfer writes and reads: device memory is a name, host memory
 * is bytes. */
static CUresult transfer(uint64_t dst, uint64_t src, size_t n)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || !src)
        return CUDA_ERROR_INVALID_VALUE;
    int to_device = fk_is_device_address(dst), from_device = fk_is_device_address(src);
    if (to_device)
        return CUDA_SUCCESS;
    if (from_device)
        memset((void *)(uintptr_t)dst, 0, n);
    else
        memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

#define STREAM_OK(h)                                  \
    do {                                              \
        struct fk_stream *s_;                         \
        int d_;                                       \
        CUresult r_ = check_stream((h), &s_, &d_);    \
        if (r_)                                       \
            return r_;                                \
    } while (0)

CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return transfer(dst, src, ByteCount);
}

CUresult CUDAAPI cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    STREAM_OK(hStream);
    return transfer(dst, src, ByteCount);
}

CUresult CUDAAPI cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    if (ByteCount && !fk_is_device_address(dstDevice))
        return CUDA_ERROR_INVALID_VALUE;
    return transfer(dstDevice, (uintptr_t)srcHost, ByteCount);
}

CUresult CUDAAPI cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    if (ByteCount && !fk_is_device_address(srcDevice))
        return CUDA_ERROR_INVALID_VALUE;
    return transfer((uintptr_t)dstHost, srcDevice, ByteCount);
}

CUresult CUDAAPI cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    if (ByteCount && (!fk_is_device_address(dstDevice) || !fk_is_device_address(srcDevice)))
        return CUDA_ERROR_INVALID_VALUE;
    return transfer(dstDevice, srcDevice, ByteCount);
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                      CUstream hStream)
{
    STREAM_OK(hStream);
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream)
{
    STREAM_OK(hStream);
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                      size_t ByteCount, CUstream hStream)
{
    STREAM_OK(hStream);
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

CUresult CUDAAPI cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                   CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
                                   CUstream hStream)
{
    STREAM_OK(hStream);
    if (!dstContext || !srcContext)
        return CUDA_ERROR_INVALID_CONTEXT;
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                              CUcontext srcContext, size_t ByteCount)
{
    return cuMemcpyPeerAsync(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL);
}

/* A set of n elements of `width` bytes at dst: page-locked host memory is
 * written, device memory is not backed. */
static CUresult set(uint64_t dst, uint32_t value, size_t width, size_t n)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (n == 0)
        return CUDA_SUCCESS;
    if (!dst || dst % width)
        return CUDA_ERROR_INVALID_VALUE;
    if (fk_is_device_address(dst))
        return CUDA_SUCCESS;
    if (n > SIZE_MAX / width || !host_range_of((uintptr_t)dst, n * width, NULL, NULL))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *p = (unsigned char *)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++)
        memcpy(p + i * width, &value, width); /* little-endian: the low bytes */
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return set(dstDevice, uc, 1, N);
}

CUresult CUDAAPI cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
    return set(dstDevice, us, 2, N);
}

CUresult CUDAAPI cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    return set(dstDevice, ui, 4, N);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    STREAM_OK(hStream);
    return set(dstDevice, uc, 1, N);
}

CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                  CUstream hStream)
{
    STREAM_OK(hStream);
    return set(dstDevice, us, 2, N);
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    STREAM_OK(hStream);
    return set(dstDevice, ui, 4, N);
}

CUresult CUDAAPI cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                         unsigned int flags)
{
    (void)flags;
    STREAM_OK(stream);
    return set(addr, value, 4, 1);
}

CUresult CUDAAPI cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                      unsigned int flags)
{
    return cuStreamWriteValue32_v2(stream, addr, value, flags);
}

/* Waits on a value: the condition is taken to hold (nothing else runs). */
CUresult CUDAAPI cuStreamWaitValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                        unsigned int flags)
{
    (void)value, (void)flags;
    STREAM_OK(stream);
    return addr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value,
                                     unsigned int flags)
{
    return cuStreamWaitValue32_v2(stream, addr, value, flags);
}

/* ------------------------------------------------------------------------ */
/* Modules, functions, launches (JIT compilers such as NVRTC's users)        */

struct fk_module {
    uint32_t magic;
};
#define MODULE_MAGIC 0xfac7d0d0u
struct fk_function {
    uint32_t magic;
    int max_dynamic_smem;
};
#define FUNCTION_MAGIC 0xfac7f00du

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                    CUjit_option *options, void **optionValues)
{
    (void)numOptions, (void)options, (void)optionValues;
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    if (fk_current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fk_module *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->magic = MODULE_MAGIC;
    *module = (CUmodule)m;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image)
{
    return cuModuleLoadDataEx(module, image, 0, NULL, NULL);
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_module *m = (struct fk_module *)hmod;
    if (!m || m->magic != MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    m->magic = 0;
    free(m);
    return CUDA_SUCCESS;
}

/* Every name is found: the fake cannot read what a module holds. */
CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_module *m = (struct fk_module *)hmod;
    if (!m || m->magic != MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!hfunc || !name)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_function *f = calloc(1, sizeof *f);
    if (!f)
        return CUDA_ERROR_OUT_OF_MEMORY;
    f->magic = FUNCTION_MAGIC;
    f->max_dynamic_smem = 49152;
    *hfunc = (CUfunction)f;
    return CUDA_SUCCESS;
}

static struct fk_function *function_of(CUfunction h)
{
    struct fk_function *f = (struct fk_function *)h;
    return f && f->magic == FUNCTION_MAGIC ? f : NULL;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, unsigned smem, CUstream h)
{
    STREAM_OK(h);
    if (!function_of(f))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024 ||
        bz > 64 || gy > 65535 || gz > 65535)
        return CUDA_ERROR_INVALID_VALUE;
    if (smem > (unsigned)function_of(f)->max_dynamic_smem)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                                void **extra)
{
    (void)kernelParams, (void)extra;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream);
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int sharedMemBytes,
                                           CUstream hStream, void **kernelParams)
{
    (void)kernelParams;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                  sharedMemBytes, hStream);
}

CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_function *f = function_of(hfunc);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fk_device *d = fk_device(fk_current_device() < 0 ? 0 : fk_current_device());
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *pi = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *pi = d ? d->major * 10 + d->minor : 0; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = f->max_dynamic_smem; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_function *f = function_of(hfunc);
    if (!f)
        return CUDA_ERROR_INVALID_HANDLE;
    if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
        int dev = fk_current_device();
        if (value < 0 || dev < 0 ||
            value > fk_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN))
            return CUDA_ERROR_INVALID_VALUE;
        f->max_dynamic_smem = value;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    (void)config;
    CUresult r = fk_ready();
    return r ? r : function_of(hfunc) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Blocks of blockSize threads that fit a multiprocessor by threads and by
 * the architecture's block limit (registers and shared memory taken as
 * never binding). */
CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks, CUfunction func,
                                                                      int blockSize,
                                                                      size_t dynamicSMemSize,
                                                                      unsigned int flags)
{
    (void)flags;
    CUresult r = fk_ready();
    if (r)
        return r;
    int dev = fk_current_device();
    if (dev < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!numBlocks || blockSize <= 0 || blockSize > 1024 || !function_of(func))
        return CUDA_ERROR_INVALID_VALUE;
    int by_threads = fk_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) / blockSize;
    int by_blocks = fk_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR);
    int by_smem = dynamicSMemSize
                      ? (int)(fk_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) /
                              dynamicSMemSize)
                      : by_blocks;
    int n = by_threads < by_blocks ? by_threads : by_blocks;
    *numBlocks = n < by_smem ? n : by_smem;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, CUfunction func,
                                                             int blockSize, size_t dynamicSMemSize)
{
    return cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
                                                                dynamicSMemSize, 0);
}

/* Linking device code: the result is a placeholder image (the fake loads any
 * image). */
struct fk_link {
    uint32_t magic;
    char image[64];
};
#define LINK_MAGIC 0xfac71111u

CUresult CUDAAPI cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues,
                                 CUlinkState *stateOut)
{
    (void)numOptions, (void)options, (void)optionValues;
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!stateOut)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_link *l = calloc(1, sizeof *l);
    if (!l)
        return CUDA_ERROR_OUT_OF_MEMORY;
    l->magic = LINK_MAGIC;
    snprintf(l->image, sizeof l->image, "fakecuda linked image");
    *stateOut = (CUlinkState)l;
    return CUDA_SUCCESS;
}

static struct fk_link *link_of(CUlinkState s)
{
    struct fk_link *l = (struct fk_link *)s;
    return l && l->magic == LINK_MAGIC ? l : NULL;
}

CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size,
                                  const char *name, unsigned int numOptions, CUjit_option *options,
                                  void **optionValues)
{
    (void)type, (void)size, (void)name, (void)numOptions, (void)options, (void)optionValues;
    CUresult r = fk_ready();
    if (r)
        return r;
    return !link_of(state) ? CUDA_ERROR_INVALID_HANDLE : data ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_link *l = link_of(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    if (cubinOut)
        *cubinOut = l->image;
    if (sizeOut)
        *sizeOut = sizeof l->image;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLinkDestroy(CUlinkState state)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    struct fk_link *l = link_of(state);
    if (!l)
        return CUDA_ERROR_INVALID_HANDLE;
    l->magic = 0;
    free(l);
    return CUDA_SUCCESS;
}

/* A tensor map is an opaque descriptor for the hardware's copy engine;
 * nothing reads it here. */
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *tensorMap, CUtensorMapDataType tensorDataType,
                                        cuuint32_t tensorRank, void *globalAddress,
                                        const cuuint64_t *globalDim, const cuuint64_t *globalStrides,
                                        const cuuint32_t *boxDim, const cuuint32_t *elementStrides,
                                        CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
                                        CUtensorMapL2promotion l2Promotion,
                                        CUtensorMapFloatOOBfill oobFill)
{
    (void)tensorDataType, (void)globalStrides, (void)boxDim, (void)elementStrides;
    (void)interleave, (void)swizzle, (void)l2Promotion, (void)oobFill;
    if (!tensorMap || !globalAddress || !globalDim || tensorRank == 0 || tensorRank > 5)
        return CUDA_ERROR_INVALID_VALUE;
    memset(tensorMap, 0, sizeof *tensorMap);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Devices seen from outside: peers, PCI bus ids, UUIDs                       */

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fk_device(dev) || !fk_device(peerDev))
        return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = dev != peerDev;
    return CUDA_SUCCESS;
}

/* Peer access enabled from (current device) to (peer): a bit each. */
static _Atomic uint64_t g_peer[64];

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    int dev = fk_current_device();
    if (dev < 0 || !peerContext)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (Flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext cur = NULL;
    CUdevice peer;
    if (cuCtxGetCurrent(&cur) != CUDA_SUCCESS || cuCtxGetDevice_v2(&peer, peerContext) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (peer == dev || dev >= 64 || peer >= 64)
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t bit = 1ULL << peer;
    if (atomic_fetch_or(&g_peer[dev], bit) & bit)
        return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    int dev = fk_current_device();
    CUdevice peer;
    if (dev < 0 || dev >= 64 || cuCtxGetDevice_v2(&peer, peerContext) != CUDA_SUCCESS || peer >= 64)
        return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t bit = 1ULL << peer;
    return atomic_fetch_and(&g_peer[dev], ~bit) & bit ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

/* Device N sits on PCI bus N + 1 of domain 0 (fakecuda_props.c says the
 * same in its attributes). */
CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    if (!fk_device(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "%08x:%02x:%02x.0",
             fk_attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
             fk_attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
             fk_attribute(dev, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID));
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    unsigned domain = 0, bus, device, fn;
    if (!dev || !pciBusId)
        return CUDA_ERROR_INVALID_VALUE;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &device, &fn) != 4 &&
        sscanf(pciBusId, "%x:%x.%x", &bus, &device, &fn) != 3)
        return CUDA_ERROR_INVALID_VALUE;
    for (int d = 0; d < fk_device_count(); d++)
        if ((unsigned)fk_attribute(d, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) == bus &&
            (unsigned)fk_attribute(d, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID) == domain) {
            *dev = d;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* A UUID that stays the same for the same ordinal and name in the processes
 * that share the device (FAKECUDA_STATE; without it each process has a
 * device, and a UUID, of its own): FNV-1a of the three, stretched to 16
 * bytes, with the RFC 4122 version (4) and variant bits. */
CUresult CUDAAPI cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CUresult r = fk_ready();
    if (r)
        return r;
    const struct fk_device *d = fk_device(dev);
    if (!d)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = d->name; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    h = (h ^ (uint64_t)dev) * 1099511628211ULL;
    h = (h ^ fk_uuid_salt()) * 1099511628211ULL;
    uint64_t h2 = (h ^ 0x9e3779b97f4a7c15ULL) * 1099511628211ULL;
    memcpy(uuid->bytes, &h, 8);
    memcpy(uuid->bytes + 8, &h2, 8);
    uuid->bytes[6] = (char)((uuid->bytes[6] & 0x0f) | 0x40);
    uuid->bytes[8] = (char)((uuid->bytes[8] & 0x3f) | 0x80);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

/* ------------------------------------------------------------------------ */
/* What the fake refuses: sharing memory and events between processes, and   */
/* multicast objects. Callers get the driver's "not supported".              */

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    (void)pHandle, (void)dptr;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    (void)pdptr, (void)handle, (void)Flags;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    (void)dptr;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event)
{
    (void)pHandle, (void)event;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle)
{
    (void)phEvent, (void)handle;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags)
{
    (void)shareableHandle, (void)handle, (void)handleType, (void)flags;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                CUmemAllocationHandleType shHandleType)
{
    (void)handle, (void)osHandle, (void)shHandleType;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
                                   const CUmulticastObjectProp *prop)
{
    (void)mcHandle, (void)prop;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
    (void)mcHandle, (void)dev;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                    CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                    size_t size, unsigned long long flags)
{
    (void)mcHandle, (void)mcOffset, (void)memHandle, (void)memOffset, (void)size, (void)flags;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}

CUresult CUDAAPI cuMulticastGetGranularity(size_t *granularity, const CUmulticastObjectProp *prop,
                                           CUmulticastGranularity_flags option)
{
    (void)granularity, (void)prop, (void)option;
    CUresult r = fk_ready();
    return r ? r : CUDA_ERROR_NOT_SUPPORTED;
}
