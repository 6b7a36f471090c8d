/* steps.c - layer 4: forecasts and leaks from the trainer's steps (see
 * steps.h). */
#include "steps.h"

#include <math.h>
#include <string.h>

#include "prim.h"

#define HIST GG_STEPS_HISTORY
#define FORECAST_MIN 5       /* step peaks before a trend is believed */
#define FORECAST_Z 2.0       /* Mann-Kendall z of a rise that is real (one-sided p < 0.025) */
#define LEAK_WARMUP 3        /* boundaries after a (re)start whose live bytes are not used */
#define LEAK_MIN 12          /* live readings before a leak is believed */
#define LEAK_Z 4.0           /* ... and a stricter test: a leak is a strong word */
#define LEAK_PERSIST 3       /* boundaries in a row that must agree before it is said */
#define LINES_ALWAYS 100     /* every step line for the first steps of a device ... */
#define LINES_EVERY 100      /* ... then every 100th, */
#define LINES_MOVED 20       /* ... and whenever a value moved by 1/20 of the device */
#define SNAP_SITES 256       /* sites compared for a leak's growth */
#define RECHECK_SITES 16     /* while leaking, its sites are looked at again this often */

struct point {
    double x, used, live; /* step, its device-wide peak, live bytes at its end */
};

static struct steps {
    gg_spin lock;
    struct point p[HIST];     /* oldest first */
    int n;
    uint64_t boundaries;      /* since the last reset */
    uint64_t lines;           /* step lines written, ever */
    struct gg_window last;    /* as last written */
    /* the leak being reported */
    bool leaking;
    int agree;                /* boundaries in a row whose live bytes said "leak" */
    uint64_t since, rate, last_check;
    gg_site top;              /* its largest site as last reported */
    struct gg_site_usage base[SNAP_SITES]; /* the sites at the last reset */
    size_t nbase;
    /* what gg_steps_now reads: written under the lock, read without it */
    _Atomic uint64_t now_step, now_fc_step, now_fc_bytes, now_leak_rate, now_leak_projected;
} st[GG_MAX_DEVICES];

static double pairs[HIST * (HIST - 1) / 2]; /* under a device's lock: one boundary at a time */
static gg_spin pairs_lock = GG_SPIN_INIT;

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
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double dx = x[j] - x[i], dy = y[j] - y[i];
            if (dx > 0)
                pairs[m++] = dy / dx;
            s += (dy > 0) - (dy < 0);
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

static void forecast(const struct gg_device *d, const struct steps *s, uint64_t step,
                     struct gg_step_verdict *out)
{
    double x[HIST], y[HIST], slope, intercept, z;
    uint64_t line = d->limit > d->near ? d->limit - d->near : 0;
    /* The line is on the device's used memory, so is the trend: the
     * step's device-wide peak (context and other processes included). */
    if (s->n < FORECAST_MIN || !d->total || out->w.peak_used > line)
        return; /* too few steps, or in the zone: near misses already say it */
    for (int i = 0; i < s->n; i++) {
        x[i] = s->p[i].x;
        y[i] = s->p[i].used;
    }
    gg_steps_trend(x, y, s->n, &slope, &intercept, &z);
    double rise = slope * (x[s->n - 1] - x[0]), noise = spread(x, y, s->n, slope, intercept);
    if (z < FORECAST_Z || slope <= 0 || rise <= 3 * noise)
        return;
    /* The line must still hold at this step: a run whose last step fell
     * well below it (a cache emptied, a shorter batch) is not on its way. */
    double fall = intercept + slope * x[s->n - 1] - y[s->n - 1];
    if (fall > fmax(3 * noise, (double)d->total / 1000))
        return;
    double next = intercept + slope * (double)(step + 1);
    if (next <= (double)line)
        return;
    out->forecast = true;
    out->fc_step = step + 1;
    out->fc_bytes = next > 0 ? (uint64_t)next : 0;
}

