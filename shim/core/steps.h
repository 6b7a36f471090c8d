/* steps.h - layer 4: the trainer's steps: what each step's input and
 * tensors were, a forecast a step ahead, and the leak by its line
 * (docs/trainer.md).
 *
 * At each step boundary (gpuguard_step) a device's window is closed
 * (device.h: the step's peak, device-wide peak and the live bytes at the
 * boundary, O(1)) and added to a short history, with what the trainer told
 * of the step: its input's shape and tokens (gpuguard_step_shape, before
 * the step allocates) and what its tensors needed at the peak
 * (gpuguard_step_needed: PyTorch's allocated bytes at the step's peak,
 * beside the cache's reserved `peak`). From the history:
 *   - the trend of what the steps need on the device (the tensors' need
 *     where it was told, the device-wide peak otherwise): when it says the
 *     next step's peak crosses the near-miss line, a forecast (advice
 *     before any near miss). A cache that holds more than its tensors need
 *     (a growing sequence fills it with blocks too small for the next step)
 *     neither hides a coming OOM nor fakes one;
 *   - the same need against the input's tokens: at a step's shape, a
 *     forecast when its tokens lie beyond the run's and the line through
 *     the run's (tokens, need) says it will not fit (gg_steps_predict);
 *   - the trend of the live bytes at the boundaries: when they grow
 *     steadily, a leak is suspected, with the sites whose live bytes grew.
 *     A suspicion is said (`leak`) once it is confirmed (torch.h: the
 *     tensors one step allocated that the next did not free), or at once
 *     where nothing can confirm it (gg_steps_leak_said); a suspicion the
 *     check cleared is not raised again for a while (gg_steps_leak_cleared).
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
#define GG_SHAPE_DIMS 8

/* A step's input, as the trainer told it (gpuguard_step_shape). */
struct gg_shape {
    int ndims;                     /* 0: none told */
    int batch_dim;                 /* the batch's dimension; -1: not known */
    int64_t dims[GG_SHAPE_DIMS];   /* the first GG_SHAPE_DIMS of them */
    uint64_t tokens;               /* its elements (all its dimensions) */
};

/* The batch a shape implies: its batch dimension's size, 0 when unknown. */
static inline int gg_shape_batch(const struct gg_shape *s)
{
    if (s->ndims <= 0 || s->batch_dim < 0 || s->batch_dim >= s->ndims ||
        s->batch_dim >= GG_SHAPE_DIMS || s->dims[s->batch_dim] <= 0 ||
        s->dims[s->batch_dim] > 0x7fffffff)
        return 0;
    return (int)s->dims[s->batch_dim];
}

/* What a boundary found on one device. */
struct gg_step_verdict {
    struct gg_window w;     /* the step: its peak, device-wide peak, live bytes */
    struct gg_shape input;  /* its input, when told */
    bool has_needed;
    uint64_t needed;        /* what its tensors held at its peak, when told */
    uint64_t flushes;       /* failures recovered in it by a cache flush (retry.h) */
    bool has_predicted;
    uint64_t predicted;     /* the peak predicted for its input before it ran (gpuguard_predict) */
    bool journal;           /* write its `step` line (bounded: see steps.c) */
    bool forecast;          /* the trend crosses the near-miss line */
    uint64_t fc_step;       /* ... at this step */
    uint64_t fc_bytes;      /* ... with this predicted device-wide peak */
    bool fc_need;           /* ... from the tensors' need (else from the peaks) */
    bool leak;              /* a leak suspected (new, or its rate or sites changed) */
    uint64_t since_step, rate, projected_step; /* projected 0: never */
    bool confirmed;         /* the rate is what one step kept (torch.h's check) */
    uint64_t live_rate;     /* ... and the live bytes' trend at the boundaries */
    uint64_t work;          /* the working set: device use at the peak beyond live bytes */
    size_t nsites;
    struct gg_site_usage sites[GG_LEAK_SITES]; /* bytes: grown since the baseline */
};

