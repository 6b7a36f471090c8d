/* steps.c - layer 4: forecasts and leaks from the trainer's steps (see
 * steps.h). */
#include "steps.h"

#include <math.h>
#include <string.h>

#include "prim.h"

#define HIST GG_STEPS_HISTORY
#define FORECAST_MIN 5       /* step peaks before a trend is believed */
#define FORECAST_Z 2.0       /* Mann-Kendall z of a rise that is real (one-sided p < 0.025) */
#define FORECAST_AHEAD 3     /* steps the tensors' need is forecast ahead */
#define LEAK_WARMUP 3        /* boundaries after a (re)start whose live bytes are not used */
#define LEAK_MIN 12          /* live readings before a leak is believed */
#define LEAK_Z 4.0           /* ... and a stricter test: a leak is a strong word */
#define LEAK_PERSIST 3       /* boundaries in a row that must agree before it is said */
#define LEAK_QUIET 16        /* boundaries a cleared suspicion stays quiet (doubling) */
#define LINES_ALWAYS 100     /* every step line for the first steps of a device ... */
#define LINES_EVERY 100      /* ... then every 100th, */
#define LINES_MOVED 20       /* ... whenever a value moved by 1/20 of the device, */
#define LINES_NS 10000000000ull /* ... and 10 s after the last (a killed run's last step) */
#define SNAP_SITES 256       /* sites compared for a leak's growth */
#define RECHECK_SITES 16     /* while leaking, its sites are looked at again this often */

struct point {
    double x, used, live; /* step, its device-wide peak, live bytes at its end */
    double need;          /* device-wide use had the cache held only what the tensors
                             needed (needed + the use that is not the process's); < 0:
                             not told */
    double tokens;        /* its input's elements; 0: not told */
};

static struct steps {
    gg_spin lock;
    struct point p[HIST];     /* oldest first */
    int n;
    uint64_t boundaries;      /* since the last reset */
    uint64_t lines;           /* step lines written, ever */
    uint64_t line_ns;         /* ... the last one's moment */
    struct gg_window last;    /* as last written */
    /* the leak: suspected from the boundaries' trend, said once confirmed */
    bool suspected;           /* the trend says so now */
    int agree;                /* boundaries in a row whose live bytes said "leak" */
    uint64_t since, trend_rate, last_check;
    bool said;                /* a leak line was written for the current suspicion */
    uint64_t said_trend;      /* ... the trend's rate then */
    gg_site top;              /* its largest site as last looked at */
    uint64_t quiet_until;     /* a cleared suspicion: no other before this step */
    uint64_t quiet;           /* ... and the next quiet spell */
    struct gg_site_usage base[SNAP_SITES]; /* the sites at the last reset */
    size_t nbase;
    /* what gg_steps_now reads: written under the lock, read without it */
    _Atomic uint64_t now_step, now_steps, now_flush_steps, now_fc_step, now_fc_bytes, now_leak_rate,
        now_leak_projected;
} st[GG_MAX_DEVICES];

static double pairs[HIST * (HIST - 1) / 2]; /* under a device's lock: one boundary at a time */
static gg_spin pairs_lock = GG_SPIN_INIT;

/* The step in progress: its input as told (the largest by tokens), and
 * what its tensors needed per device (+ 1; 0: not told). */
static gg_spin shape_lock = GG_SPIN_INIT;
static struct gg_shape shape_now;
static _Atomic int seen_batch;
static _Atomic uint64_t needed1[GG_MAX_DEVICES];
static _Atomic uint64_t flushes[GG_MAX_DEVICES]; /* in the step in progress */

/* ---- statistics ------------------------------------------------------------------ */

static void swap(double *a, double *b)
{
    double t = *a;
    *a = *b;
    *b = t;
}

/* The k-th smallest of v[0..n) (reorders v). */
static double select_kth(double *v, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        double pivot = v[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (v[i] < pivot)
                i++;
            while (v[j] > pivot)
                j--;
            if (i <= j)
                swap(&v[i++], &v[j--]);
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            return v[k];
    }
    return v[k];
}

