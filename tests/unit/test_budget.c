/* test_budget.c - journal line budgets (budget.c): the per-source rule
 * (the first 8, then powers of two) and the per-kind rate (a burst, then a
 * steady pace), with everything left out counted. */
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
    gg_budget_reset();
    int taken = 0;
    for (int i = 0; i < 10000; i++)
        taken += gg_budget_take(GG_LINE_NEAR_MISS);
    /* at once: the burst (256) and the one the current moment allows */
    CHECK(taken >= 256 && taken <= 258);
    CHECK_EQ_U64(gg_budget_suppressed(GG_LINE_NEAR_MISS), 10000 - (uint64_t)taken);
    /* kinds are independent */
    CHECK(gg_budget_take(GG_LINE_REFUSED));
    CHECK_EQ_U64(gg_budget_suppressed(GG_LINE_REFUSED), 0);
    /* samples: 4 a second after their burst of 64 */
    taken = 0;
    for (int i = 0; i < 1000; i++)
        taken += gg_budget_take(GG_LINE_SAMPLE);
    CHECK(taken >= 64 && taken <= 66);
    struct timespec ts = {0, 600000000}; /* 0.6 s: two more samples' worth */
    nanosleep(&ts, NULL);
    int more = 0;
    for (int i = 0; i < 100; i++)
        more += gg_budget_take(GG_LINE_SAMPLE);
    CHECK(more >= 2 && more <= 3);
    /* the lines that are never limited */
    for (int i = 0; i < 100000; i++)
        CHECK(gg_budget_take(GG_LINE_ALWAYS));
}

static void test_suppress_and_names(void)
{
    gg_budget_reset();
    gg_budget_suppress(GG_LINE_ADVICE);
    gg_budget_suppress(GG_LINE_ADVICE);
    CHECK_EQ_U64(gg_budget_suppressed(GG_LINE_ADVICE), 2);
    CHECK_STR(gg_budget_name(GG_LINE_NEAR_MISS), "near_miss");
    CHECK_STR(gg_budget_name(GG_LINE_SAMPLE), "sample");
    CHECK_STR(gg_budget_name(GG_LINE_ALWAYS), "");
    CHECK_EQ_U64(gg_budget_suppressed(GG_LINE_ALWAYS), 0);
}

int main(void)
{
    RUN(test_thin);
    RUN(test_burst_then_rate);
    RUN(test_suppress_and_names);
    return unit_done();
}
