/* arch.h - layer 4: device code against the GPUs, in the process
 * ("no kernel image is available": docs/how-it-works.md,
 * "Device code against the GPU").
 *
 * Every loaded module with device code is checked once, before its first
 * kernel: its .nv_fatbin (read from its file, headers only, fatbin.h)
 * against the compute capability of each GPU of the process. One `arch`
 * event per module and distinct compute capability; for a module that no
 * GPU of the process can run, one line on stderr naming the module, the
 * GPU, what the module carries and the fix.
 *
 * Modules are found three ways, never on the allocation path:
 *   - at the guard's start, every object loaded so far (gg_arch_start);
 *   - __cudaRegisterFatBinary, which nvcc's host code calls from the
 *     constructor of every library built with the shared runtime: the shim
 *     exports it (a row of hooks.def, a copy per runtime version, so each
 *     library's registration reaches its own runtime), notes the library,
 *     and checks one loaded after the start right there;
 *   - a static runtime (nvcc's default) never calls the shim's registration,
 *     but it looks up the driver (cuGetProcAddress) before its first kernel:
 *     at each lookup gg_arch_poll() checks the objects loaded since the last
 *     look, which costs one dl_iterate_phdr step when none were.
 * A module whose file cannot be read (deleted, replaced) but whose fat
 * binaries were registered is judged from the registered ones in memory.
 */
#ifndef GG_ARCH_H
#define GG_ARCH_H

/* The guard has started (devices known, journal open): check every loaded
 * module. */
void gg_arch_start(void);

/* A cheap point off the allocation path (a driver lookup) of a started
 * shim: check the modules loaded since the last look. */
void gg_arch_poll(void);

/* A fat binary is being registered (before the runtime's own call): the
 * module it lies in, noted; NULL when it lies in none. */
void *gg_arch_registering(const void *fat_cubin);

/* ... and registered: check that module now (a started shim only). */
void gg_arch_registered(void *module);

#endif /* GG_ARCH_H */
