/* unwind.h - layer 3: the calling thread's native stack, as raw return
 * addresses, with the shim's own frames dropped.
 *
 * libunwind's unw_backtrace (its cached fast path) fills a buffer; what lies
 * in the shim's own executable segments is dropped from the top, so frame 0
 * is the code that called the CUDA function. libunwind is loaded
 * RTLD_LOCAL on first use, never linked: linked, its unversioned _Unwind_*
 * would come before libgcc_s's in every program the shim is preloaded into
 * (python3 does not link libgcc_s), and C++ unwinding would mix two
 * unwinders (a pthread_exit through C++ frames crashed).
 *
 * Every stored frame is a return address (frame 0 too: where the hook
 * returns to in its caller). Never mallocs, never takes a lock another
 * thread could hold for long; a capture re-entered on the same thread (a
 * signal handler) gets nothing instead of waiting for itself.
 */
#ifndef GG_UNWIND_H
#define GG_UNWIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_UNWIND_MAX 128

/* Load libunwind and find the shim's own code; called at start. */
void gg_unwind_warmup(void);

/* At most `depth` (<= GG_UNWIND_MAX) frames of the calling thread, from
 * the frame that returns to `from` (the caller passes its own return
 * address; what is above it is the capture's own machinery), then past
 * every frame of the shim. 0 when nothing could be taken. */
size_t gg_unwind_capture(uintptr_t *ips, size_t depth, uintptr_t from);

#ifdef GG_TESTING
/* For tests: the code ranges whose leading frames a capture drops (default:
 * the executable segments of the object holding unwind.c; lo == NULL goes
 * back to it). Not for use while other threads capture. */
void gg_unwind_test_self(const uintptr_t *lo, const uintptr_t *hi, size_t n);
#endif

#endif /* GG_UNWIND_H */
