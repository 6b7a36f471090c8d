/* callers.h - layer 3: which module a call came from (docs/how-it-works.md).
 *
 * Whether an allocation may be refused is decided by the module that asked
 * for it: the loaded object (library or executable) holding the return
 * address of the call that entered the shim, by its file name, whatever
 * API path carried the call (runtime, driver entry point, cuGetProcAddress,
 * dlsym on libcuda, -lcuda). Looked up only where an answer is needed (a
 * refusal about to happen, a journal line that says who asked), never on
 * the allocation path: dladdr takes the loader's lock.
 *
 * Answers are cached by address. When an object has been unloaded since an
 * answer was cached, the address may now lie in another one: the cache is
 * then emptied.
 */
#ifndef GG_CALLERS_H
#define GG_CALLERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The file name (no directory) of the object holding return address ip,
 * copied into out (cut to fit): "libnccl.so.2", "python3.11", the
 * executable's name as it was run. False, out empty, when no loaded object
 * holds it (JIT code, anonymous memory) or ip is 0. */
bool gg_callers_module(uintptr_t ip, char *out, size_t cap);

/* The fork story (life.c). */
void gg_callers_after_fork(void);

#endif /* GG_CALLERS_H */