static double median(double *v, int n)
{
    if (n <= 0)
        return 0;
    double m = select_kth(v, n, n / 2);
    if (n % 2)
        return m;
    return (m + select_kth(v, n, n / 2 - 1)) / 2;
}

void gg_steps_trend(const double *x, const double *y, int n, double *slope, double *intercept,
                    double *z)
{
    int m = 0;
    double s = 0;
    *slope = *intercept = *z = 0;
    if (n < 2)
        return;
    if (!gg_spin_trylock(&pairs_lock, 100000))
        return;
    /* Pairs of distinct x (any order: a series of steps, or of tokens);
     * Kendall's S counts the pairs that rise with x against those that
     * fall (over steps: the Mann-Kendall test). */
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double dx = x[j] - x[i], dy = y[j] - y[i];
            if (dx == 0)
                continue;
            pairs[m++] = dy / dx;
            s += ((dy > 0) - (dy < 0)) * (dx > 0 ? 1 : -1);
        }
    *slope = median(pairs, m);
    for (int i = 0; i < n; i++)
        pairs[i] = y[i] - *slope * x[i];
    *intercept = median(pairs, n);
    gg_spin_unlock(&pairs_lock);
    if (n >= 3) {
        double var = (double)n * (n - 1) * (2 * n + 5) / 18.0;
        *z = (s - (s > 0) + (s < 0)) / sqrt(var);
    }
}

/* The median absolute residual around the line: how far the points stray
 * from the trend (the noise a rise must clear). */
static double spread(const double *x, const double *y, int n, double slope, double intercept)
{
    double r[HIST];
    for (int i = 0; i < n; i++)
        r[i] = fabs(y[i] - (intercept + slope * x[i]));
    return median(r, n);
}

/* ---- the boundary ------------------------------------------------------------------ */

static void take_sites(int dev, struct steps *s)
{
    s->nbase = gg_sites_top(dev, s->base, SNAP_SITES);
}

/* The sites whose live bytes grew since the last reset, largest growth first. */
static void grown_sites(int dev, const struct steps *s, struct gg_step_verdict *out)
{
    struct gg_site_usage *now = gg_side_push(SNAP_SITES * sizeof *now); /* 6 KiB */
    out->nsites = 0;
    if (!now)
        return;
    size_t n = gg_sites_top(dev, now, SNAP_SITES);
    for (size_t i = 0; i < n; i++) {
        uint64_t before = 0;
        for (size_t k = 0; k < s->nbase; k++)
            if (s->base[k].site == now[i].site)
                before = s->base[k].bytes;
        if (now[i].bytes <= before)
            continue;
        struct gg_site_usage g = {now[i].site, now[i].bytes - before, now[i].allocs};
        /* insertion into the few largest */
        size_t at = out->nsites < GG_LEAK_SITES ? out->nsites : GG_LEAK_SITES;
        while (at > 0 && out->sites[at - 1].bytes < g.bytes) {
            if (at < GG_LEAK_SITES)
                out->sites[at] = out->sites[at - 1];
            at--;
        }
        if (at < GG_LEAK_SITES) {
            out->sites[at] = g;
            if (out->nsites < GG_LEAK_SITES)
                out->nsites++;
        }
    }
    gg_side_pop(now);
}


static bool moved(const struct gg_window *a, const struct gg_window *b, uint64_t step)
{
#define FAR(u, v) ((u) > (v) ? (u) - (v) > step : (v) - (u) > step)
    return FAR(a->peak, b->peak) || FAR(a->peak_used, b->peak_used) || FAR(a->live, b->live);
#undef FAR
}

/* The series the forecast follows: the tensors' need where the last step
 * told it (the steps that told it), else the device-wide peaks. */
