/* test_budget.c - journal line budgets (budget.c): the per-source rule
 * (the first 8, then powers of two) and the per-kind rate (a burst, then a
 * steady pace), with everything left out counted. Each event's own budget
 * is its row of events.def (test_events). */
#include <time.h>

#include "budget.h"
#include "unit.h"

static void test_thin(void)
{
    uint64_t kept = 0;
    for (uint64_t n = 1; n <= 1000000; n++)
        kept += gg_budget_thin(n);
    /* 1..8, then 16, 32, ..., 524288: 8 + 16 */
    CHECK_EQ_U64(kept, 8 + 16);
    CHECK(gg_budget_thin(1) && gg_budget_thin(8) && !gg_budget_thin(9) && gg_budget_thin(16));
}

static void test_burst_then_rate(void)
{
    struct gg_budget near = GG_BUDGET(256, 6), other = GG_BUDGET(256, 6);
    int taken = 0;
    for (int i = 0; i < 10000; i++)
        taken += gg_budget_take(&near);
    /* at once: the burst (256) and the one the current moment allows */
    CHECK(taken >= 256 && taken <= 258);
    CHECK_EQ_U64(gg_budget_suppressed(&near), 10000 - (uint64_t)taken);
    /* kinds are independent */
    CHECK(gg_budget_take(&other));
    CHECK_EQ_U64(gg_budget_suppressed(&other), 0);
    /* a timeline: 4 a second after a burst of 64 */
    struct gg_budget sample = GG_BUDGET(64, 240);
    taken = 0;
    for (int i = 0; i < 1000; i++)
        taken += gg_budget_take(&sample);
    CHECK(taken >= 64 && taken <= 66);
    struct timespec ts = {0, 600000000}; /* 0.6 s: two more samples' worth */
    nanosleep(&ts, NULL);
    int more = 0;
    for (int i = 0; i < 100; i++)
        more += gg_budget_take(&sample);
    CHECK(more >= 2 && more <= 3);
    /* a kind never limited (ALWAYS in events.def) */
    struct gg_budget always = GG_BUDGET(0, 0);
    for (int i = 0; i < 100000; i++)
        CHECK(gg_budget_take(&always));
    CHECK_EQ_U64(gg_budget_suppressed(&always), 0);
}

static void test_suppress(void)
{
    struct gg_budget advice = GG_BUDGET(256, 6);
    gg_budget_suppress(&advice);
    gg_budget_suppress(&advice);
    CHECK_EQ_U64(gg_budget_suppressed(&advice), 2);
    CHECK(gg_budget_take(&advice)); /* what the per-source rule left out costs no budget */
}

int main(void)
{
    RUN(test_thin);
    RUN(test_burst_then_rate);
    RUN(test_suppress);
    return unit_done();
}
