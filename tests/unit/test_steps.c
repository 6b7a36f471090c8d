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
    gg_steps_boundary(d, 0, n, forecast, NULL, v);
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
            gg_steps_leak_said(0, v.rate, v.projected_step); /* nothing here confirms it */
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

/* One step with the tensors' need told: the cache peaked at `peak`, the
 * tensors at `need`. */
static void step_need(struct gg_device *d, uint64_t n, uint64_t peak, uint64_t need,
                      uint64_t live, struct gg_step_verdict *v)
{
    gg_steps_needed(0, need);
    step(d, n, peak, live, v, true);
}

/* A growing sequence with the default allocator: the tensors' need climbs
 * 740 MiB a step, smoothly, while the cache's peaks jump ahead of it and
 * fall back at each flush (PyTorch empties its cache and retries). The
 * forecast follows the need: it names the step whose need crosses the
 * near-miss line, which the peaks' zig-zag never would; and a cache that
 * climbs while its tensors' need stays flat fakes none. */
static void test_forecast_follows_the_need(void)
{
    struct gg_device *d = setup();
    struct gg_step_verdict v;
    uint64_t line = d->limit - d->near, first = 0;
    for (uint64_t n = 1; n <= 40 && !first; n++) {
        uint64_t need = GiB + n * 740 * MiB;
        /* the cache: twice the need, less after every third step's flush */
        uint64_t peak = need * 2 > 23 * GiB ? 23 * GiB : need * 2;
        if (n % 3 == 0)
            peak = need + 64 * MiB;
        step_need(d, n, peak, need, peak / 2, &v);
        CHECK(v.has_needed && v.needed == need);
        if (v.forecast) {
            first = n;
            CHECK(v.fc_need);
            /* three steps ahead: the step whose need crosses the line */
            CHECK_EQ_U64(v.fc_step, n + 3);
            CHECK(need + 2 * 740 * MiB <= line && need + 3 * 740 * MiB > line);
            CHECK(llabs((long long)v.fc_bytes - (long long)(need + 3 * 740 * MiB)) < 64 * MiB);
        }
    }
    CHECK_EQ_U64(first, (line - GiB) / (740 * MiB) - 2); /* three steps before the need crosses */
    /* the cache fills (reserved climbs to the zone and stays there), the
     * tensors' need does not grow: no forecast */
    setup();
    for (uint64_t n = 1; n <= 40; n++) {
        uint64_t peak = 4 * GiB + n * 600 * MiB;
        step_need(d, n, peak > 21 * GiB ? 21 * GiB : peak, 3 * GiB, GiB, &v);
        CHECK(!v.forecast);
    }
    /* without the need told, the peaks as before */
    setup();
    for (uint64_t n = 1; n <= 40 && !v.forecast; n++)
        step(d, n, 12 * GiB + n * 400 * MiB, 4 * GiB, &v, true);
    CHECK(v.forecast && !v.fc_need);
}

static uint64_t shape_tokens(int64_t b, int64_t t)
{
    return (uint64_t)(b * t);
}

/* Long-tailed lengths: the need follows the tokens of each step's input,
 * not the step: no trend by step, a line by tokens, and a step whose input
 * lies beyond the run's is predicted from it before it runs. */