static int need_series(const struct steps *s, double *x, double *y, bool *need)
{
    int n = 0;
    *need = s->n && s->p[s->n - 1].need >= 0;
    for (int i = 0; i < s->n; i++) {
        if (*need && s->p[i].need < 0)
            continue;
        x[n] = s->p[i].x;
        y[n++] = *need ? s->p[i].need : s->p[i].used;
    }
    return n;
}

static void forecast(const struct gg_device *d, const struct steps *s, uint64_t step,
                     struct gg_step_verdict *out)
{
    double x[HIST], y[HIST], slope, intercept, z;
    bool need;
    uint64_t line = gg_device_line(d);
    /* The line is on the device's used memory, so is the trend: the
     * step's device-wide need (context and other processes included). */
    int n = need_series(s, x, y, &need);
    if (n < FORECAST_MIN || !d->total || y[n - 1] > (double)line)
        return; /* too few steps, or in the zone: near misses already say it */
    gg_steps_trend(x, y, n, &slope, &intercept, &z);
    double rise = slope * (x[n - 1] - x[0]), noise = spread(x, y, n, slope, intercept);
    if (z < FORECAST_Z || slope <= 0 || rise <= 3 * noise)
        return;
    /* The line must still hold at this step: a run whose last step fell
     * well below it (a cache emptied, a shorter batch) is not on its way. */
    double fall = intercept + slope * x[n - 1] - y[n - 1];
    if (fall > fmax(3 * noise, (double)d->total / 1000))
        return;
    /* The step the line is crossed at: the next one for the peaks, which
     * hold all the device holds; within FORECAST_AHEAD steps for the
     * tensors' need, which the cache's own overhead (blocks that do not
     * fit the next request) lifts before it reaches the line: an OOM of
     * the layout comes first, and the trainer has steps to act. */
    for (int ahead = 1; ahead <= (need ? FORECAST_AHEAD : 1); ahead++) {
        double at = intercept + slope * (double)(step + (uint64_t)ahead);
        if (at <= (double)line)
            continue;
        out->forecast = true;
        out->fc_need = need;
        out->fc_step = step + (uint64_t)ahead;
        out->fc_bytes = at > 0 ? (uint64_t)at : 0;
        return;
    }
}

bool gg_steps_predict(const struct gg_device *d, int dev, uint64_t tokens, uint64_t *bytes,
                      bool *beyond, uint64_t *at_most)
{
    double x[HIST], y[HIST], slope, intercept, z, most = 0, least = 0;
    int n = 0, distinct = 0;
    if ((unsigned)dev >= GG_MAX_DEVICES || !d || !tokens)
        return false;
    struct steps *s = &st[dev];
    if (!gg_spin_trylock(&s->lock, 1000))
        return false;
    for (int i = 0; i < s->n; i++) {
        if (s->p[i].tokens <= 0 || s->p[i].need < 0)
            continue;
        bool seen = false;
        for (int k = 0; k < n && !seen; k++)
            seen = x[k] == s->p[i].tokens;
        distinct += !seen;
        x[n] = s->p[i].tokens;
        y[n++] = s->p[i].need;
        most = fmax(most, s->p[i].tokens);
        least = n == 1 ? s->p[i].tokens : fmin(least, s->p[i].tokens);
    }
    gg_spin_unlock(&s->lock);
    if (n < FORECAST_MIN || distinct < 3)
        return false;
    gg_steps_trend(x, y, n, &slope, &intercept, &z);
    /* The need must follow the tokens: a real rise with them, well out of
     * the noise around the line. */
    if (z < FORECAST_Z || slope <= 0 ||
        slope * (most - least) <= 3 * spread(x, y, n, slope, intercept))
        return false;
    double p = intercept + slope * (double)tokens, q = intercept + slope * most;
    *bytes = p > 0 ? (uint64_t)p : 0;
    *beyond = (double)tokens > most;
    if (at_most)
        *at_most = q > 0 ? (uint64_t)q : 0;
    return true;
}

/* Leaks: the trend of the live bytes at the boundaries says one is
 * suspected; out->leak when it is new, or its rate or top site changed
 * since it was said. */
