/* budget.h - layer 1: how many journal lines each kind of event may write.
 *
 * A week-long job must not fill a disk, whatever it does: a hot loop in the
 * near-miss zone, thousands of call sites, a retry loop of refusals, memory
 * oscillating across a sample step. Two rules bound every kind of line:
 *
 *   - per source (a call site, a device and advice reason): the first 8
 *     lines, then the 16th, 32nd, 64th... (gg_budget_thin), each line
 *     carrying its running count;
 *   - per kind, for the whole process: a burst, then a steady rate (a
 *     generic cell rate algorithm: lock-free, safe in a signal handler),
 *     which holds for any number of sources.
 *
 * Every line not written is counted per kind (gg_budget_suppressed); the
 * counts are journaled at intervals and in the summary. A few lines are
 * never limited: start, summary, and the lines that report suppression and
 * loss themselves.
 */
#ifndef GG_BUDGET_H
#define GG_BUDGET_H

#include <stdbool.h>
#include <stdint.h>

enum gg_line {
    GG_LINE_NEAR_MISS,
    GG_LINE_REFUSED,
    GG_LINE_OOM,
    GG_LINE_ADVICE,
    GG_LINE_SAMPLE,
    GG_LINE_STEP,
    GG_LINE_LEAK,
    GG_LINE_BATCH,
    GG_LINE_NOTE,
    GG_LINE_ARCH,
    GG_LINE_ERROR,
    GG_LINE_MODE,
    GG_LINE_TORCH,
    GG_LINE_BACKWARD,
    GG_LINE_PEAK,
    GG_LINES,
    GG_LINE_ALWAYS = GG_LINES /* never limited */
};

/* May a line of this kind be written now? False: it is counted as
 * suppressed. */
bool gg_budget_take(enum gg_line kind);

/* The per-source rule for a source's n-th event (n >= 1): true for the
 * first 8 and every power of two after. */
static inline bool gg_budget_thin(uint64_t n)
{
    return n <= 8 || (n & (n - 1)) == 0;
}

/* A line the per-source rule left out: counted. */
void gg_budget_suppress(enum gg_line kind);

/* Lines of this kind not written since the start. */
uint64_t gg_budget_suppressed(enum gg_line kind);

/* The event's name ("near_miss", ...). */
const char *gg_budget_name(enum gg_line kind);

/* Start again (unit tests; the budgets are the process's). */
void gg_budget_reset(void);

#endif /* GG_BUDGET_H */
