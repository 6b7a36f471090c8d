/* life.h - layer 5: the shim's life: its state, the hook gate, start, fork, exit.
 *
 * Nothing happens when the library is loaded. The first intercepted CUDA
 * call starts the guard (life.c); a process that never calls CUDA is never
 * touched. Every hook passes through the gate: gg_enter() says whether this
 * call is the guard's to count, and makes calls nested inside it (the
 * runtime calling the driver through a hook the shim handed it) pass
 * straight through, so nothing is counted twice (docs/how-it-works.md).
 */
#ifndef GG_LIFE_H
#define GG_LIFE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "advice.h"
#include "prim.h"

enum gg_state {
    GG_STATE_UNSTARTED = 0,
    GG_STATE_STARTING,
    GG_STATE_ACTIVE,
    GG_STATE_PASSTHROUGH, /* off, failed, or a forked child: forward everything */
};

extern _Atomic int gg_state;
extern GG_TLS int gg_depth;

bool gg_enter_slow(void);

/* True when the caller is to count this call; it must then gg_leave(). */
static inline bool gg_enter(void)
{
    if (gg_depth)
        return false;
    if (gg_likely(atomic_load_explicit(&gg_state, memory_order_acquire) == GG_STATE_ACTIVE)) {
        gg_depth = 1;
        return true;
    }
    return gg_enter_slow();
}

static inline void gg_leave(void)
{
    gg_depth = 0;
}

/* The C API's work runs "inside the shim" too: an exit() from a signal
 * handler that interrupts it knows the shim's locks may be this thread's
 * (gg_life_finish). */
static inline int gg_inside(void)
{
    int was = gg_depth;
    gg_depth = 1;
    return was;
}

static inline void gg_outside(int was)
{
    gg_depth = was;
}

/* Is the guard counting? */
static inline bool gg_active(void)
{
    return atomic_load_explicit(&gg_state, memory_order_acquire) == GG_STATE_ACTIVE;
}

/* Will it never count in this process (off, failed, a forked child)? */
static inline bool gg_passing_through(void)
{
    return atomic_load_explicit(&gg_state, memory_order_acquire) == GG_STATE_PASSTHROUGH;
}

/* A trainer registered (the C API): journal it, enforce where auto. */
void gg_life_registered(void);

/* The trainer runs a new batch, now (set or acked), instead of was (not
 * known when it never said): the phase of was ends, journaled per used
 * device (`batch` events, with the trainer's reason why, or NULL), for
 * --recommend. The step trend starts again, unless why is "shape": a
 * batch sized by its own input (the trend by tokens still holds). */
void gg_life_batch(struct gg_batch now, struct gg_batch was, const char *why);

/* A training step ended (gpuguard_step): per used device, the step's
 * line, the forecast, the leak (steps.h). */
void gg_life_step(uint64_t step);

/* The input of the step in progress (gpuguard_step_shape): dims[0..ndims),
 * batch_dim -1 when not known; a forecast by its tokens when they lie
 * beyond the run's and its predicted peak crosses a device's line. */
void gg_life_shape(const long long *dims, int ndims, int batch_dim);
/* What the step in progress's tensors held at its peak on device dev. */
void gg_life_needed(int dev, unsigned long long bytes);
/* The program is ending with this uncaught error (gpuguard_uncaught). */
void gg_life_uncaught(const char *what);

/* Write the summary now if it has not been written (exit path). */
void gg_life_finish(void);

#endif /* GG_LIFE_H */
