/* hooks_driver.h - the driver API, seen where allocations bypass the runtime
 * (DESIGN.md sections 2.1-2.3).
 *
 * The shim hands out its own functions in place of the driver's allocation
 * functions wherever a pointer to them is looked up: dlsym on libcuda's
 * handle, cuGetProcAddress (which libcudart and static runtimes such as
 * NCCL's use for every driver call), and cudaGetDriverEntryPoint (PyTorch's
 * expandable segments, CuPy). Each hook exists twice, by origin:
 *   GG_ORIGIN_DRIVER: found by a driver lookup (a static runtime: NCCL, cuBLAS);
 *                     counted, refused only when the policy says enforce = all;
 *   GG_ORIGIN_ENTRY:  handed out by cudaGetDriverEntryPoint; may be refused.
 *
 * The shim exports no driver names: a driver that takes its own functions'
 * addresses through its GOT would otherwise hand the shim's exports to every
 * static runtime, and NCCL's memory would be counted as refusable. A program
 * linked directly against libcuda (rare in training) is seen through the
 * runtime only.
 */
#ifndef GG_HOOKS_DRIVER_H
#define GG_HOOKS_DRIVER_H

#include <stdbool.h>

enum gg_origin { GG_ORIGIN_DRIVER = 0, GG_ORIGIN_ENTRY = 1 };

/* GPUGUARD_DRIVER_HOOKS is not 0 (read once, whenever first asked). */
bool gg_hooks_driver_enabled(void);

/* Is `name` (an exported symbol name) one the shim hooks? */
bool gg_hooks_driver_wanted(const char *name);

/* The hook to hand out for the driver function `real` found under `name`:
 * an exported symbol name when version < 0 (dlsym), else a cuGetProcAddress
 * base name with that CUDA version and flags. Returns `real` itself when the
 * function is not hooked. */
void *gg_hooks_driver_lookup(const char *name, void *real, enum gg_origin origin,
                             unsigned long long flags, int version);

/* For cudaGetDriverEntryPoint: make a looked-up pointer an entry-origin hook. */
void *gg_hooks_driver_entry(const char *symbol, void *fn, unsigned long long flags);

#endif /* GG_HOOKS_DRIVER_H */
