/* ticker.h - layer 5: the shim's one thread of its own.
 *
 * Every GG_TICK_NS it runs the timeline's tick (react.h): the `sample`
 * lines since the last tick, and once a minute the lines the budgets left
 * out; and the metrics file when its interval has passed (metrics.h). So
 * nothing of the timeline is written on an allocation's path, and a slow
 * disk stalls this thread, not the training. The thread blocks every
 * signal (a process-directed signal never lands on it), is detached, and
 * is started only once the journal is open (or metrics are on); when it
 * cannot be started the timeline is written inline, at the same bounded
 * rate, and no metrics are.
 */
#ifndef GG_TICKER_H
#define GG_TICKER_H

#include <stdbool.h>

/* Start the thread; false when it could not be. */
bool gg_ticker_start(void);

/* Stop it before the summary: after this returns no tick runs (waits at
 * most a fraction of a second for one under way), then the last tick is
 * run here (with_stacks: see gg_react_tick). */
void gg_ticker_stop(bool with_stacks);

/* A forked child has no such thread. */
void gg_ticker_after_fork(void);

#endif /* GG_TICKER_H */