static void leak(const struct gg_device *d, int dev, struct steps *s, uint64_t step,
                 struct gg_step_verdict *out)
{
    double x[HIST], y[HIST], work[HIST], slope, intercept, z;
    /* The first boundaries' live bytes are the warm-up (caches, the
     * optimizer's state): not a trend. */
    uint64_t after = s->boundaries > LEAK_WARMUP ? s->boundaries - LEAK_WARMUP : 0;
    int n = (uint64_t)s->n < after ? s->n : (int)after, first = s->n - n;
    if (n < LEAK_MIN || !d->total) {
        s->leaking = false;
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
        s->leaking = false;
        s->agree = 0;
        return;
    }
    if (++s->agree < LEAK_PERSIST)
        return;
    uint64_t rate = (uint64_t)slope;
    if (!s->leaking) {
        s->since = (uint64_t)x[0];
        s->last_check = 0;
    }
    /* The sites: looked at when it starts, then every RECHECK_SITES steps. */
    bool changed = !s->leaking;
    if (!s->leaking || step - s->last_check >= RECHECK_SITES) {
        grown_sites(dev, s, out);
        s->last_check = step;
        gg_site top = out->nsites ? out->sites[0].site : GG_SITE_NONE;
        changed = changed || top != s->top;
        s->top = top;
    }
    double ratio = s->rate ? (double)rate / (double)s->rate : 0;
    changed = changed || ratio < 0.75 || ratio > 1.25;
    s->leaking = true;
    if (!changed)
        return;
    s->rate = rate;
    if (!out->nsites)
        grown_sites(dev, s, out);
    double ws = median(work, n);
    double left = (double)d->limit - (y[n - 1] + ws);
    out->leak = true;
    out->since_step = s->since;
    out->rate = rate;
    out->projected_step = left <= 0 ? step : step + (uint64_t)ceil(left / slope);
}

/* What gg_steps_now says of a device, as of this boundary. */
static void publish(struct steps *s, uint64_t step, const struct gg_step_verdict *out)
{
    atomic_store_explicit(&s->now_step, step, memory_order_relaxed);
    if (out->forecast) {
        atomic_store_explicit(&s->now_fc_step, out->fc_step, memory_order_relaxed);
        atomic_store_explicit(&s->now_fc_bytes, out->fc_bytes, memory_order_relaxed);
    }
    if (out->leak)
        atomic_store_explicit(&s->now_leak_projected, out->projected_step, memory_order_relaxed);
    atomic_store_explicit(&s->now_leak_rate, s->leaking ? s->rate : 0, memory_order_relaxed);
    if (!s->leaking)
        atomic_store_explicit(&s->now_leak_projected, 0, memory_order_relaxed);
}

void gg_steps_now(int dev, struct gg_steps_now *out)
{
    memset(out, 0, sizeof *out);
    if ((unsigned)dev >= GG_MAX_DEVICES)
        return;
    const struct steps *s = &st[dev];
    out->step = atomic_load_explicit(&s->now_step, memory_order_relaxed);
    out->fc_step = atomic_load_explicit(&s->now_fc_step, memory_order_relaxed);
    out->fc_bytes = atomic_load_explicit(&s->now_fc_bytes, memory_order_relaxed);
    out->leak_rate = atomic_load_explicit(&s->now_leak_rate, memory_order_relaxed);
    out->leak_projected = atomic_load_explicit(&s->now_leak_projected, memory_order_relaxed);
}

void gg_steps_boundary(struct gg_device *d, int dev, uint64_t step, bool do_forecast,
                       struct gg_step_verdict *out)
{
    memset(out, 0, sizeof *out);
    gg_device_close_window(d, &out->w);
    if ((unsigned)dev >= GG_MAX_DEVICES)
        return;
    struct steps *s = &st[dev];
    /* A signal handler's boundary on this thread, or another thread's at
     * the same moment: this one is counted in the next window. */
    if (!gg_spin_trylock(&s->lock, 1000))
        return;
    uint64_t far = d->total / LINES_MOVED;
    out->journal = s->lines < LINES_ALWAYS || step % LINES_EVERY == 0 ||
                   moved(&out->w, &s->last, far);
    if (out->journal) {
        s->lines++;
        s->last = out->w;
    }
    if (s->boundaries++ == 0)
        take_sites(dev, s);
    if (s->n == HIST) {
        memmove(s->p, s->p + 1, (HIST - 1) * sizeof *s->p);
        s->n--;
    }
    s->p[s->n++] = (struct point){(double)step, (double)out->w.peak_used, (double)out->w.live};
    if (do_forecast)
        forecast(d, s, step, out);
    leak(d, dev, s, step, out);
    publish(s, step, out);
    gg_spin_unlock(&s->lock);
}

void gg_steps_reset(int dev)
{
    if ((unsigned)dev >= GG_MAX_DEVICES || !gg_spin_trylock(&st[dev].lock, 1000))
        return;
    st[dev].n = 0;
    st[dev].boundaries = 0;
    st[dev].leaking = false;
    st[dev].agree = 0;
    st[dev].rate = 0;
    atomic_store_explicit(&st[dev].now_leak_rate, 0, memory_order_relaxed);
    atomic_store_explicit(&st[dev].now_leak_projected, 0, memory_order_relaxed);
    gg_spin_unlock(&st[dev].lock);
}

void gg_steps_after_fork(void)
{
    for (int i = 0; i < GG_MAX_DEVICES; i++)
        gg_spin_reset(&st[i].lock);
    gg_spin_reset(&pairs_lock);
}
