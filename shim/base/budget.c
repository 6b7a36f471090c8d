/* budget.c - layer 1: journal line budgets (see budget.h). */
#include "budget.h"

#include <stdatomic.h>

#include "prim.h"

#define MIN_NS 60000000000ull

/* The theoretical arrival time of the next line (GCRA): a line may go when
 * it is no more than burst intervals ahead of now. */
bool gg_budget_take(struct gg_budget *b)
{
    if (!b->per_min)
        return true;
    uint64_t every = MIN_NS / b->per_min;
    uint64_t slack = every * b->burst;
    uint64_t now = gg_now_ns() + slack; /* so that a fresh budget starts with its burst */
    uint64_t t = atomic_load_explicit(&b->tat, memory_order_relaxed);
    for (;;) {
        uint64_t at = t > now - slack ? t : now - slack;
        if (at > now) {
            atomic_fetch_add_explicit(&b->suppressed, 1, memory_order_relaxed);
            return false;
        }
        if (atomic_compare_exchange_weak_explicit(&b->tat, &t, at + every,
                                                  memory_order_relaxed, memory_order_relaxed))
            return true;
    }
}

void gg_budget_suppress(struct gg_budget *b)
{
    atomic_fetch_add_explicit(&b->suppressed, 1, memory_order_relaxed);
}

uint64_t gg_budget_suppressed(struct gg_budget *b)
{
    return atomic_load_explicit(&b->suppressed, memory_order_relaxed);
}
