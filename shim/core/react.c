/* react.c - layer 4: verdicts become lines and advice (see react.h). */
#include "react.h"

#include <string.h>

#include "advice.h"
#include "backward.h"
#include "budget.h"
#include "device.h"
#include "events.h"
#include "prim.h"
#include "pyframes.h"
#include "retry.h"
#include "steps.h"
#include "torch.h"

/* ---- the timeline ------------------------------------------------------------- */

/* `sample` lines: the process's use each time it moved by 1% of the device,
 * written by the timeline's tick (life.c's thread, every GG_TICK_NS), never
 * on the allocation path: per device and tick at most the highest and the
 * lowest moves since the last tick and where it is now, so memory that
 * oscillates across a sample step writes a few lines a second, not two per
 * allocation. Without the thread, the same is written inline, at most once
 * a tick. */
static _Atomic bool ticking;
static gg_spin timeline_lock = GG_SPIN_INIT;
static uint64_t written[GG_MAX_DEVICES]; /* `current` at the last sample line */
static uint64_t written_ns[GG_MAX_DEVICES]; /* ... and its moment */
static _Atomic uint64_t last_inline_ns;

/* A point of the timeline, when it happened: lines carry that moment, and
 * are flushed before the trainer's lines (steps, batches, notes: never on an
 * allocation's path), so the phases they close hold their own samples. */
struct point { uint64_t bytes, ns; bool set; };

static void sample_line(int dev, const struct gg_device *d, const struct point *p)
{
    uint64_t step = d->total / 100, last = written[dev];
    if (!p->set || (p->bytes <= last + step && p->bytes + step >= last))
        return; /* not a move from the last line */
    int64_t used = (int64_t)p->bytes + atomic_load_explicit(&d->used_offset, memory_order_relaxed);
    /* An extreme's moment is stored just after its value: one read between
     * the two may be a hair old. Lines never go back in time. */
    uint64_t ns = p->ns > written_ns[dev] ? p->ns : written_ns[dev];
    gg_events_sample(dev, p->bytes, used > 0 ? (uint64_t)used : 0, gg_clock_at(ns));
    written[dev] = p->bytes;
    written_ns[dev] = ns;
}

static void timeline(int dev, struct gg_device *d)
{
    uint64_t hi = atomic_exchange_explicit(&d->sample_high, 0, memory_order_relaxed);
    uint64_t lo_inv = atomic_exchange_explicit(&d->sample_low_inv, 0, memory_order_relaxed);
    struct point p[3] = {
        {hi, atomic_load_explicit(&d->sample_high_ns, memory_order_relaxed), hi != 0},
        {~lo_inv, atomic_load_explicit(&d->sample_low_ns, memory_order_relaxed), lo_inv != 0},
        {atomic_load_explicit(&d->current, memory_order_relaxed), gg_now_ns(), true}};
    if (p[1].set && p[0].set && p[1].ns < p[0].ns) { /* the low came first */
        struct point t = p[0];
        p[0] = p[1];
        p[1] = t;
    }
    for (int i = 0; i < 3; i++)
        sample_line(dev, d, &p[i]);
}

static void timeline_all(void)
{
    if (!gg_spin_trylock(&timeline_lock, 0))
        return; /* the tick is writing them */
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_device *d = gg_device(i);
        if (d)
            timeline(i, d);
    }
    gg_spin_unlock(&timeline_lock);
}

void gg_react_flush(void)
{
    timeline_all();
}

void gg_react_ticking(bool on)
{
    atomic_store(&ticking, on);
}

/* The peak and its sites, written as the peak grows (an eighth more, or 2%
 * of the device, whichever is less; 16 MiB at least) by the tick: what a
 * process killed before its summary leaves of its peak. */
