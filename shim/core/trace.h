/* trace.h - layer 4: the call trace (GPUGUARD_TRACE=FILE).
 *
 * Every memory call the shim intercepts, as the program made it, one line
 * each: what was asked, on which device, what came back (a refusal is said
 * as one), and the lookups that handed out the shim's hooks. From such a
 * trace of a real program (real PyTorch on the fake GPU of tests/torch, or
 * on a real GPU), tests/traces/tracefmt.py makes a golden trace, and the
 * replay program makes the same calls through the same paths on the fake
 * stack, so that what real PyTorch does stays under test where it cannot
 * run. The format (tests/traces/README.md) is text, one call a line, tokens
 * separated by one space:
 *
 *   gpuguard-trace 1 pid=PID
 *   device DEV TOTAL CC NAME...             each device the shim guards
 *   alloc API DEV BYTES KEY RESULT t=TID [pool=POOL]
 *                                           RESULT: the CUDA code, or
 *                                           "refused"; KEY: the pointer, or
 *                                           the ledger's key of a handle
 *                                           (0 when none); POOL: the pool
 *                                           that served it
 *   free API KEY t=TID                      before the real free (the address
 *                                           may be handed out again the moment
 *                                           it returns); so are unmap, release
 *   fail free|unmap|release API KEY RESULT t=TID   that call failed
 *   map VA SIZE HANDLE RESULT | unmap VA SIZE t=TID | release HANDLE t=TID
 *                                           HANDLE: the ledger's key, as alloc
 *   pool OP POOL ARG RESULT                 create (ARG: device, or -1 for the
 *                                           host), destroy, trim (ARG: bytes
 *                                           kept), current (ARG: device),
 *                                           sync, attr (ARG: ATTR=VALUE)
 *   meminfo API DEV FREE TOTAL              what the program was told
 *   lookup VIA NAME VERSION FLAGS MODULE    a hook handed out: VIA dlsym,
 *                                           getproc, entry (cudaGetDriver-
 *                                           EntryPoint) or entry_v (its
 *                                           ByVersion form); MODULE the file
 *                                           that asked
 *   step N | batch BATCH ACCUM | ack SEQ    the C API
 *   shape D0,D1,... BATCH_DIM | needed DEV BYTES
 *
 * Lookups before the shim starts (a runtime resolving its driver as it
 * loads) are kept and written first. Off unless asked: one relaxed load on
 * each hook's path. Lines are
 * written with one write(2) each to a file the shim creates (O_EXCL; "%p"
 * in the name becomes the pid, so children trace to their own file).
 */
#ifndef GG_TRACE_H
#define GG_TRACE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "prim.h"

extern _Atomic int gg_trace_fd; /* -1: not tracing */

static inline bool gg_tracing(void)
{
    return gg_unlikely(atomic_load_explicit(&gg_trace_fd, memory_order_relaxed) >= 0);
}

/* Start tracing to path (at the start; said once when it cannot be; NULL or
 * empty: no trace). Called once, on the start's path. */
void gg_trace_open(const char *path);
/* The start is over (with a trace or without): no more lookups are kept. */
void gg_trace_started(void);
/* The header line of each device. */
void gg_trace_device(int dev, const char *name, uint64_t total, int cc_major, int cc_minor);

/* pool: the slot of the pool that served it (pools.h), GG_POOL_NONE for none. */
void gg_trace_alloc(const char *api, int dev, uint64_t bytes, uintptr_t key, int result,
                    bool refused, unsigned pool);
void gg_trace_free(const char *api, uintptr_t key);
void gg_trace_map(uintptr_t va, uint64_t size, uint64_t handle, int result);
void gg_trace_unmap(uintptr_t va, uint64_t size);
void gg_trace_release(uint64_t handle);
/* A free, unmap or release traced before its real call failed. */
void gg_trace_failed(const char *what, const char *api, uint64_t key, int result);
void gg_trace_pool(const char *op, uint64_t pool, long long arg, int result);
void gg_trace_pool_attr(uint64_t pool, int attr, unsigned long long value, int result);
void gg_trace_meminfo(const char *api, int dev, uint64_t free_b, uint64_t total_b);
void gg_trace_lookup(const char *via, const char *name, int version, unsigned long long flags,
                     uintptr_t caller);
/* Lookups before the start are kept (and written first) when a trace is
 * asked for: true while that is so. Callers test it beside gg_tracing()
 * on the lookup paths only. */
bool gg_trace_early(void);
void gg_trace_api(const char *what, long long a, long long b);
/* gpuguard_step_shape's call: `shape D0,D1,... BATCH_DIM` ("-": no dims). */
void gg_trace_shape(const long long *dims, int ndims, int batch_dim);

/* The fork story (life.c): a child does not write its parent's trace. */
void gg_trace_after_fork(void);

#endif /* GG_TRACE_H */
