/* test_steps.c - forecasts and leaks from step boundaries (steps.c), on a
 * device set up by hand: a run that grows is forecast a step before it
 * crosses the near-miss line, a flat noisy one never is, a leak is found
 * with its rate and the step it reaches the limit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ledger.h"
#include "steps.h"
#include "unit.h"

#define GiB (1ULL << 30)
#define MiB (1ULL << 20)

static struct gg_device *setup(void)
{
    gg_devices_reset();
    struct gg_device *d = &gg_devices[0];
    d->present = true;
    d->mode = GG_MODE_OBSERVE;
    d->total = 24 * GiB;
    d->limit = 21 * GiB + 614 * MiB; /* 90% */
    d->near = 1228 * MiB;            /* 5% */
    gg_device_count = 1;
    gg_steps_reset(0);
    return d;
}

/* One step: the process holds `live` at the boundary and peaked at `peak`;
 * the device held `others` more (the context, other processes). */
static uint64_t others;

static void step(struct gg_device *d, uint64_t n, uint64_t peak, uint64_t live,
                 struct gg_step_verdict *v, bool forecast)
{
    atomic_store(&d->current, peak);
    gg_atomic_max(&d->window_peak, peak);
    gg_atomic_max(&d->window_used, peak + others); /* the device-wide peak */
    atomic_store(&d->current, live);
    gg_steps_boundary(d, 0, n, forecast, v);
}

static void test_trend(void)
{
    double x[10], y[10], slope, icept, z;
    for (int i = 0; i < 10; i++) {
        x[i] = i;
        y[i] = 3 + 2 * i + (i == 4 ? 100 : 0); /* one wild outlier */
    }
    gg_steps_trend(x, y, 10, &slope, &icept, &z);
    CHECK(fabs(slope - 2) < 1e-9);
    CHECK(fabs(icept - 3) < 1e-9);
    CHECK(z > 3);
    for (int i = 0; i < 10; i++)
        y[i] = 5;
    gg_steps_trend(x, y, 10, &slope, &icept, &z);
    CHECK(slope == 0 && z == 0);
}

static void test_growth_is_forecast_a_step_ahead(void)
{
    struct gg_device *d = setup();
    struct gg_step_verdict v;
    uint64_t line = d->limit - d->near, first = 0;
    /* The line is on the device's use: the context and a neighbour's
     * 768 MiB count, so the forecast comes two steps earlier than the
     * process's own peaks alone would say. */
    others = 768 * MiB;
    for (uint64_t n = 1; n <= 40 && !first; n++) {
        uint64_t peak = 12 * GiB + n * 400 * MiB, used = peak + others;
        step(d, n, peak, 4 * GiB, &v, true);
        CHECK(v.w.peak == peak && v.w.peak_used == used && v.w.live == 4 * GiB);
        if (v.forecast) {
            first = n;
            CHECK(used < line);                      /* before any near miss */
            CHECK(used + 400 * MiB > line);          /* the next step crosses */
            CHECK(peak + 400 * MiB < line);          /* ... which the process alone would not */
            CHECK_EQ_U64(v.fc_step, n + 1);
            CHECK(llabs((long long)v.fc_bytes - (long long)(used + 400 * MiB)) < 64 * MiB);
        }
    }
    CHECK(first > 0);
    others = 0;
    /* switched off: no forecast */
    setup();
    for (uint64_t n = 1; n <= 40; n++) {
        step(d, n, 12 * GiB + n * 400 * MiB, 4 * GiB, &v, false);
        CHECK(!v.forecast);
    }
}

static double noise(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return ((double)((*seed >> 8) % 20001) / 10000.0 - 1.0) * 0.03; /* +-3% */
}

static void test_flat_noisy_run_never(void)
{
    struct gg_device *d = setup();
    struct gg_step_verdict v;
    unsigned seed = 7;
    int forecasts = 0, leaks = 0;
    for (uint64_t n = 1; n <= 300; n++) {
        uint64_t live = (uint64_t)(6.0 * GiB * (1 + noise(&seed)));
        uint64_t peak = (uint64_t)(19.5 * GiB * (1 + noise(&seed) / 3));
        step(d, n, peak, live, &v, true);
        forecasts += v.forecast;
        leaks += v.leak;
    }
    CHECK_EQ_U64(forecasts, 0);
    CHECK_EQ_U64(leaks, 0);
}

static void test_leak(void)
{
    struct gg_device *d = setup();
    struct gg_step_verdict v;
    unsigned seed = 3;
    uint64_t found = 0, reports = 0;
    for (uint64_t n = 1; n <= 120; n++) {
        uint64_t live = 2 * GiB + n * 64 * MiB + (uint64_t)(noise(&seed) * 32 * MiB + 32 * MiB);
        step(d, n, live + 3 * GiB, live, &v, true);
        if (v.leak) {
            reports++;
            if (!found) {
                found = n;
                CHECK(v.rate > 64 * MiB * 85 / 100 && v.rate < 64 * MiB * 115 / 100);
                /* live + the 3 GiB working set reach the limit at: */
                uint64_t want = (d->limit - 5 * GiB - 32 * MiB) / (64 * MiB);
                CHECK(llabs((long long)v.projected_step - (long long)want) <= 3);
                CHECK(v.since_step <= found && v.since_step >= 1);
            }
        }
    }
    CHECK(found > 0 && found <= 50);
    CHECK(reports >= 1 && reports <= 3); /* said again only when it changes */
}

int main(void)
{
    RUN(test_trend);
    RUN(test_growth_is_forecast_a_step_ahead);
    RUN(test_flat_noisy_run_never);
    RUN(test_leak);
    return unit_done();
}
