/*
 * fakenvml.c - a fake NVML (libnvidia-ml.so.1) for the fake GPU.
 *
 * Frameworks ask NVML what the driver does not say: PyTorch's out-of-memory
 * message lists the processes using the device ("Process 4242 has 21.50 GiB
 * memory in use"), through nvmlDeviceGetHandleByPciBusId_v2 and
 * nvmlDeviceGetComputeRunningProcesses, and PyTorch 2.6 asserts that
 * nvmlInit_v2 and the NvLink queries exist before it writes that message.
 *
 * The devices are the fake driver's: this library asks libcuda.so.1 (the one
 * the process loaded, else the one beside this file) for their names,
 * memory, PCI bus ids and UUIDs, and for the bytes in use (fakecuda_used).
 * A process is listed as using a device while it holds the device's primary
 * context; the fake driver counts usage per device, not per process, so
 * that process is credited with everything the device holds (exact for one
 * process per device, as in the tests). No NvLink: those queries answer
 * NVML_ERROR_NOT_SUPPORTED, as on a PCIe card.
 *
 * Only the types it needs are defined here (NVML's ABI, as nvml.h gives
 * it): the host toolkit carries no nvml.h.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_UNKNOWN = 999,
};

typedef struct fake_nvml_device *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

/* nvmlProcessInfo_v1_t: what the unversioned name fills (PyTorch includes
 * nvml.h with NVML_NO_UNVERSIONED_FUNC_DEFS). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

/* nvmlProcessInfo_t of the _v2/_v3 names. */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#define EXPORT __attribute__((visibility("default")))
#define MAXDEV 64

struct fake_nvml_device {
    int index;
};

static struct fake_nvml_device g_devs[MAXDEV];
static int g_ndev;
static int g_inits; /* nvmlInit minus nvmlShutdown */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static struct {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
    CUresult (*DriverGetVersion)(int *);
    unsigned long long (*used)(int);
} drv;

/* The driver the process loaded, else the one beside this library. */
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
            if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
                return h;
        }
    }
    return dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
}

static nvmlReturn_t load(void)
{
    if (drv.Init)
        return NVML_SUCCESS;
    void *h = open_driver();
    if (!h)
        return NVML_ERROR_DRIVER_NOT_LOADED;
#define SYM(field, name)                                         \
    if (!(*(void **)&drv.field = dlsym(h, name)))                \
        return NVML_ERROR_DRIVER_NOT_LOADED
    SYM(DeviceGetCount, "cuDeviceGetCount");
    SYM(DeviceGetName, "cuDeviceGetName");
    SYM(DeviceTotalMem, "cuDeviceTotalMem_v2");
    SYM(DeviceGetPCIBusId, "cuDeviceGetPCIBusId");
    SYM(DeviceGetUuid, "cuDeviceGetUuid_v2");
    SYM(DeviceGetAttribute, "cuDeviceGetAttribute");
    SYM(DevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState");
    SYM(used, "fakecuda_used");
    SYM(DriverGetVersion, "cuDriverGetVersion");
    SYM(Init, "cuInit"); /* last: its presence means all are there */
#undef SYM
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t r = load();
    int n = 0;
    if (r == NVML_SUCCESS && (drv.Init(0) != CUDA_SUCCESS || drv.DeviceGetCount(&n) != CUDA_SUCCESS))
        r = NVML_ERROR_DRIVER_NOT_LOADED;
    if (r == NVML_SUCCESS) {
        g_ndev = n < MAXDEV ? n : MAXDEV;
        for (int i = 0; i < g_ndev; i++)
            g_devs[i].index = i;
        g_inits++;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

EXPORT nvmlReturn_t nvmlInit_v2(void);
EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void);
EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void);
EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_mu);
    nvmlReturn_t r = g_inits > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_inits > 0)
        g_inits--;
    pthread_mutex_unlock(&g_mu);
    return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result);
EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t ready(void)
{
    pthread_mutex_lock(&g_mu);
    int on = g_inits > 0;
    pthread_mutex_unlock(&g_mu);
    return on ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

static int index_of(nvmlDevice_t d)
{
    return d >= &g_devs[0] && d < &g_devs[g_ndev] ? d->index : -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count);
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t r = ready();
    if (r)
        return r;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)g_ndev;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t r = ready();
    if (r)
        return r;
    if (!device || index >= (unsigned)g_ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devs[index];
    return NVML_SUCCESS;
}

/* Bus ids compare without case and with or without the 8-digit domain
 * ("00000000:01:00.0" and "0000:01:00.0" name one device). */