/* A leak suspected, said or agreed on no more: the finder starts again. */
static void drop_suspicion(struct steps *s)
{
    s->suspected = s->said = false;
    s->agree = 0;
}

static void leak(const struct gg_device *d, int dev, struct steps *s, uint64_t step,
                 struct gg_step_verdict *out)
{
    double x[HIST], y[HIST], work[HIST], slope, intercept, z;
    /* The first boundaries' live bytes are the warm-up (caches, the
     * optimizer's state): not a trend. */
    uint64_t after = s->boundaries > LEAK_WARMUP ? s->boundaries - LEAK_WARMUP : 0;
    int n = (uint64_t)s->n < after ? s->n : (int)after, first = s->n - n;
    if (n < LEAK_MIN || !d->total || step < s->quiet_until) {
        s->suspected = false;
        return;
    }
    for (int i = 0; i < n; i++) {
        x[i] = s->p[first + i].x;
        y[i] = s->p[first + i].live;
        /* all the device holds at the step's peak but our live bytes: the
         * working set, the context, the other processes */
        work[i] = s->p[first + i].used - s->p[first + i].live;
    }
    gg_steps_trend(x, y, n, &slope, &intercept, &z);
    double rise = slope * (x[n - 1] - x[0]);
    double least = fmax(1 << 20, (double)d->total / 10000); /* 1 MiB a step, or 0.01% */
    if (z < LEAK_Z || slope < least || rise <= 6 * spread(x, y, n, slope, intercept)) {
        drop_suspicion(s);
        return;
    }
    if (++s->agree < LEAK_PERSIST)
        return;
    uint64_t rate = (uint64_t)slope;
    if (!s->suspected) {
        s->since = (uint64_t)x[0];
        s->last_check = 0;
    }
    /* The sites: looked at when it starts, then every RECHECK_SITES steps. */
    bool changed = !s->said;
    if (!s->suspected || step - s->last_check >= RECHECK_SITES) {
        grown_sites(dev, s, out);
        s->last_check = step;
        gg_site top = out->nsites ? out->sites[0].site : GG_SITE_NONE;
        changed = changed || top != s->top;
        s->top = top;
    }
    double ratio = s->said_trend ? (double)rate / (double)s->said_trend : 0;
    changed = changed || ratio < 0.75 || ratio > 1.25;
    s->suspected = true;
    s->trend_rate = rate;
    if (!changed)
        return;
    if (!out->nsites)
        grown_sites(dev, s, out);
    double ws = median(work, n);
    double left = (double)d->limit - (y[n - 1] + ws);
    out->leak = true;
    out->since_step = s->since;
    out->rate = rate;
    out->work = ws > 0 ? (uint64_t)ws : 0;
    out->projected_step = left <= 0 ? step : step + (uint64_t)ceil(left / slope);
}

void gg_steps_leak_said(int dev, uint64_t rate, uint64_t projected)
{
    if ((unsigned)dev >= GG_MAX_DEVICES || !gg_spin_trylock(&st[dev].lock, 1000))
        return;
    struct steps *s = &st[dev];
    s->said = true;
    s->said_trend = s->trend_rate;
    atomic_store_explicit(&s->now_leak_rate, rate, memory_order_relaxed);
    atomic_store_explicit(&s->now_leak_projected, projected, memory_order_relaxed);
    gg_spin_unlock(&s->lock);
}

void gg_steps_leak_cleared(int dev, uint64_t step)
{
    if ((unsigned)dev >= GG_MAX_DEVICES || !gg_spin_trylock(&st[dev].lock, 1000))
        return;
    struct steps *s = &st[dev];
    if (!s->quiet)
        s->quiet = LEAK_QUIET;
    s->quiet_until = step + s->quiet;
    s->quiet *= 2;
    drop_suspicion(s);
    atomic_store_explicit(&s->now_leak_rate, 0, memory_order_relaxed);
    atomic_store_explicit(&s->now_leak_projected, 0, memory_order_relaxed);
    gg_spin_unlock(&s->lock);
}

