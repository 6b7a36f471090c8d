/* react.h - layer 4: what the shim does about a verdict.
 *
 * The guard decides and says what happened (guard.h); this turns it into
 * journal lines (events.h) and advice (advice.h): the incident's line, then
 * the advice's line, then the signal, so a handler that attaches a note
 * finds its advice already in the journal.
 */
#ifndef GG_REACT_H
#define GG_REACT_H

#include <stdbool.h>
#include <stdint.h>

#include "guard.h"

/* After a decision on call c (never on the fast path: gg_verdict_any). */
void gg_react(const struct gg_call *c, const struct gg_verdict *v);

/* After a free. */
void gg_react_free(const struct gg_verdict *v);
/* After a mapping, on a thread whose failure waits for its retry (guard.h:
 * gg_guard_retrying). */
void gg_react_mapped(void);

/* Failures whose retry has not come for max_ns (0: every one, at exit):
 * said as not retried. The tick does it with GG_RETRY_STALE_NS. */
#define GG_RETRY_STALE_NS 250000000ull
void gg_react_settle(uint64_t max_ns);

/* Python frames could not be read (an unsupported interpreter, a layout
 * that did not check out): said once, as an `error` event. */
void gg_react_python(void);

/* A step boundary's verdict on device dev: its line, a forecast's advice,
 * a leak. */
struct gg_step_verdict;
void gg_react_step(int dev, uint64_t step, const struct gg_step_verdict *v);

/* The timeline's tick (`sample` lines, docs/journal.md), every GG_TICK_NS from
 * a thread of the shim's own (life.c): the samples since the last tick;
 * with report_suppressed, also the lines the budgets left out since the
 * last report (a `suppressed` line, when there were any). with_stacks
 * false (the last tick of an exit that may have interrupted the shim):
 * nothing that captures or names a stack (the failures waiting for their
 * retry, the peak's sites), since that may wait on a lock the interrupted
 * thread holds (malloc's, the loader's); the summary says the peak.
 * ticking(true):
 * the thread runs, so allocations leave samples to it. */
#define GG_TICK_NS 500000000ull
void gg_react_tick(bool report_suppressed, bool with_stacks);
/* The timeline up to now, written before the trainer's lines (a batch, a
 * note), so a phase's samples come before the line that closes it. */
void gg_react_flush(void);
void gg_react_ticking(bool on);

/* A forecast by the shape of step `step` (steps.h: gg_steps_predict): its
 * peak `bytes`, device-wide, crosses device dev's near-miss line. */
void gg_react_shape_forecast(int dev, uint64_t step, uint64_t bytes);

/* Advice given for device dev for `why` (enum gg_reason: its cause; an
 * advice at the minimum batch counts under its cause), since the start:
 * advice a trainer could hear (one registered, or a handler for the
 * signal). */
uint64_t gg_react_advised(int dev, int why);
/* Advice no trainer could hear on device dev, since the start (journaled
 * with heard false: what would have been advised). */
uint64_t gg_react_unheard(int dev);

/* Devices (a bit each) switched to enforce by a trainer's registration. */
void gg_react_registered(uint64_t switched);

#endif /* GG_REACT_H */
