/* budget.c - layer 1: journal line budgets (see budget.h). */
#include "budget.h"

#include <stdatomic.h>

#include "prim.h"

#define MIN_NS 60000000000ull

/* Per kind: the burst (lines at once) and the steady rate (lines a minute).
 * Incidents and advice carry stacks or matter one by one: a generous burst,
 * then one every 10 s. Samples are a timeline: four a second. PyTorch's
 * views (torch) can carry 32 lines of tensors: a small burst; backward
 * calls are thinned per call site first. Bytes per
 * hour at the steady rate, with the lines' usual sizes: incidents about
 * 1 MiB each kind, samples 1.3 MiB, the rest less. */
static const struct {
    const char *name;
    uint32_t burst, per_min;
} table[GG_LINES] = {
    [GG_LINE_NEAR_MISS] = {"near_miss", 256, 6},
    [GG_LINE_REFUSED] = {"refused", 256, 6},
    [GG_LINE_OOM] = {"oom", 256, 6},
    [GG_LINE_ADVICE] = {"advice", 256, 6},
    [GG_LINE_SAMPLE] = {"sample", 64, 240},
    [GG_LINE_STEP] = {"step", 256, 60},
    [GG_LINE_LEAK] = {"leak", 32, 6},
    [GG_LINE_BATCH] = {"batch", 256, 60},
    [GG_LINE_NOTE] = {"note", 256, 60},
    [GG_LINE_ARCH] = {"arch", 256, 60},
    [GG_LINE_ERROR] = {"error", 256, 10},
    [GG_LINE_MODE] = {"mode", 64, 6},
    [GG_LINE_TORCH] = {"torch", 64, 6},
    [GG_LINE_BACKWARD] = {"backward", 256, 6},
    [GG_LINE_PEAK] = {"peak", 32, 6},
};

/* The theoretical arrival time of the next line (GCRA): a line may go when
 * it is no more than burst intervals ahead of now. 0: never used. */
static _Atomic uint64_t tat[GG_LINES];
static _Atomic uint64_t suppressed[GG_LINES];

bool gg_budget_take(enum gg_line kind)
{
    if ((unsigned)kind >= GG_LINES)
        return true;
    uint64_t every = MIN_NS / table[kind].per_min;
    uint64_t slack = every * table[kind].burst;
    uint64_t now = gg_now_ns() + slack; /* so that a fresh budget starts with its burst */
    uint64_t t = atomic_load_explicit(&tat[kind], memory_order_relaxed);
    for (;;) {
        uint64_t at = t > now - slack ? t : now - slack;
        if (at > now) {
            atomic_fetch_add_explicit(&suppressed[kind], 1, memory_order_relaxed);
            return false;
        }
        if (atomic_compare_exchange_weak_explicit(&tat[kind], &t, at + every,
                                                  memory_order_relaxed, memory_order_relaxed))
            return true;
    }
}

void gg_budget_suppress(enum gg_line kind)
{
    if ((unsigned)kind < GG_LINES)
        atomic_fetch_add_explicit(&suppressed[kind], 1, memory_order_relaxed);
}

uint64_t gg_budget_suppressed(enum gg_line kind)
{
    return (unsigned)kind < GG_LINES ? atomic_load_explicit(&suppressed[kind], memory_order_relaxed)
                                     : 0;
}

const char *gg_budget_name(enum gg_line kind)
{
    return (unsigned)kind < GG_LINES ? table[kind].name : "";
}

void gg_budget_reset(void)
{
    for (int k = 0; k < GG_LINES; k++) {
        atomic_store(&tat[k], 0);
        atomic_store(&suppressed[k], 0);
    }
}
