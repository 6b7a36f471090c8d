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
 * Modules are found at cold points, never on the allocation path, each
 * judged once:
 *   - at the guard's start, every object loaded so far (gg_arch_start);
 *   - __cudaRegisterFatBinary, which nvcc's host code calls from the
 *     constructor of every library built with the shared runtime: the shim
 *     exports it (a row of hooks.def, a copy per runtime version, so each
 *     library's registration reaches its own runtime), notes the library,
 *     and checks one loaded after the start right there;
 *   - a static runtime (nvcc's default) registers inside its own library,
 *     never through the shim, so a library dlopen'ed after the start is
 *     found by gg_arch_poll(), which checks the objects loaded since its
 *     last look (one dl_iterate_phdr step when none were): when a runtime
 *     looks the driver up before its first kernel (cuGetProcAddress, or
 *     dlsym of a cu* name as runtimes before CUDA 11.3 and PyTorch's VMM
 *     code do), on the shim's own thread every tick (a library loaded and
 *     not used yet, or whose runtime reaches the driver around the shim),
 *     and at exit, before the summary.
 * A module whose file cannot be read (deleted, replaced) but whose fat
 * binaries were registered is judged from the registered ones in memory.
 */
#ifndef GG_ARCH_H
#define GG_ARCH_H

/* The guard has started (devices known, journal open): check every loaded
 * module. */
void gg_arch_start(void);

/* A cold point of a started shim (a driver lookup, the shim's tick, the
 * exit): check the modules loaded since the last look. Cheap when none
 * were; never waits for another thread's look. */
void gg_arch_poll(void);

/* A fat binary is being registered (before the runtime's own call): the
 * module it lies in, noted; NULL when it lies in none. */
void *gg_arch_registering(const void *fat_cubin);

/* ... and registered: check that module now (a started shim only). */
void gg_arch_registered(void *module);

#endif /* GG_ARCH_H */