#define PEAK_LINE_MIN (16ull << 20)
static void peak_lines(void)
{
    static uint64_t said[GG_MAX_DEVICES];
    for (int i = 0; i < gg_device_count && i < GG_MAX_DEVICES; i++) {
        struct gg_device *d = gg_device(i);
        if (!d || !gg_device_in_use(d, i))
            continue;
        uint64_t peak = gg_device_peak(d), last = said[i];
        uint64_t more = last / 8 < d->total / 50 ? last / 8 : d->total / 50;
        if (more < PEAK_LINE_MIN)
            more = PEAK_LINE_MIN;
        if (peak < last + more)
            continue;
        struct gg_steps_now now;
        gg_steps_now(i, &now);
        said[i] = peak;
        gg_events_peak(i, peak, gg_device_peak_used(d), now.steps ? now.step + 2 : 0);
    }
}

void gg_react_tick(bool report_suppressed, bool with_stacks)
{
    static uint64_t base[GG_EVENTS];
    if (with_stacks)
        gg_react_settle(GG_RETRY_STALE_NS); /* failures no retry followed */
    timeline_all();
    if (with_stacks)
        peak_lines();
    if (report_suppressed)
        (void)gg_events_suppressed(base);
}

static void sample(const struct gg_verdict *v)
{
    if (!v->sample || atomic_load_explicit(&ticking, memory_order_relaxed))
        return;
    uint64_t now = gg_now_ns(), last = atomic_load_explicit(&last_inline_ns, memory_order_relaxed);
    if (now - last >= GG_TICK_NS &&
        atomic_compare_exchange_strong_explicit(&last_inline_ns, &last, now,
                                                memory_order_relaxed, memory_order_relaxed))
        timeline_all();
}

/* ---- advice --------------------------------------------------------------------- */

/* Advice lines per device and reason are thinned like incidents (budget.h),
 * counted afresh for each advised batch: a retry loop of refusals asking
 * for the same batch again and again writes a few lines; every new batch
 * is news. The signal goes out every time. */
static struct {
    _Atomic int batch;
    _Atomic uint64_t count;
} advice_seen[GG_MAX_DEVICES][GG_REASON_FORECAST + 1];

static bool advice_line(const struct gg_advice *a, enum gg_reason why)
{
    if ((unsigned)a->dev >= GG_MAX_DEVICES || (unsigned)why > GG_REASON_FORECAST)
        return true;
    __typeof__(advice_seen[0][0]) *s = &advice_seen[a->dev][why];
    if (atomic_exchange_explicit(&s->batch, a->batch_size, memory_order_relaxed) != a->batch_size)
        atomic_store_explicit(&s->count, 0, memory_order_relaxed);
    uint64_t n = atomic_fetch_add_explicit(&s->count, 1, memory_order_relaxed) + 1;
    if (gg_budget_thin(n))
        return true;
    gg_events_suppress(GG_EVENT_advice);
    return false;
}

/* An advice's number and its line go together, so the journal has them in
 * order whatever the threads do; the signal goes after the line. */
static gg_spin advice_order = GG_SPIN_INIT;

/* Every advice given, per device and cause, thinned lines or not (the
 * metrics' counter). */
static _Atomic uint64_t advised[GG_MAX_DEVICES][GG_REASON_FORECAST + 1];

uint64_t gg_react_advised(int dev, int why)
{
    if ((unsigned)dev >= GG_MAX_DEVICES || (unsigned)why > GG_REASON_FORECAST)
        return 0;
    return atomic_load_explicit(&advised[dev][why], memory_order_relaxed);
}

/* Advice no trainer could hear (none registered, no handler for the
 * signal), per device: journaled (heard: false), not counted as given. */
static _Atomic uint64_t unheard[GG_MAX_DEVICES];

uint64_t gg_react_unheard(int dev)
{
    return (unsigned)dev < GG_MAX_DEVICES ? atomic_load_explicit(&unheard[dev], memory_order_relaxed)
                                          : 0;
}

