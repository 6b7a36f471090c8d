/* test_steps.c - forecasts and leaks from step boundaries (steps.c), on a
 * device set up by hand: a run that grows is forecast a step before it
 * crosses the near-miss line, a flat noisy one never is, a leak is found
 * with its rate and the step it reaches the limit. */
#include <math.h>
#include <stdio.h>
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
    /* A climb to the edge of the zone, then a fall (the cache emptied):
     * the climb is forecast, the step after the fall is not, though the
     * line through the climb still points into the zone. */
    setup();
    for (uint64_t n = 1; n <= 10; n++) {
        uint64_t peak = n < 10 ? 19 * GiB + n * 150 * MiB : 19 * GiB;
        step(d, n, peak, 4 * GiB, &v, true);
        CHECK(v.forecast == (n == 9));
    }
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

/* Flat runs, noisy three ways, 200 seeds each, 300 steps: not one forecast
 * or leak. The shapes: uniform noise of +-3% on the peak (near the line:
 * 19.5 GiB, the zone starts at 20.4) and on the live bytes; a caching
 * allocator's sawtooth (live bytes and the peak climb 48 MiB a step for
 * 10 steps, then the cache is emptied: the first climb is a trend that
 * stays out of the zone, every fall leaves the line); and a rare spike
 * (one step in 25 peaks 4% higher). */
static void test_flat_noisy_runs_never(void)
{
    int forecasts = 0, leaks = 0;
    for (int shape = 0; shape < 3; shape++)
        for (unsigned seed = 1; seed <= 200; seed++) {
            struct gg_device *d = setup();
            struct gg_step_verdict v;
            unsigned r = seed * 7919u + (unsigned)shape;
            for (uint64_t n = 1; n <= 300; n++) {
                double live = 6.0 * GiB * (1 + noise(&r)), peak = 19.5 * GiB;
                if (shape == 0)
                    peak *= 1 + noise(&r);
                else if (shape == 1)
                    live = 6.0 * GiB + (double)(n % 10) * 48 * MiB, peak += live - 6.0 * GiB;
                else if (noise(&r) > 0.0276) /* the top 4% of the +-3% range */
                    peak *= 1.04;
                step(d, n, (uint64_t)peak, (uint64_t)live, &v, true);
                forecasts += v.forecast;
                leaks += v.leak;
            }
        }
    printf("  flat runs: 600 x 300 steps, %d forecasts, %d leaks\n", forecasts, leaks);
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

/* How early leaks are found against their rate, live bytes noisy by +-32 MiB
 * (a caching allocator's jitter), 50 seeds each: the step of the first leak
 * line, median and worst, and the rate it gave. Slow leaks need more steps
 * to stand out of the noise; none is said before LEAK_MIN + warm-up. */
static void test_leak_found_early_by_rate(void)
{
    static const uint64_t rates[] = {2 * MiB, 8 * MiB, 32 * MiB, 64 * MiB, 256 * MiB};
    for (size_t k = 0; k < sizeof rates / sizeof *rates; k++) {
        uint64_t found[50], worst = 0, missed = 0;
        double err = 0;
        for (unsigned seed = 1; seed <= 50; seed++) {
            struct gg_device *d = setup();
            struct gg_step_verdict v;
            unsigned r = seed * 104729u;
            found[seed - 1] = 0;
            for (uint64_t n = 1; n <= 300 && !found[seed - 1]; n++) {
                uint64_t live = 2 * GiB + n * rates[k] + (uint64_t)(noise(&r) / 0.03 * 32 * MiB + 32 * MiB);
                if (live + 3 * GiB >= d->limit)
                    break;
                step(d, n, live + 3 * GiB, live, &v, false);
                if (v.leak) {
                    found[seed - 1] = n;
                    err = fmax(err, fabs((double)v.rate / (double)rates[k] - 1));
                }
            }
            if (!found[seed - 1])
                missed++;
            else if (found[seed - 1] > worst)
                worst = found[seed - 1];
        }
        uint64_t sorted[50];
        memcpy(sorted, found, sizeof sorted);
        for (int i = 0; i < 50; i++)
            for (int j = i + 1; j < 50; j++)
                if (sorted[j] < sorted[i]) {
                    uint64_t t = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = t;
                }
        printf("  leak of %3llu MiB a step: found at step %llu (median), %llu (worst); "
               "rate within %.1f%%; %llu of 50 not found within 300 steps\n",
               (unsigned long long)(rates[k] / MiB), (unsigned long long)sorted[25 + missed / 2],
               (unsigned long long)worst, err * 100, (unsigned long long)missed);
        if (rates[k] >= 8 * MiB) { /* a quarter of the noise and up */
            CHECK_EQ_U64(missed, 0);
            CHECK(worst <= 50);
            CHECK(err < (rates[k] >= 32 * MiB ? 0.15 : 0.35)); /* the next lines refine it */
        }
    }
}

int main(void)
{
    RUN(test_trend);
    RUN(test_growth_is_forecast_a_step_ahead);
    RUN(test_flat_noisy_runs_never);
    RUN(test_leak);
    RUN(test_leak_found_early_by_rate);
    return unit_done();
}
