/* driver.h - layer 3: the real CUDA driver, as the shim itself uses it.
 *
 * The shim never links libcuda. It uses the libcuda.so.1 the process loaded
 * (the runtime's own, when the runtime loaded it), found with dlopen(
 * RTLD_NOLOAD), and takes its functions with the real dlsym, never through
 * a hook. Also used by gpuguard-check, to list the GPUs the same way.
 */
#ifndef GG_DRIVER_H
#define GG_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Find libcuda.so.1: the one loaded, or (load) load it. 0, or -1 with why. */
int gg_driver_open(bool load, char *why, size_t cap);

/* A driver function by its exported name (cuMemGetInfo_v2); NULL if the
 * driver is not open or has no such function. */
void *gg_driver_sym(const char *name);

/* Whether ip lies inside libcuda.so.1 (a real driver function). */
bool gg_driver_contains(const void *ip);

/* cuInit(0) and cuDeviceGetCount. 0, or the CUresult of the call that
 * failed, with its name in *call. */
int gg_driver_init(int *count, const char **call);

/* One GPU as the driver describes it. */
struct gg_gpu {
    int index;
    char name[256];
    uint64_t total;
    int cc_major, cc_minor;  /* -1 when unknown */
    char uuid[48];           /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as NVML and DCGM
                                write it (cuDeviceGetUuid); "" when the driver cannot say */
};
/* 0, or the CUresult of the query that failed (its name in *call): a GPU
 * whose total memory is unknown cannot be guarded. */
int gg_driver_gpu(int index, struct gg_gpu *g, const char **call);

/* The CUDA error's name ("CUDA_ERROR_OUT_OF_MEMORY"), or "error". */
const char *gg_driver_error_name(int result);

/* The device of the calling thread's current context; -1 when it has none. */
int gg_driver_current_device(void);

/* Device dev's use now (total - free), read through the calling thread's
 * current context when it is dev's; else, when may_retain, through dev's
 * primary context, retained for good: the runtime is about to make that
 * very context for the allocation that asks, so nothing is created that the
 * process would not have. False when no reading could be taken. */
bool gg_driver_read_used(int dev, bool may_retain, uint64_t *used);

/* Stream-ordered pools (pools.h), as the driver sees them. A pool is its
 * CUmemoryPool handle as a number. */
/* What pool `pool` holds and has handed out now; false when it cannot say. */
bool gg_driver_pool_bytes(uint64_t pool, uint64_t *reserved, uint64_t *used);
/* Device dev's current pool (cudaMallocAsync's), or its default one; 0
 * when the driver cannot say. */
uint64_t gg_driver_device_pool(int dev, bool default_pool);
/* The device of a stream's work (and so of its cudaMallocAsync): the
 * stream's own where the driver can say (CUDA 12.8), else the current
 * context's; -1 when neither is known. */
int gg_driver_stream_device(void *stream);

#endif /* GG_DRIVER_H */