static void test_shapes_and_the_prediction_by_tokens(void)
{
    struct gg_device *d = setup();
    struct gg_step_verdict v;
    unsigned seed = 11;
    uint64_t bytes;
    bool beyond;
    CHECK(!gg_steps_predict(d, 0, 8 * 1000, &bytes, &beyond, NULL)); /* no steps yet */
    for (uint64_t n = 1; n <= 30; n++) {
        seed = seed * 1103515245u + 12345u;
        int64_t len = 300 + (int64_t)((seed >> 8) % 1700);
        struct gg_shape in = {.ndims = 2, .batch_dim = 0, .dims = {8, len},
                              .tokens = shape_tokens(8, len)};
        gg_steps_shape(&in);
        gg_steps_needed(0, GiB + in.tokens * 192 * 1024); /* 192 KiB a token */
        struct gg_shape told;
        CHECK(gg_steps_take_shape(&told) && told.tokens == in.tokens);
        CHECK(!gg_steps_take_shape(&told)); /* the next step starts with none */
        uint64_t peak = GiB + in.tokens * 300 * 1024;
        atomic_store(&d->current, peak);
        gg_atomic_max(&d->window_peak, peak);
        gg_atomic_max(&d->window_used, peak);
        atomic_store(&d->current, GiB);
        gg_steps_boundary(d, 0, n, true, &in, &v);
        CHECK(!v.forecast); /* random lengths: no trend by step */
        CHECK(v.input.dims[1] == len && gg_shape_batch(&v.input) == 8);
    }
    CHECK(gg_steps_seen_batch() == 8);
    CHECK(gg_steps_predict(d, 0, shape_tokens(8, 1000), &bytes, &beyond, NULL));
    CHECK(!beyond);
    CHECK(llabs((long long)bytes - (long long)(GiB + 8000ull * 192 * 1024)) < 16 * MiB);
    uint64_t most;
    CHECK(gg_steps_predict(d, 0, shape_tokens(8, 7556), &bytes, &beyond, &most));
    CHECK(beyond && bytes > 12 * GiB && bytes < 13 * GiB);
    CHECK(most > GiB + 8ull * 1900 * 192 * 1024 && most < bytes); /* the longest so far's */
    /* told twice in one step (micro-batches): the largest is the step's */
    struct gg_shape a = {.ndims = 2, .batch_dim = 1, .dims = {512, 4}, .tokens = 2048},
                    b = {.ndims = 2, .batch_dim = 1, .dims = {256, 4}, .tokens = 1024}, got;
    gg_steps_shape(&a);
    gg_steps_shape(&b);
    CHECK(gg_steps_shape_now(&got) && got.tokens == 2048 && gg_shape_batch(&got) == 4);
    CHECK(gg_steps_seen_batch() == 4);
    gg_steps_take_shape(&got);
    struct gg_shape none = {.ndims = 1, .batch_dim = -1, .dims = {7}, .tokens = 7};
    CHECK(gg_shape_batch(&none) == 0);
}

/* One step with a shape on device dev: its tensors needed `need`. */
static void shaped_step(struct gg_device *d, int dev, uint64_t n, int64_t len, uint64_t need)
{
    struct gg_step_verdict v;
    struct gg_shape in = {.ndims = 2, .batch_dim = 0, .dims = {8, len},
                          .tokens = shape_tokens(8, len)};
    gg_steps_shape(&in);
    gg_steps_needed(dev, need);
    gg_steps_take_shape(&in);
    atomic_store(&d->current, need + GiB); /* the cache holds more than the tensors */
    gg_atomic_max(&d->window_peak, need + GiB);
    gg_atomic_max(&d->window_used, need + GiB);
    atomic_store(&d->current, GiB);
    gg_steps_boundary(d, dev, n, false, &in, &v);
}

/* The run's memory model (gpuguard_predict): none before 3 steps with a
 * shape; the tensors' need against tokens, linear where it is, with a
 * quadratic term where the data say so; kept across a batch change; a
 * margin that grows with the distance beyond the largest input seen. */