/* Step `step` ended on device dev (d = gg_device(dev)); `input`: the step's
 * input (gg_steps_take_shape), or NULL. */
void gg_steps_boundary(struct gg_device *d, int dev, uint64_t step, bool forecast,
                       const struct gg_shape *input, struct gg_step_verdict *out);

/* ---- what the trainer tells of the step in progress ------------------------ */

/* The step in progress's input (any thread). Told several times in one
 * step (micro-batches), the largest by tokens is the step's: the one its
 * peak follows. */
void gg_steps_shape(const struct gg_shape *s);
/* The step in progress's input so far; false when none was told. */
bool gg_steps_shape_now(struct gg_shape *out);
/* The step's input, taken at its boundary (the next step starts with none);
 * false when none was told. */
bool gg_steps_take_shape(struct gg_shape *out);
/* The batch the trainer is seen to run: the batch dimension of the latest
 * input told (0: never told, or no batch dimension). */
int gg_steps_seen_batch(void);
/* What the step in progress's tensors held at its peak on device dev (told
 * before its boundary). */
void gg_steps_needed(int dev, uint64_t bytes);
/* A failure on device dev in the step in progress was recovered by its
 * caller's cache flush (retry.h). */
void gg_steps_flushed(int dev);

/* The step peak predicted for an input of `tokens` on device dev, from the
 * run's steps (their tokens and the tensors' need): the device-wide bytes,
 * whether the tokens lie beyond every step's so far, and (at_most, may be
 * NULL) the prediction for the most tokens a step had. False when the steps
 * do not give a line (too few, tokens that do not vary, a need that does
 * not follow them). */
bool gg_steps_predict(const struct gg_device *d, int dev, uint64_t tokens, uint64_t *bytes,
                      bool *beyond, uint64_t *at_most);

/* The run's memory model on device dev: what a step needs against its
 * input's tokens, fitted by least squares from every step that told its
 * shape (running sums: it lives as long as the run, whatever the trainer's
 * batch changes). Linear, with a quadratic term when the data say so (it
 * halves the residual, with enough distinct inputs). The need is the
 * step's device-wide need where the tensors' need was told (the cache
 * holds more after a longer step), else its device-wide peak. */
struct gg_steps_model {
    uint64_t steps;         /* steps in the fit */
    uint64_t most_tokens;   /* the largest input seen */
    uint64_t bytes;         /* the prediction for the input asked */
    uint64_t margin;        /* 2 sigma of the fit, + 15% of the growth beyond the largest */
    bool beyond, quadratic;
    /* the fit: bytes = intercept + per_token x tokens + per_token2 x tokens^2, +- sigma */
    double intercept, per_token, per_token2, sigma;
};
/* False (out->steps still filled) when there is no model yet. */
bool gg_steps_model(int dev, uint64_t tokens, struct gg_steps_model *out);
/* The trainer asked the prediction for an input of `tokens` on device dev
 * (gpuguard_predict): when the step in progress's input has those tokens,
 * its step line says what was predicted for it. */
void gg_steps_asked(int dev, uint64_t tokens, uint64_t bytes);

/* ---- leaks ----------------------------------------------------------------- */

/* The leak suspected on device dev was said (a `leak` line) at the rate
 * `rate` (bytes a step) reaching the limit at step `projected` (0: never):
 * what the metrics show, and what a next suspicion is compared against. */
void gg_steps_leak_said(int dev, uint64_t rate, uint64_t projected);
/* The check of the suspected leak found nothing kept at step `step`: not
 * suspected again until the live bytes grew for a while longer. */
void gg_steps_leak_cleared(int dev, uint64_t step);

/* Where device dev's steps stand, for the metrics (metrics.h): read
 * without a lock, from any thread; 0 where there is nothing to say. */
struct gg_steps_now {
    uint64_t step;            /* the last boundary's step */
    uint64_t steps;           /* boundaries so far */
    uint64_t flush_steps;     /* ... of them, steps that paid a cache flush */
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
