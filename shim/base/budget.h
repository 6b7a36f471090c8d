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
 * counts are journaled at intervals and in the summary. This module is the
 * mechanism; which kinds there are and each one's burst and rate are the
 * events' rows of events.def (events.c holds one budget per event).
 */
#ifndef GG_BUDGET_H
#define GG_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* One kind of line's budget. */
struct gg_budget {
    uint32_t burst, per_min;     /* lines at once, then lines a minute; 0: never limited */
    _Atomic uint64_t tat;        /* the next line's theoretical arrival (GCRA); 0: unused */
    _Atomic uint64_t suppressed; /* lines not written since the start */
};
#define GG_BUDGET(burst, per_min) { (burst), (per_min), 0, 0 }

/* May a line of this kind be written now? False: it is counted as
 * suppressed. Always true for a kind never limited. */
bool gg_budget_take(struct gg_budget *b);

/* The per-source rule for a source's n-th event (n >= 1): true for the
 * first 8 and every power of two after. */
static inline bool gg_budget_thin(uint64_t n)
{
    return n <= 8 || (n & (n - 1)) == 0;
}

/* A line the per-source rule left out: counted. */
void gg_budget_suppress(struct gg_budget *b);

/* Lines of this kind not written since the start. */
uint64_t gg_budget_suppressed(struct gg_budget *b);

#endif /* GG_BUDGET_H */