static void advise(int dev, enum gg_reason why, const struct gg_step_verdict *fc)
{
    const struct gg_policy *p = gg_device_policy(dev);
    /* The batch to halve: the trainer's (gpuguard_set_batch), else the one
     * the script is seen to run (its step input's batch dimension), else
     * the policy's. */
    /* Heard: a trainer registered (it polls, or its helper does), or the
     * signal reaches a handler. */
    bool handled = gg_advice_handled(p->s.signal);
    bool heard = handled || gg_advice_registered();
    struct gg_trainer_policy tp = {p->s.batch_size, p->s.grad_accum, p->s.min_batch_size,
                                   p->s.signal, gg_steps_seen_batch(), heard};
    struct gg_advice a;
    bool ordered = gg_spin_trylock(&advice_order, 1000000); /* else unordered, never stuck */
    bool raised = gg_advice_raise(dev, why, &tp, &a);
    bool signaled = raised && handled;
    if (raised && (unsigned)dev < GG_MAX_DEVICES)
        atomic_fetch_add_explicit(heard ? &advised[dev][why] : &unheard[dev], 1,
                                  memory_order_relaxed);
    if (raised && advice_line(&a, why))
        gg_events_advice(&a, signaled, heard, fc);
    if (ordered)
        gg_spin_unlock(&advice_order);
    if (signaled)
        gg_advice_signal(tp.signal);
}

void gg_react_python(void)
{
    const char *why = gg_py_take_error();
    if (why)
        gg_events_error("no Python frames in stacks from now on: %s", why);
}

static const enum gg_reason incident_reason[] = {
    [GG_INCIDENT_NEAR_MISS] = GG_REASON_NEAR_MISS, [GG_INCIDENT_REFUSED] = GG_REASON_REFUSED,
    [GG_INCIDENT_OOM] = GG_REASON_OOM};
static const enum gg_event incident_event[] = {
    [GG_INCIDENT_NEAR_MISS] = GG_EVENT_near_miss, [GG_INCIDENT_REFUSED] = GG_EVENT_refused,
    [GG_INCIDENT_OOM] = GG_EVENT_oom};

/* The moment's facts of an incident on call c: the process's bytes on the
 * device now, the step in progress and its input. */
static void facts_now(const struct gg_call *c, struct gg_episode *e)
{
    const struct gg_device *d = gg_device(c->dev);
    struct gg_steps_now now;
    e->ns = gg_now_ns();
    if (d) {
        uint64_t cur = atomic_load(&d->current), pr = atomic_load(&d->pool_reserved),
                 pu = atomic_load(&d->pool_used);
        e->reserved = cur;
        e->allocated = cur - pr + pu;
    }
    gg_steps_now(c->dev, &now);
    e->step1 = now.steps ? now.step + 2 : 0;
    if (!gg_steps_shape_now(&e->input))
        e->input.ndims = 0;
}

/* An incident's line, its advice and PyTorch's view. A failure is said
 * once its outcome is known (retry.h): recovered (a flush the program
 * never saw, counted as such) or not. */
static void say(const struct gg_episode *e, bool failure)
{
    const struct gg_call *c = &e->call;
    const struct gg_verdict *v = &e->verdict;
    struct gg_incident_facts f = {
        .ns = e->ns, .reserved = e->reserved, .allocated = e->allocated, .step1 = e->step1,
        .input = e->input.ndims ? &e->input : NULL, .failure = failure,
        .recovered = e->retried == GG_RETRY_UNKNOWN ? -1 : e->retried == GG_RETRY_RECOVERED,
        .retried = e->retried == GG_RETRY_RECOVERED || e->retried == GG_RETRY_RAISED,
        .freed = e->freed, .freed_count = e->freed_count, .freed_largest = e->freed_largest};
    struct gg_device *d = gg_device(c->dev);
    bool line = v->journal;
    if (failure && e->retried == GG_RETRY_RECOVERED && d) {
        atomic_fetch_add(v->incident == GG_INCIDENT_OOM ? &d->ooms_recovered
                                                        : &d->refusals_recovered, 1);
        gg_steps_flushed(c->dev);
    } else if (failure && (unsigned)c->dev < GG_MAX_DEVICES) {
        /* A failure that reached the program (the one that may end the
         * run) is not lost among the recovered ones of its site: these are
         * thinned by their own count on the device. */
        static _Atomic uint64_t reached[GG_MAX_DEVICES];
        line = gg_budget_thin(atomic_fetch_add(&reached[c->dev], 1) + 1);
    }
    if (line) {
        gg_backward_flush(); /* the .backward() running now, if its line was left out */
        gg_events_incident(c, v, &f); /* the timeline stays the tick's: not on this path */
    } else {
        gg_events_suppress(incident_event[v->incident]);
    }
    if (!failure)
        advise(c->dev, incident_reason[v->incident], NULL); /* a failure's: at its call */
    /* PyTorch's view, asked for: of a near miss, and of a failure that
     * reached the program (its OOM observer answers too); a recovered one's
     * facts are the line's, its view a later moment's */
    gg_torch_incident(c->dev, v->incident, c->bytes, !failure || e->retried != GG_RETRY_RECOVERED);
}