static int same_bus_id(const char *a, const char *b)
{
    unsigned da, ba, va, fa, db, bb, vb, fb;
    return sscanf(a, "%x:%x:%x.%x", &da, &ba, &va, &fa) == 4 &&
           sscanf(b, "%x:%x:%x.%x", &db, &bb, &vb, &fb) == 4 && da == db && ba == bb && va == vb &&
           fa == fb;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device);
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    nvmlReturn_t r = ready();
    if (r)
        return r;
    if (!pciBusId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < g_ndev; i++) {
        char id[32];
        if (drv.DeviceGetPCIBusId(id, sizeof id, i) == CUDA_SUCCESS && same_bus_id(id, pciBusId)) {
            *device = &g_devs[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t r = ready();
    int i = index_of(device);
    if (r)
        return r;
    if (i < 0 || !name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return drv.DeviceGetName(name, (int)length, i) == CUDA_SUCCESS ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    nvmlReturn_t r = ready();
    int i = index_of(device);
    if (r)
        return r;
    if (i < 0 || !index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned)i;
    return NVML_SUCCESS;
}

/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", the driver's UUID. */
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t r = ready();
    int i = index_of(device);
    if (r)
        return r;
    if (i < 0 || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (length < 41)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    CUuuid u;
    if (drv.DeviceGetUuid(&u, i) != CUDA_SUCCESS)
        return NVML_ERROR_UNKNOWN;
    const unsigned char *b = (const unsigned char *)u.bytes;
    snprintf(uuid, length,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlReturn_t r = ready();
    int i = index_of(device);
    if (r)
        return r;
    if (i < 0 || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t total = 0;
    if (drv.DeviceTotalMem(&total, i) != CUDA_SUCCESS)
        return NVML_ERROR_UNKNOWN;
    unsigned long long used = drv.used(i);
    if (used > total)
        used = total;
    *memory = (nvmlMemory_t){total, total - used, used};
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor);
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    nvmlReturn_t r = ready();
    int i = index_of(device);
    if (r)
        return r;
    if (i < 0 || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    return drv.DeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, i) ||
                   drv.DeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, i)
               ? NVML_ERROR_UNKNOWN
               : NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    nvmlReturn_t r = ready();
    int i = index_of(device);
    if (r)
        return r;
    if (i < 0 || !pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    int bus = 0;
    drv.DeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, i);
    pci->bus = (unsigned)bus;
    if (drv.DeviceGetPCIBusId(pci->busId, sizeof pci->busId, i) != CUDA_SUCCESS)
        return NVML_ERROR_UNKNOWN;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02x:00.0", (unsigned)bus & 0xff);
    return NVML_SUCCESS;
}

/* This process, while it holds the device's context, with all the device
 * holds (see the top of the file). */
static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, void *infos, size_t each,
                              int v1)
{
    nvmlReturn_t r = ready();
    int i = index_of(device);
    if (r)
        return r;
    if (i < 0 || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned flags = 0;
    int active = 0;
    drv.DevicePrimaryCtxGetState(i, &flags, &active);
    unsigned n = active ? 1 : 0;
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n;
    if (n && infos) {
        unsigned long long used = drv.used(i);
        if (v1)
            *(nvmlProcessInfo_v1_t *)infos = (nvmlProcessInfo_v1_t){(unsigned)getpid(), used};
        else
            *(nvmlProcessInfo_t *)infos = (nvmlProcessInfo_t){(unsigned)getpid(), used, 0xffffffffu,
                                                              0xffffffffu};
        (void)each;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos);
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         nvmlProcessInfo_v1_t *infos)
{
    return processes(device, count, infos, sizeof *infos, 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_t *infos);
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                            nvmlProcessInfo_t *infos)
{
    return processes(device, count, infos, sizeof *infos, 0);
}

/* A PCIe card: no NvLink. */
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci);
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                        nvmlPciInfo_t *pci)
{
    (void)link, (void)pci;
    nvmlReturn_t r = ready();
    return r ? r : index_of(device) < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        int *type);
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        int *type)
{
    (void)link, (void)type;
    nvmlReturn_t r = ready();
    return r ? r : index_of(device) < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive);
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive)
{
    (void)link, (void)isActive;
    nvmlReturn_t r = ready();
    return r ? r : index_of(device) < 0 ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version);
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    nvmlReturn_t r = ready();
    if (r)
        return r;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    return drv.DriverGetVersion(version) == CUDA_SUCCESS ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
