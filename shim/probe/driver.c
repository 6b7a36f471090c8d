/* driver.c - layer 3: the real CUDA driver (see driver.h). */
#include "driver.h"

#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "prim.h"

static void *_Atomic handle;
static _Atomic uintptr_t lo, hi; /* libcuda's mapped range */

/* The functions the shim itself calls, never through a hook. */
static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*device_total_mem)(size_t *, CUdevice);
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*pool_get_attribute)(CUmemoryPool, CUmemPool_attribute, void *);
    CUresult (*device_get_mem_pool)(CUmemoryPool *, CUdevice);
    CUresult (*device_get_default_mem_pool)(CUmemoryPool *, CUdevice);
    CUresult (*stream_get_device)(CUstream, CUdevice *); /* CUDA 12.8 and later */
    CUresult (*device_get_uuid)(CUuuid *, CUdevice);
} drv;

static int find_range(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    (void)ctx;
    const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
    base = base ? base + 1 : info->dlpi_name;
    if (!base || strncmp(base, "libcuda.so", 10) != 0)
        return 0;
    uintptr_t l = UINTPTR_MAX, h = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < l)
            l = a;
        if (a + ph->p_memsz > h)
            h = a + ph->p_memsz;
    }
    atomic_store(&lo, l);
    atomic_store(&hi, h);
    return 1;
}

#define SYM(field, name) (*(void **)&drv.field = gg_real_dlsym(h, name))

static void take_functions(void *h)
{
    SYM(init, "cuInit");
    SYM(device_get_count, "cuDeviceGetCount");
    SYM(device_get, "cuDeviceGet");
    SYM(device_get_name, "cuDeviceGetName");
    SYM(device_total_mem, "cuDeviceTotalMem_v2");
    SYM(device_get_attribute, "cuDeviceGetAttribute");
    SYM(ctx_get_device, "cuCtxGetDevice");
    SYM(mem_get_info, "cuMemGetInfo_v2");
    SYM(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_get_current, "cuCtxGetCurrent");
    SYM(ctx_set_current, "cuCtxSetCurrent");
    SYM(get_error_name, "cuGetErrorName");
    SYM(pool_get_attribute, "cuMemPoolGetAttribute");
    SYM(device_get_mem_pool, "cuDeviceGetMemPool");
    SYM(device_get_default_mem_pool, "cuDeviceGetDefaultMemPool");
    SYM(stream_get_device, "cuStreamGetDevice");
    /* The first entry point where there is one: its _v2 (CUDA 11.4) names
     * a MIG instance rather than its GPU (cuda.h); on a whole GPU both say
     * the same 16 bytes. */
    if (!SYM(device_get_uuid, "cuDeviceGetUuid"))
        SYM(device_get_uuid, "cuDeviceGetUuid_v2");
}

int gg_driver_open(bool load, char *why, size_t cap)
{
    if (atomic_load_explicit(&handle, memory_order_acquire))
        return 0;
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!h && load)
        h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        snprintf(why, cap, "no CUDA driver (libcuda.so.1 %s)", load ? "not found" : "not loaded");
        return -1;
    }
    /* Outside any lock of ours: dl_iterate_phdr takes the loader's. */
    dl_iterate_phdr(find_range, NULL);
    take_functions(h);
    void *expected = NULL;
    if (!atomic_compare_exchange_strong(&handle, &expected, h))
        dlclose(h); /* another thread won; its handle holds the same object */
    if (!drv.init || !drv.device_get_count || !drv.device_get || !drv.device_get_name ||
        !drv.device_total_mem) {
        snprintf(why, cap, "libcuda.so.1 lacks the device queries (cuInit, cuDeviceGet...)");
        return -1;
    }
    return 0;
}

void *gg_driver_sym(const char *name)
{
    void *h = atomic_load_explicit(&handle, memory_order_acquire);
    return h ? gg_real_dlsym(h, name) : NULL;
}

bool gg_driver_contains(const void *ip)
{
    uintptr_t a = (uintptr_t)ip;
    return a >= atomic_load_explicit(&lo, memory_order_relaxed) &&
           a < atomic_load_explicit(&hi, memory_order_relaxed);
}

int gg_driver_init(int *count, const char **call)
{
    CUresult r = drv.init(0);
    *count = 0;
    if (r != CUDA_SUCCESS) {
        *call = "cuInit";
        return (int)r;
    }
    r = drv.device_get_count(count);
    if (r != CUDA_SUCCESS) {
        *call = "cuDeviceGetCount";
        *count = 0;
        return (int)r;
    }
    return 0;
}