/* What gg_steps_now says of a device, as of this boundary. */
static void publish(struct steps *s, uint64_t step, const struct gg_step_verdict *out)
{
    atomic_store_explicit(&s->now_step, step, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->now_steps, 1, memory_order_relaxed);
    if (out->flushes)
        atomic_fetch_add_explicit(&s->now_flush_steps, 1, memory_order_relaxed);
    if (out->forecast) {
        atomic_store_explicit(&s->now_fc_step, out->fc_step, memory_order_relaxed);
        atomic_store_explicit(&s->now_fc_bytes, out->fc_bytes, memory_order_relaxed);
    }
    if (!s->suspected) { /* the leak said is over */
        atomic_store_explicit(&s->now_leak_rate, 0, memory_order_relaxed);
        atomic_store_explicit(&s->now_leak_projected, 0, memory_order_relaxed);
    }
}

void gg_steps_now(int dev, struct gg_steps_now *out)
{
    memset(out, 0, sizeof *out);
    if ((unsigned)dev >= GG_MAX_DEVICES)
        return;
    const struct steps *s = &st[dev];
    out->step = atomic_load_explicit(&s->now_step, memory_order_relaxed);
    out->steps = atomic_load_explicit(&s->now_steps, memory_order_relaxed);
    out->flush_steps = atomic_load_explicit(&s->now_flush_steps, memory_order_relaxed);
    out->fc_step = atomic_load_explicit(&s->now_fc_step, memory_order_relaxed);
    out->fc_bytes = atomic_load_explicit(&s->now_fc_bytes, memory_order_relaxed);
    out->leak_rate = atomic_load_explicit(&s->now_leak_rate, memory_order_relaxed);
    out->leak_projected = atomic_load_explicit(&s->now_leak_projected, memory_order_relaxed);
}

/* ---- the run's memory model --------------------------------------------------- */

#define MODEL_MIN 3           /* steps with a shape before a model is believed */
#define MODEL_X 1e3           /* tokens per unit of x (the sums stay well inside a double) */
#define MODEL_Y 1048576.0     /* bytes per unit of y */
#define MODEL_BEYOND 0.15     /* margin: the share of the growth predicted beyond the largest */

/* Least-squares sums of (x, y) over every step with a shape; under st[].lock. */
static struct model {
    double n, sx, sx2, sx3, sx4, sy, sxy, sx2y, syy, most;
    double xs[4];             /* the first distinct inputs, to know they vary */
    int distinct;
} models[GG_MAX_DEVICES];

static void model_add(struct model *m, double tokens, double bytes)
{
    double x = tokens / MODEL_X, y = bytes / MODEL_Y;
    m->n += 1;
    m->sx += x;
    m->sx2 += x * x;
    m->sx3 += x * x * x;
    m->sx4 += x * x * x * x;
    m->sy += y;
    m->sxy += x * y;
    m->sx2y += x * x * y;
    m->syy += y * y;
    m->most = fmax(m->most, tokens);
    bool seen = false;
    for (int i = 0; i < m->distinct && !seen; i++)
        seen = m->xs[i] == x;
    if (!seen && m->distinct < 4)
        m->xs[m->distinct++] = x;
}

static double det3(const double a[3][3])
{
    return a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) -
           a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0]) +
           a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]);
}

/* The last prediction asked per device, for the step in progress. */
static _Atomic uint64_t asked_tokens[GG_MAX_DEVICES], asked_bytes[GG_MAX_DEVICES];

void gg_steps_asked(int dev, uint64_t tokens, uint64_t bytes)
{
    if ((unsigned)dev >= GG_MAX_DEVICES)
        return;
    atomic_store_explicit(&asked_bytes[dev], bytes, memory_order_relaxed);
    atomic_store_explicit(&asked_tokens[dev], tokens, memory_order_relaxed);
}

