/* backward.h - layer 4: where .backward() was called (the `backward` event,
 * docs/journal.md).
 *
 * Autograd runs backward on its own threads (pt_autograd_N), which have no
 * Python frames: what they allocate has a native stack only. The Python
 * line that started the backward belongs to the thread that called
 * .backward(), and PyTorch's instrumentation hands its frames to the shim
 * there (gpuguard_backward) before the engine runs. Each call is a
 * `backward` line, so a reader ties the incidents of autograd's threads to
 * the latest one before them.
 *
 * Lines are thinned per call site (its frames) like incidents: the first 8,
 * then the 16th, 32nd, ..., each with the site's running count, under a
 * line budget of their own. So that the latest line before an incident is
 * always the call that was running, a call whose line was thinned out is
 * kept, and written (with the moment of the call) before the next
 * incident's line (gg_backward_flush). Nothing here runs on the allocation
 * path.
 */
#ifndef GG_BACKWARD_H
#define GG_BACKWARD_H

#include <stdint.h>

#include "gpuguard.h"

/* .backward() was called from frames f[0..n) (innermost first) on thread
 * `thread` (NULL: the calling thread's own name). */
void gg_backward_call(const struct gpuguard_pyframe *f, int n, const char *thread);

/* An incident is about to be journaled: the latest call, if its line was
 * thinned out, is written now. Cheap when there is nothing to write. */
void gg_backward_flush(void);

/* Calls so far, of every site (lines are thinned: this is not). */
uint64_t gg_backward_calls(void);

#ifdef GG_TESTING
/* A call site's running count so far (tests); 0 when never seen. */
uint64_t gg_backward_count(const struct gpuguard_pyframe *f, int n);
#endif

/* The fork story (life.c): the lock is reset in a forked child. */
void gg_backward_after_fork(void);

#ifdef GG_TESTING
/* Start again (unit tests). */
void gg_backward_reset(void);
#endif

#endif /* GG_BACKWARD_H */