int gg_driver_gpu(int index, struct gg_gpu *g, const char **call)
{
    CUdevice dev;
    size_t total = 0;
    CUresult r;
    memset(g, 0, sizeof *g);
    g->index = index;
    g->cc_major = g->cc_minor = -1;
    if ((r = drv.device_get(&dev, index)) != CUDA_SUCCESS) {
        *call = "cuDeviceGet";
        return (int)r;
    }
    if ((r = drv.device_get_name(g->name, (int)sizeof g->name - 1, dev)) != CUDA_SUCCESS)
        snprintf(g->name, sizeof g->name, "CUDA device %d", index); /* a name is not vital */
    if ((r = drv.device_total_mem(&total, dev)) != CUDA_SUCCESS || total == 0) {
        *call = "cuDeviceTotalMem";
        return r != CUDA_SUCCESS ? (int)r : (int)CUDA_ERROR_INVALID_VALUE;
    }
    g->total = total;
    if (drv.device_get_attribute &&
        (drv.device_get_attribute(&g->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                  dev) != CUDA_SUCCESS ||
         drv.device_get_attribute(&g->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                  dev) != CUDA_SUCCESS))
        g->cc_major = g->cc_minor = -1;
    CUuuid u;
    if (drv.device_get_uuid && drv.device_get_uuid(&u, dev) == CUDA_SUCCESS) {
        const unsigned char *b = (const unsigned char *)u.bytes;
        snprintf(g->uuid, sizeof g->uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                 b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                 b[14], b[15]);
    }
    return 0;
}

const char *gg_driver_error_name(int result)
{
    const char *name = NULL;
    if (drv.get_error_name && drv.get_error_name((CUresult)result, &name) == CUDA_SUCCESS && name)
        return name;
    return "error";
}

int gg_driver_current_device(void)
{
    CUdevice cu;
    if (drv.ctx_get_device && drv.ctx_get_device(&cu) == CUDA_SUCCESS)
        return (int)cu;
    return -1;
}

static bool read_current(uint64_t *used)
{
    size_t free_b = 0, total_b = 0;
    if (!drv.mem_get_info || drv.mem_get_info(&free_b, &total_b) != CUDA_SUCCESS ||
        total_b < free_b)
        return false;
    *used = total_b - free_b;
    return true;
}

bool gg_driver_read_used(int dev, bool may_retain, uint64_t *used)
{
    if (gg_driver_current_device() == dev)
        return read_current(used);
    if (!may_retain || !drv.primary_ctx_retain || !drv.ctx_get_current || !drv.ctx_set_current)
        return false;
    CUcontext ctx, saved;
    if (drv.ctx_get_current(&saved) != CUDA_SUCCESS ||
        drv.primary_ctx_retain(&ctx, (CUdevice)dev) != CUDA_SUCCESS ||
        drv.ctx_set_current(ctx) != CUDA_SUCCESS)
        return false;
    bool ok = read_current(used);
    drv.ctx_set_current(saved); /* the thread's own context, or none, as it was */
    return ok;
}

/* ---- stream-ordered pools ------------------------------------------------------------ */

bool gg_driver_pool_bytes(uint64_t pool, uint64_t *reserved, uint64_t *used)
{
    cuuint64_t r = 0, u = 0;
    if (!drv.pool_get_attribute || !pool ||
        drv.pool_get_attribute((CUmemoryPool)(uintptr_t)pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                               &r) != CUDA_SUCCESS ||
        drv.pool_get_attribute((CUmemoryPool)(uintptr_t)pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                               &u) != CUDA_SUCCESS)
        return false;
    *reserved = r;
    *used = u;
    return true;
}

uint64_t gg_driver_device_pool(int dev, bool default_pool)
{
    CUresult (*get)(CUmemoryPool *, CUdevice) =
        default_pool ? drv.device_get_default_mem_pool : drv.device_get_mem_pool;
    CUmemoryPool pool = NULL;
    if (!get || dev < 0 || get(&pool, (CUdevice)dev) != CUDA_SUCCESS)
        return 0;
    return (uint64_t)(uintptr_t)pool;
}

int gg_driver_stream_device(void *stream)
{
    CUdevice dev;
    /* The legacy and per-thread default streams are the current context's. */
    if ((uintptr_t)stream > 2 && drv.stream_get_device &&
        drv.stream_get_device((CUstream)stream, &dev) == CUDA_SUCCESS)
        return (int)dev;
    return gg_driver_current_device();
}