bool gg_steps_model(int dev, uint64_t tokens, struct gg_steps_model *out)
{
    memset(out, 0, sizeof *out);
    if ((unsigned)dev >= GG_MAX_DEVICES || !gg_spin_trylock(&st[dev].lock, 1000))
        return false;
    struct model m = models[dev];
    gg_spin_unlock(&st[dev].lock);
    out->steps = (uint64_t)m.n;
    out->most_tokens = (uint64_t)m.most;
    if (m.n < MODEL_MIN || m.distinct < 2)
        return false;
    /* linear: y = a + b x */
    double dl = m.n * m.sx2 - m.sx * m.sx;
    if (dl <= 0)
        return false;
    double b = (m.n * m.sxy - m.sx * m.sy) / dl, a = (m.sy - b * m.sx) / m.n;
    double sse = fmax(m.syy - a * m.sy - b * m.sxy, 0), c = 0;
    int params = 2;
    /* quadratic: y = a + b x + c x^2, when it halves the residual, with a
     * rise (c > 0: attention without a fused kernel) */
    if (m.n >= 6 && m.distinct >= 4) {
        double A[3][3] = {{m.n, m.sx, m.sx2}, {m.sx, m.sx2, m.sx3}, {m.sx2, m.sx3, m.sx4}};
        double r[3] = {m.sy, m.sxy, m.sx2y}, D = det3(A), q[3];
        for (int k = 0; k < 3 && D != 0; k++) {
            double M[3][3];
            memcpy(M, A, sizeof M);
            for (int i = 0; i < 3; i++)
                M[i][k] = r[i];
            q[k] = det3(M) / D;
        }
        if (D != 0 && q[2] > 0) {
            double sq = fmax(m.syy - q[0] * m.sy - q[1] * m.sxy - q[2] * m.sx2y, 0);
            if (sq < 0.5 * sse) {
                a = q[0], b = q[1], c = q[2], sse = sq, params = 3;
                out->quadratic = true;
            }
        }
    }
    double x = (double)tokens / MODEL_X, y = a + b * x + c * x * x;
    double sigma = m.n > params ? sqrt(sse / (m.n - params)) : 0;
    double margin = 2 * sigma;
    out->beyond = (double)tokens > m.most;
    if (out->beyond) { /* the extrapolation: 15% of the growth beyond the largest seen */
        double xm = m.most / MODEL_X;
        margin += MODEL_BEYOND * fmax(y - (a + b * xm + c * xm * xm), 0);
    }
    out->bytes = y > 0 ? (uint64_t)(y * MODEL_Y) : 0;
    out->margin = (uint64_t)(margin * MODEL_Y);
    out->intercept = a * MODEL_Y;
    out->per_token = b * MODEL_Y / MODEL_X;
    out->per_token2 = c * MODEL_Y / (MODEL_X * MODEL_X);
    out->sigma = sigma * MODEL_Y;
    return true;
}