static void test_memory_model(void)
{
    setup();
    gg_device_count = 3;
    struct gg_steps_model m;
    for (int dev = 1; dev <= 2; dev++) {
        struct gg_device *d = &gg_devices[dev];
        d->present = true;
        d->mode = GG_MODE_OBSERVE;
        d->total = 24 * GiB;
        d->limit = 21 * GiB + 614 * MiB;
        d->near = 1228 * MiB;
        gg_steps_reset(dev);
        CHECK(!gg_steps_model(dev, 8000, &m) && m.steps == 0);
        unsigned seed = 7;
        for (uint64_t n = 1; n <= 40; n++) {
            seed = seed * 1103515245u + 12345u;
            int64_t len = 256 + (int64_t)((seed >> 8) % 1800);
            double t = 8.0 * (double)len;
            uint64_t need = dev == 1 ? GiB + (uint64_t)(t * 192 * 1024)
                                     : GiB + (uint64_t)(t * 64 * 1024 + t * t * 16);
            shaped_step(d, dev, n, len, need);
            if (n == 2)
                CHECK(!gg_steps_model(dev, 8000, &m) && m.steps == 2);
            if (n == 20)
                gg_steps_reset(dev); /* the trainer changed its batch: the model stays */
        }
        double t = 8.0 * 1500, want = dev == 1 ? GiB + t * 192 * 1024 : GiB + t * 64 * 1024 + t * t * 16;
        CHECK(gg_steps_model(dev, (uint64_t)t, &m));
        CHECK(m.steps == 40 && !m.beyond && m.most_tokens <= 8 * 2055);
        CHECK(m.quadratic == (dev == 2));
        CHECK(fabs((double)m.bytes - want) < 0.03 * want);
        uint64_t margin_in = m.margin;
        t = 8.0 * 7556;
        want = dev == 1 ? GiB + t * 192 * 1024 : GiB + t * 64 * 1024 + t * t * 16;
        struct gg_steps_model at;
        CHECK(gg_steps_model(dev, m.most_tokens, &at) && !at.beyond);
        CHECK(gg_steps_model(dev, (uint64_t)t, &m) && m.beyond);
        CHECK(fabs((double)m.bytes - want) < 0.05 * want);
        /* 15% of what it grows past the largest seen, on top of the noise */
        double grown = (double)m.bytes - (double)at.bytes;
        CHECK(fabs((double)(m.margin - margin_in) - 0.15 * grown) < 0.01 * grown);
        CHECK(fabs(m.per_token - (dev == 1 ? 192.0 * 1024 : 64.0 * 1024)) <
              (dev == 1 ? 0.01 * 192 * 1024 : 0.2 * 64 * 1024));
        /* the prediction asked for the next step's input: its line says it */
        struct gg_step_verdict v;
        struct gg_shape in = {.ndims = 2, .batch_dim = 0, .dims = {8, 1000}, .tokens = 8000};
        gg_steps_asked(dev, 8000, 5 * GiB);
        gg_steps_boundary(d, dev, 41, false, &in, &v);
        CHECK(v.has_predicted && v.predicted == 5 * GiB);
        gg_steps_asked(dev, 8000, 5 * GiB);   /* asked for another input than the step's */
        in.tokens = 9000;
        gg_steps_boundary(d, dev, 42, false, &in, &v);
        CHECK(!v.has_predicted);
        gg_steps_boundary(d, dev, 43, false, &in, &v); /* one step only */
        CHECK(!v.has_predicted);
    }
    gg_device_count = 1;
}

/* A suspicion its check cleared (nothing one step allocated outlived the
 * next: the cache, or growing inputs) is not raised again for a while,
 * and the quiet doubles. */
static void test_cleared_leak_stays_quiet(void)
{
    struct gg_device *d = setup();
    struct gg_step_verdict v;
    uint64_t suspected[8], k = 0;
    for (uint64_t n = 1; n <= 120 && k < 8; n++) {
        step(d, n, 2 * GiB + n * 64 * MiB + 3 * GiB, 2 * GiB + n * 64 * MiB, &v, false);
        if (v.leak) {
            suspected[k++] = n;
            gg_steps_leak_cleared(0, n);
        }
    }
    CHECK(k >= 3);
    CHECK(suspected[1] - suspected[0] >= 16);
    CHECK(suspected[2] - suspected[1] >= 32);
    struct gg_steps_now now;
    gg_steps_now(0, &now);
    CHECK_EQ_U64(now.leak_rate, 0); /* nothing said */
}

int main(void)
{
    RUN(test_trend);
    RUN(test_growth_is_forecast_a_step_ahead);
    RUN(test_flat_noisy_runs_never);
    RUN(test_leak);
    RUN(test_leak_found_early_by_rate);
    RUN(test_forecast_follows_the_need);
    RUN(test_shapes_and_the_prediction_by_tokens);
    RUN(test_cleared_leak_stays_quiet);
    RUN(test_memory_model);
    return unit_done();
}
