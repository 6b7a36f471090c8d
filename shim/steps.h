/* steps.h - layer 4: the trainer's steps: a forecast a step ahead, and the
 * leak by its line (docs/trainer.md).
 *
 * At each step boundary (gpuguard_step) a device's window is closed
 * (device.h: the step's peak, device-wide peak and the live bytes at the
 * boundary, O(1)) and added to a short history. From it:
 *   - the trend of the step peaks: when it says the next step's peak crosses
 *     the near-miss line, a forecast (advice before any near miss);
 *   - the trend of the live bytes at the boundaries: when they grow steadily,
 *     a leak, with the sites whose live bytes grew.
 * Trends are Theil-Sen slopes (the median of the pairwise slopes: a few
 * outliers cannot move them) and count only when the Mann-Kendall test says
 * the rise is real (a flat run, noisy or not, has none) and the rise over
 * the history is larger than the noise around the line. Nothing here runs
 * on the allocation path; a boundary costs O(history^2) per device, and
 * O(sites) every STEPS_SNAPSHOT steps for the leak's sites.
 */
#ifndef GG_STEPS_H
#define GG_STEPS_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "sites.h"

#define GG_LEAK_SITES 8

/* What a boundary found on one device. */
struct gg_step_verdict {
    struct gg_window w;     /* the step: its peak, device-wide peak, live bytes */
    bool journal;           /* write its `step` line (bounded: see steps.c) */
    bool forecast;          /* the trend crosses the near-miss line */
    uint64_t fc_step;       /* ... at this step */
    uint64_t fc_bytes;      /* ... with this predicted peak */
    bool leak;              /* a leak to journal (new, or its rate or sites changed) */
    uint64_t since_step, rate, projected_step; /* projected 0: never */
    size_t nsites;
    struct gg_site_usage sites[GG_LEAK_SITES]; /* bytes: grown since the baseline */
};

/* Step `step` ended on device dev (d = gg_device(dev)). */
void gg_steps_boundary(struct gg_device *d, int dev, uint64_t step, bool forecast,
                       struct gg_step_verdict *out);

/* Where device dev's steps stand, for the metrics (metrics.h): read
 * without a lock, from any thread; 0 where there is nothing to say. */
struct gg_steps_now {
    uint64_t step;            /* the last boundary's step */
    uint64_t fc_step;         /* the step the latest forecast named */
    uint64_t fc_bytes;        /* ... and its predicted device-wide peak */
    uint64_t leak_rate;       /* the leak being reported: bytes per step; 0: none */
    uint64_t leak_projected;  /* ... the step it reaches the limit at */
};
void gg_steps_now(int dev, struct gg_steps_now *out);

/* The trainer changed its batch: the step peaks' trend starts again. */
void gg_steps_reset(int dev);

/* The fork story (life.c). */
void gg_steps_after_fork(void);

/* ---- the statistics, exposed for the unit test ---------------------------- */

/* Theil-Sen over points (x[i], y[i]), n <= GG_STEPS_HISTORY: slope and
 * intercept; the Mann-Kendall z of the rise (0 when n < 3). */
#define GG_STEPS_HISTORY 32
void gg_steps_trend(const double *x, const double *y, int n, double *slope, double *intercept,
                    double *z);

#endif /* GG_STEPS_H */