void gg_steps_boundary(struct gg_device *d, int dev, uint64_t step, bool do_forecast,
                       const struct gg_shape *input, struct gg_step_verdict *out)
{
    memset(out, 0, sizeof *out);
    gg_device_close_window(d, &out->w);
    if (input)
        out->input = *input;
    if ((unsigned)dev >= GG_MAX_DEVICES)
        return;
    uint64_t need1 = atomic_exchange_explicit(&needed1[dev], 0, memory_order_relaxed);
    out->has_needed = need1 != 0;
    out->needed = need1 ? need1 - 1 : 0;
    out->flushes = atomic_exchange_explicit(&flushes[dev], 0, memory_order_relaxed);
    uint64_t asked = atomic_exchange_explicit(&asked_tokens[dev], 0, memory_order_relaxed);
    if (asked && out->input.ndims && asked == out->input.tokens) {
        out->has_predicted = true;
        out->predicted = atomic_load_explicit(&asked_bytes[dev], memory_order_relaxed);
    }
    struct steps *s = &st[dev];
    /* A signal handler's boundary on this thread, or another thread's at
     * the same moment: this one is counted in the next window. */
    if (!gg_spin_trylock(&s->lock, 1000))
        return;
    uint64_t far = d->total / LINES_MOVED, now = gg_now_ns();
    out->journal = s->lines < LINES_ALWAYS || step % LINES_EVERY == 0 ||
                   moved(&out->w, &s->last, far) || now - s->line_ns >= LINES_NS;
    if (out->journal) {
        s->lines++;
        s->line_ns = now;
        s->last = out->w;
    }
    if (s->boundaries++ == 0)
        take_sites(dev, s);
    if (s->n == HIST) {
        memmove(s->p, s->p + 1, (HIST - 1) * sizeof *s->p);
        s->n--;
    }
    double others = (double)out->w.peak_used - (double)out->w.peak;
    s->p[s->n++] = (struct point){
        (double)step, (double)out->w.peak_used, (double)out->w.live,
        out->has_needed ? (double)out->needed + fmax(others, 0) : -1,
        out->input.ndims ? (double)out->input.tokens : 0};
    if (out->input.ndims && out->input.tokens)
        model_add(&models[dev], (double)out->input.tokens,
                  out->has_needed ? s->p[s->n - 1].need : (double)out->w.peak_used);
    if (do_forecast)
        forecast(d, s, step, out);
    leak(d, dev, s, step, out);
    publish(s, step, out);
    gg_spin_unlock(&s->lock);
}

/* ---- the step in progress ---------------------------------------------------------- */

void gg_steps_shape(const struct gg_shape *in)
{
    int b = gg_shape_batch(in);
    if (b > 0)
        atomic_store_explicit(&seen_batch, b, memory_order_relaxed);
    if (!gg_spin_trylock(&shape_lock, 1000))
        return;
    if (!shape_now.ndims || in->tokens > shape_now.tokens)
        shape_now = *in;
    gg_spin_unlock(&shape_lock);
}

static bool shape_read(struct gg_shape *out, bool take)
{
    if (!gg_spin_trylock(&shape_lock, 1000))
        return false;
    *out = shape_now;
    if (take)
        shape_now.ndims = 0;
    gg_spin_unlock(&shape_lock);
    return out->ndims > 0;
}

bool gg_steps_shape_now(struct gg_shape *out)
{
    return shape_read(out, false);
}

bool gg_steps_take_shape(struct gg_shape *out)
{
    return shape_read(out, true);
}

int gg_steps_seen_batch(void)
{
    return atomic_load_explicit(&seen_batch, memory_order_relaxed);
}

void gg_steps_needed(int dev, uint64_t bytes)
{
    if ((unsigned)dev < GG_MAX_DEVICES)
        atomic_store_explicit(&needed1[dev], bytes + 1, memory_order_relaxed);
}

void gg_steps_flushed(int dev)
{
    if ((unsigned)dev < GG_MAX_DEVICES)
        atomic_fetch_add_explicit(&flushes[dev], 1, memory_order_relaxed);
}

void gg_steps_reset(int dev)
{
    if ((unsigned)dev >= GG_MAX_DEVICES || !gg_spin_trylock(&st[dev].lock, 1000))
        return;
    st[dev].n = 0;
    st[dev].boundaries = 0;
    drop_suspicion(&st[dev]);
    st[dev].trend_rate = st[dev].said_trend = 0;
    st[dev].quiet_until = st[dev].quiet = 0;
    atomic_store_explicit(&st[dev].now_leak_rate, 0, memory_order_relaxed);
    atomic_store_explicit(&st[dev].now_leak_projected, 0, memory_order_relaxed);
    gg_spin_unlock(&st[dev].lock);
}

void gg_steps_after_fork(void)
{
    for (int i = 0; i < GG_MAX_DEVICES; i++)
        gg_spin_reset(&st[i].lock);
    gg_spin_reset(&pairs_lock);
    gg_spin_reset(&shape_lock);
}
