/*
 * fakecuda.h - what the parts of the fake driver (libcuda.so.1) share.
 *
 * Not installed and not for callers: the driver's API is cuda.h. The parts:
 *   fakecuda.c        devices, contexts, memory, pools, arrays, host memory,
 *                     the legacy entry points, cuGetProcAddress's table
 *   fakecuda_props.c  what a device is: attributes by architecture and
 *                     model, PCI bus ids, UUIDs
 *   fakecuda_exec.c   what runs on it: streams, events, modules, launches,
 *                     copies and sets, pointer queries, IPC and multicast
 *                     (refused), peers
 * Everything here is hidden: the library exports CUDA's names only.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <cuda.h>
#include <stdint.h>

#define FK_HIDDEN __attribute__((visibility("hidden")))

struct fk_device {
    char name[256];
    uint64_t total;
    int major, minor;
};

/* CUDA_SUCCESS once cuInit succeeded in this process (not a fork child of
 * one), else CUDA_ERROR_NOT_INITIALIZED. */
FK_HIDDEN CUresult fk_ready(void);
/* The devices FAKECUDA_DEVICES describes; NULL for no such ordinal. */
FK_HIDDEN int fk_device_count(void);
FK_HIDDEN const struct fk_device *fk_device(int dev);
/* The calling thread's current context's device; -1 when it has none. */
FK_HIDDEN int fk_current_device(void);
/* Does p lie in the device address space (device memory, a reserved VA
 * range, a legacy 32-bit pointer)? Device memory is never backed. */
FK_HIDDEN int fk_is_device_address(uint64_t p);
/* What the devices' UUIDs are made from besides their ordinal and name:
 * the state file's identity when FAKECUDA_STATE is shared (its processes
 * share the devices), else this process's (a device of its own). */
FK_HIDDEN uint64_t fk_uuid_salt(void);
/* A synchronisation: pools give back what their thresholds allow. */
FK_HIDDEN void fk_synchronized(void);

/* fakecuda_props.c: an attribute of device dev (valid), as a real device of
 * that architecture and model reports it. */
FK_HIDDEN int fk_attribute(int dev, CUdevice_attribute attr);

/* fakecuda_exec.c: page-locked host ranges (cuMemHostAlloc, registered
 * memory), for pointer queries. */
FK_HIDDEN void fk_host_range_add(const void *p, uint64_t size, int registered);
FK_HIDDEN void fk_host_range_remove(const void *p);

#endif /* FAKECUDA_H */
