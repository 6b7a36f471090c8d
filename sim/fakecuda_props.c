/*
 * fakecuda_props.c - what a fake device is: its attributes, as a real device
 * of its architecture and model reports them (part of libcuda.so.1; see
 * fakecuda.h).
 *
 * Frameworks size their launches from these (PyTorch divides by the number
 * of multiprocessors and by the threads per multiprocessor, and picks
 * kernels by shared memory per block), so every limit a launch is planned
 * from is a real one:
 *   - per architecture (compute capability), the limits of NVIDIA's CUDA C++
 *     Programming Guide, "Technical Specifications per Compute Capability":
 *     threads, blocks, shared memory and registers per multiprocessor;
 *   - per model (matched on the device's name), the figures of NVIDIA's
 *     product specifications: multiprocessors, L2 cache, memory bus width,
 *     clocks. An unknown model gets its architecture's usual figures.
 * Everything a fake cannot have (ECC, TCC, a display watchdog) is 0;
 * capabilities every supported GPU has (unified addressing, VMM, pools,
 * managed memory, concurrent kernels) are 1.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <stddef.h>
#include <string.h>

#include "fakecuda.h"

/* Per compute capability: threads, blocks, shared memory (bytes, and the
 * most one block may opt in to) and registers per multiprocessor. */
struct arch {
    int major, minor;
    int threads_per_sm, blocks_per_sm;
    int smem_per_sm, smem_optin;
    int regs_per_sm;
    int l2_default;          /* bytes, for a model the table below does not know */
};

static const struct arch g_arch[] = {
    {5, 0, 2048, 32, 65536, 49152, 65536, 2 << 20},
    {5, 2, 2048, 32, 98304, 49152, 65536, 2 << 20},
    {6, 0, 2048, 32, 65536, 49152, 65536, 4 << 20},
    {6, 1, 2048, 32, 98304, 49152, 65536, 2 << 20},
    {7, 0, 2048, 32, 98304, 98304, 65536, 6 << 20},
    {7, 5, 1024, 16, 65536, 65536, 65536, 4 << 20},
    {8, 0, 2048, 32, 167936, 166912, 65536, 40 << 20},
    {8, 6, 1536, 16, 102400, 101376, 65536, 6 << 20},
    {8, 7, 2048, 32, 167936, 166912, 65536, 4 << 20},
    {8, 9, 1536, 24, 102400, 101376, 65536, 72 << 20},
    {9, 0, 2048, 32, 233472, 232448, 65536, 50 << 20},
    {10, 0, 2048, 32, 233472, 232448, 65536, 126 << 20},
    {12, 0, 1536, 32, 102400, 101376, 65536, 96 << 20},
};

/* Per model: a substring of the device's name. */
struct model {
    const char *name;
    int sms;
    int l2;              /* bytes */
    int bus_width;       /* bits */
    int mem_clock_khz;
    int clock_khz;
};

static const struct model g_model[] = {
    {"RTX 3060", 28, 3 << 20, 192, 7501000, 1777000},
    {"RTX 3080", 68, 5 << 20, 320, 9501000, 1710000},
    {"RTX 3090", 82, 6 << 20, 384, 9751000, 1695000},
    {"RTX 4090", 128, 72 << 20, 384, 10501000, 2520000},
    {"RTX 5070 Ti", 70, 48 << 20, 256, 14001000, 2452000},
    {"RTX 5090", 170, 96 << 20, 512, 14001000, 2407000},
    {"RTX PRO 6000", 188, 128 << 20, 512, 14001000, 2617000},
    {"A100", 108, 40 << 20, 5120, 1593000, 1410000},
    {"H100", 132, 50 << 20, 5120, 2619000, 1980000},
    {"H200", 132, 60 << 20, 6144, 3201000, 1980000},
    {"L4", 58, 48 << 20, 192, 6251000, 2040000},
    {"T4", 40, 4 << 20, 256, 5001000, 1590000},
};

static const struct arch *arch_of(const struct fk_device *d)
{
    const struct arch *best = &g_arch[0];
    for (size_t i = 0; i < sizeof g_arch / sizeof g_arch[0]; i++) {
        const struct arch *a = &g_arch[i];
        /* the newest architecture not newer than the device */
        if (a->major < d->major || (a->major == d->major && a->minor <= d->minor))
            best = a;
    }
    return best;
}

static const struct model *model_of(const struct fk_device *d)
{
    for (size_t i = 0; i < sizeof g_model / sizeof g_model[0]; i++)
        if (strstr(d->name, g_model[i].name))
            return &g_model[i];
    return NULL;
}

int fk_attribute(int dev, CUdevice_attribute attr)
{
    const struct fk_device *d = fk_device(dev);
    const struct arch *a = arch_of(d);
    const struct model *m = model_of(d);
    switch (attr) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return d->major;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return d->minor;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return m ? m->sms : 80;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return a->smem_optin;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return a->smem_per_sm;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return d->major >= 8 ? 1024 : 0;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return a->regs_per_sm;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return a->threads_per_sm;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return a->blocks_per_sm;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
    case CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return m ? m->clock_khz : 1500000;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return m ? m->mem_clock_khz : 5001000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return m ? m->bus_width : 256;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return m ? m->l2 : a->l2_default;
    case CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE:
        return d->major >= 8 ? (m ? m->l2 : a->l2_default) * 3 / 4 : 0;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 1 + dev;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO:
        return d->major == 8 && d->minor == 0 ? 2 : d->major == 9 || d->major == 10 ? 2 : 64;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED:
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT:
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER:
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD:
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS:
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES:
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST:
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED:
        return 0;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR:
        return 1;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
        return CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    case CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE: return d->major >= 8 ? 134213632 : 0;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: return d->major >= 9;
    default: return 0;
    }
}