GG_COLD void gg_react(const struct gg_call *c, const struct gg_verdict *v)
{
    struct gg_episode e;
    gg_react_python();
    if (v->settle && gg_retry_allocated(c, &e)) /* this thread's failure: its retry or not */
        say(&e, true);
    if (v->incident == GG_INCIDENT_NEAR_MISS) {
        memset(&e, 0, sizeof e);
        e.call = *c;
        e.verdict = *v;
        facts_now(c, &e);
        say(&e, false);
    } else if (v->incident != GG_INCIDENT_NONE) {
        struct gg_episode now;
        bool retry, opened;
        memset(&now, 0, sizeof now);
        now.call = *c;
        now.verdict = *v;
        facts_now(c, &now);
        bool closed = gg_retry_failed(&now, &retry, &opened, &e);
        /* The advice is the failure's own moment's (the trainer may poll
         * right after it); its line waits for the outcome. A retry is the
         * same request: advised once. */
        if (!retry)
            advise(c->dev, incident_reason[v->incident], NULL);
        if (closed)
            say(&e, true); /* a failed retry, or an episode this failure closed */
    }
    sample(v);
}

GG_COLD void gg_react_mapped(void)
{
    struct gg_episode e;
    if (gg_retry_mapped(&e))
        say(&e, true);
}

GG_COLD void gg_react_free(const struct gg_verdict *v)
{
    if (v->freed)
        gg_retry_freed(v->freed);
    sample(v);
}

void gg_react_settle(uint64_t max_ns)
{
    struct gg_episode e;
    uint64_t now = gg_now_ns();
    for (int n = 0; n < 64 && gg_retry_stale(now, max_ns, &e); n++)
        say(&e, true);
}

void gg_react_step(int dev, uint64_t step, const struct gg_step_verdict *v)
{
    timeline_all();
    if (v->journal)
        gg_events_step(dev, step, v);
    if (v->forecast) {
        advise(dev, GG_REASON_FORECAST, v);
        gg_torch_forecast(dev, v->fc_step); /* PyTorch's history for the step it names */
    }
    /* A leak suspected from the live bytes: checked by PyTorch's history
     * where it can be (the tensors one step kept: torch.h), else said as it
     * is (confirmed false). */
    if (v->leak && !gg_torch_leak(dev, step, v)) {
        gg_events_leak(dev, step, v);
        gg_steps_leak_said(dev, v->rate, v->projected_step);
    }
}

void gg_react_shape_forecast(int dev, uint64_t step, uint64_t bytes)
{
    struct gg_step_verdict v;
    memset(&v, 0, sizeof v);
    v.forecast = v.fc_need = true;
    v.fc_step = step;
    v.fc_bytes = bytes;
    advise(dev, GG_REASON_FORECAST, &v);
    gg_torch_forecast(dev, step);
}

void gg_react_registered(uint64_t switched)
{
    for (int i = 0; i < 64; i++)
        if (switched & (1ull << i))
            gg_events_mode(i, "enforce", "trainer registered");
}
