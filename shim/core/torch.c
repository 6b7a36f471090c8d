/* torch.c - layer 4: PyTorch's view, asked for and journaled (see torch.h). */
#include "torch.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "events.h"
#include "guard.h"
#include "prim.h"
#include "pycall.h"
#include "steps.h"

/* What is wanted of a device, by kind; the order the callbacks go in. */
enum kind { K_FORECAST, K_NEAR, K_REFUSED, K_OOM, K_LEAK, K_KINDS };
static const char *const kind_name[K_KINDS] = {"forecast", "near_miss", "refused", "oom", "leak"};

static struct want {
    _Atomic uint32_t kinds;            /* a bit per kind */
    _Atomic uint64_t bytes[K_KINDS];   /* the request, per kind (0: none) */
    _Atomic uint64_t step2[K_KINDS];   /* the step in progress + 1 when asked (0: none) */
    _Atomic uint64_t ns[K_KINDS];      /* the moment asked about */
} wants[GG_MAX_DEVICES];

static _Atomic(gpuguard_torch_fn) callback;
static _Atomic bool scheduled;          /* a pending call is queued */
static _Atomic unsigned next_seq;

/* Steps: the last boundary's step + 2 (0: none yet), and an epoch that
 * moves at every boundary, for "the first near miss of a step". */
static _Atomic uint64_t last_step2;
static _Atomic uint64_t epoch = 1;
static _Atomic uint64_t near_asked[GG_MAX_DEVICES];  /* the epoch whose first near miss asked */
static _Atomic uint32_t last_failure[GG_MAX_DEVICES]; /* kind + 1 of the device's last failure */

/* PyTorch's allocation history: wanted on until the boundary of step
 * history_until; what the instrumentation was last told. A forecast that
 * names a step further ahead turns it on at the boundary before that step
 * (history_from: the step; 0: none waiting). */
static _Atomic bool history_want, history_told;
static _Atomic uint64_t history_until, history_from;

/* A leak's survivors: the boundary (step + 1; 0: none) at which a device's
 * leak view is due, once history (on for the step after the leak was said)
 * is off again: the blocks that still carry their Python stacks then are
 * that step's tensors that outlived the next. */
static _Atomic uint64_t leak_due1[GG_MAX_DEVICES];

/* The last view's reserved-but-unallocated bytes and largest free block,
 * + 1 (0: no view yet), for the metrics. */
static _Atomic uint64_t last_unallocated1[GG_MAX_DEVICES], last_largest1[GG_MAX_DEVICES];

/* The requests handed out lately, for their answers. */
#define ISSUED 16
static struct issued {
    unsigned seq;
    int dev;
    uint8_t kind;
    uint64_t bytes, step2, ns;
} issued[ISSUED];

/* A suspected leak waiting for its check (leak_due1), per device: what the
 * steps found, said as a leak once the check confirms it. */
static struct gg_step_verdict suspect[GG_MAX_DEVICES];
static uint64_t suspect_step[GG_MAX_DEVICES];
static _Atomic bool checking[GG_MAX_DEVICES]; /* from the check's start to its answer */

/* The step a forecast's view was last asked for, per device (+ 1). */
static _Atomic uint64_t forecast_viewed1[GG_MAX_DEVICES];
static gg_spin issued_lock = GG_SPIN_INIT;

static int kind_of_incident(int incident)
{
    switch (incident) {
    case GG_INCIDENT_NEAR_MISS: return K_NEAR;
    case GG_INCIDENT_REFUSED: return K_REFUSED;
    case GG_INCIDENT_OOM: return K_OOM;
    default: return -1;
    }
}

static void schedule(void)
{
    if (atomic_exchange(&scheduled, true))
        return; /* one queued already: it takes everything wanted when it runs */
    if (!gg_pycall_add(gg_torch_pending, NULL))
        atomic_store(&scheduled, false);
}

static void want(int dev, int kind, uint64_t bytes)
{
    struct want *w = &wants[dev];
    atomic_store_explicit(&w->bytes[kind], bytes, memory_order_relaxed);
    atomic_store_explicit(&w->step2[kind], atomic_load(&last_step2), memory_order_relaxed);
    atomic_store_explicit(&w->ns[kind], gg_now_ns(), memory_order_relaxed);
    atomic_fetch_or(&w->kinds, 1u << kind); /* release: the fields above go with it */
    schedule();
}

/* A forked child: a lock a parent thread held is free, and no call is
 * queued in the child's interpreter on the shim's behalf that it knows of. */
static void child_after_fork(void)
{
    gg_spin_reset(&issued_lock);
    atomic_store(&scheduled, false);
}

bool gg_torch_attach(gpuguard_torch_fn fn)
{
    static _Atomic bool fork_handler;
    if (!fn)
        return false;
    if (!atomic_exchange(&fork_handler, true))
        pthread_atfork(NULL, NULL, child_after_fork);
    bool can_ask = gg_pycall_open();
    atomic_store(&callback, fn);
    return can_ask;
}

void gg_torch_detach(void)
{
    gg_pycall_close(); /* no call is queued after this */
    atomic_store(&callback, NULL);
}

#ifdef GG_TESTING
bool gg_torch_attached(void)
{
    return atomic_load_explicit(&callback, memory_order_relaxed) != NULL;
}
#endif

void gg_torch_incident(int dev, int incident, uint64_t bytes, bool ask)
{
    int kind = kind_of_incident(incident);
    if ((unsigned)dev >= GG_MAX_DEVICES || kind < 0)
        return;
    if (kind != K_NEAR)
        atomic_store_explicit(&last_failure[dev], (uint32_t)kind + 1, memory_order_relaxed);
    if (!ask || !atomic_load_explicit(&callback, memory_order_relaxed))
        return;
    if (kind == K_NEAR) { /* the first of the step only */
        uint64_t now = atomic_load(&epoch), was = atomic_load(&near_asked[dev]);
        if (was == now || !atomic_compare_exchange_strong(&near_asked[dev], &was, now))
            return;
    }
    want(dev, kind, bytes);
}

void gg_torch_boundary(uint64_t step)
{
    atomic_store(&last_step2, step + 2);
    atomic_fetch_add(&epoch, 1);
    if (atomic_load(&history_want) && step >= atomic_load(&history_until)) {
        atomic_store(&history_want, false);
        if (atomic_load(&history_told) && atomic_load_explicit(&callback, memory_order_relaxed))
            schedule();
    }
    uint64_t from = atomic_load(&history_from);
    if (from && step + 1 >= from && atomic_compare_exchange_strong(&history_from, &from, 0) &&
        atomic_load_explicit(&callback, memory_order_relaxed)) {
        gg_atomic_max(&history_until, from);
        atomic_store(&history_want, true); /* on for the step the forecast named */
        schedule();
    }
    if (atomic_load(&history_want) || !atomic_load_explicit(&callback, memory_order_relaxed))
        return; /* a leak's view waits for history to be off */
    for (int dev = 0; dev < GG_MAX_DEVICES; dev++) {
        uint64_t due1 = atomic_load_explicit(&leak_due1[dev], memory_order_relaxed);
        if (due1 && step + 1 >= due1 && atomic_compare_exchange_strong(&leak_due1[dev], &due1, 0))
            want(dev, K_LEAK, 0);
    }
}

void gg_torch_forecast(int dev, uint64_t fc_step)
{
    if ((unsigned)dev >= GG_MAX_DEVICES || !atomic_load(&callback))
        return;
    uint64_t s2 = atomic_load(&last_step2), next = s2 ? s2 - 1 : 1; /* the step in progress */
    if (fc_step <= next) {
        gg_atomic_max(&history_until, fc_step);
        atomic_store(&history_want, true);
    } else { /* on at the boundary before the step it names */
        uint64_t none = 0;
        if (!atomic_compare_exchange_strong(&history_from, &none, fc_step) && fc_step < none)
            atomic_store(&history_from, fc_step);
    }
    if (atomic_exchange(&forecast_viewed1[dev], fc_step + 1) != fc_step + 1)
        want(dev, K_FORECAST, 0); /* once per step named */
}

/* Can a suspected leak be checked (the instrumentation attached, the
 * interpreter can be asked)? */
static bool can_check(void)
{
    return atomic_load(&callback) && gg_pycall_is_open();
}

bool gg_torch_leak(int dev, uint64_t step, const struct gg_step_verdict *v)
{
    uint64_t none = 0;
    if ((unsigned)dev >= GG_MAX_DEVICES || !can_check())
        return false;
    if (atomic_exchange(&checking[dev], true))
        return true; /* one at a time per device: this suspicion waits for its answer */
    if (!atomic_compare_exchange_strong(&leak_due1[dev], &none, step + 2 + 1)) {
        atomic_store(&checking[dev], false);
        return true;
    }
    suspect[dev] = *v; /* read when the check answers (this device's due view) */
    suspect_step[dev] = step;
    gg_atomic_max(&history_until, step + 1);
    atomic_store(&history_want, true);
    schedule(); /* history on now, for step + 1 */
    return true;
}

/* A leak check's answer: the tensors one step allocated that the next did
 * not free (those with a Python stack), `kept` bytes of them; confirmed,
 * the suspicion is a leak at that rate, said; cleared, it is not. */
static void leak_checked(int dev, uint64_t step, bool checked, uint64_t kept)
{
    struct gg_step_verdict *v = &suspect[dev];
    const struct gg_device *d = gg_device(dev);
    atomic_store(&checking[dev], false);
    uint64_t least = d && d->total / 10000 > (1u << 20) ? d->total / 10000 : 1u << 20;
    if (checked && kept < least) {
        gg_steps_leak_cleared(dev, step);
        return;
    }
    if (checked) { /* the rate is what one step kept */
        v->live_rate = v->rate;
        v->rate = kept;
        v->confirmed = true;
        double left = d ? (double)d->limit - (double)(v->w.live + v->work) : 0;
        v->projected_step = left <= 0 ? step : step + (uint64_t)(left / (double)kept) + 1;
    }
    gg_events_leak(dev, step, v);
    gg_steps_leak_said(dev, v->rate, v->projected_step);
}

bool gg_torch_last_view(int dev, uint64_t *unallocated, uint64_t *largest_free)
{
    if ((unsigned)dev >= GG_MAX_DEVICES)
        return false;
    uint64_t u = atomic_load_explicit(&last_unallocated1[dev], memory_order_relaxed),
             l = atomic_load_explicit(&last_largest1[dev], memory_order_relaxed);
    if (!u || !l)
        return false;
    *unallocated = u - 1;
    *largest_free = l - 1;
    return true;
}

bool gg_torch_step(uint64_t *step)
{
    uint64_t s2 = atomic_load_explicit(&last_step2, memory_order_relaxed);
    if (!s2)
        return false;
    *step = s2 - 1;
    return true;
}

/* ---- the call in the main thread ------------------------------------------------- */

/* One call of the instrumentation's callback; false when it handed back an
 * exception a signal handler raised (now the program's to see). */
/* What a signal handler raised while the callback worked (the main thread
 * only, inside gg_torch_pending). */
static GG_TLS bool in_pending;
static GG_TLS void *raised;

void gg_torch_raise(void *exc)
{
    if (in_pending && !raised && gg_pycall_keep(exc))
        raised = exc;
}

static bool call(gpuguard_torch_fn fn, int dev, int kind, int history)
{
    struct gpuguard_torch_request r;
    memset(&r, 0, sizeof r);
    r.seq = atomic_fetch_add(&next_seq, 1) + 1;
    if (!r.seq)
        r.seq = atomic_fetch_add(&next_seq, 1) + 1; /* 0 means unasked */
    r.dev = dev;
    r.history = history;
    if (kind >= 0) {
        struct want *w = &wants[dev];
        snprintf(r.why, sizeof r.why, "%s", kind_name[kind]);
        r.request = atomic_load_explicit(&w->bytes[kind], memory_order_relaxed);
        if (gg_spin_trylock(&issued_lock, 100000)) {
            issued[r.seq % ISSUED] = (struct issued){
                r.seq, dev, (uint8_t)kind, r.request,
                atomic_load_explicit(&w->step2[kind], memory_order_relaxed),
                atomic_load_explicit(&w->ns[kind], memory_order_relaxed)};
            gg_spin_unlock(&issued_lock);
        }
    }
    fn(&r);
    return !raised;
}

/* The history change due now: +1 on, -1 off, 0 none. */
static int history_change(void)
{
    bool w = atomic_load(&history_want);
    if (w == atomic_load(&history_told))
        return 0;
    atomic_store(&history_told, w);
    return w ? 1 : -1;
}

int gg_torch_pending(void *arg)
{
    (void)arg;
    atomic_store(&scheduled, false); /* what is wanted from here on asks again */
    gpuguard_torch_fn fn = atomic_load(&callback);
    if (!fn)
        return 0;
    struct { uint8_t dev, kind; } todo[GG_MAX_DEVICES * K_KINDS];
    int n = 0;
    for (int dev = 0; dev < GG_MAX_DEVICES; dev++) {
        uint32_t kinds = atomic_exchange(&wants[dev].kinds, 0);
        for (int k = 0; kinds && k < K_KINDS; k++)
            if (kinds & (1u << k))
                todo[n++] = (__typeof__(todo[0])){(uint8_t)dev, (uint8_t)k};
    }
    /* The process's signals wait in this thread while the views are read:
     * a handler then runs in the program's own code once this returns, and
     * its exception (a KeyboardInterrupt, a SystemExit) is the program's,
     * as without gpuguard. One delivered to another thread meanwhile runs
     * its handler here all the same (Python runs handlers in the main
     * thread): the instrumentation hands back what that raised, the rest of
     * the views are dropped, and it is raised into the program from here. */
    sigset_t all, old;
    sigfillset(&all);
    static const int synchronous[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT};
    for (size_t k = 0; k < GG_COUNT(synchronous); k++)
        sigdelset(&all, synchronous[k]);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    in_pending = true;
    raised = NULL;
    /* History goes on before the first view (a forecast's view sees it on)
     * and off after the last (a near miss at the end of the step keeps its
     * tensors). */
    int history = history_change();
    bool ok = true;
    if (!n && history)
        ok = call(fn, -1, -1, history);
    for (int i = 0; ok && i < n; i++) {
        int h = (history > 0 && i == 0) || (history < 0 && i == n - 1) ? history : 0;
        ok = call(fn, todo[i].dev, todo[i].kind, h);
    }
    in_pending = false;
    void *exc = raised;
    raised = NULL;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    /* -1 with the exception set: raised into the program where the pending
     * call ran; otherwise never an exception */
    return ok || !gg_pycall_raise(exc) ? 0 : -1;
}

/* ---- the answer -------------------------------------------------------------------- */

static int kind_of_name(const char *why, size_t cap)
{
    for (int k = 0; k < K_KINDS; k++)
        if (strncmp(why, kind_name[k], cap) == 0)
            return k;
    return -1;
}

/* What the device has free outside PyTorch's cache: up to the line the
 * guard refuses at when it enforces, up to the device's memory when not. */
static uint64_t free_outside(int dev)
{
    const struct gg_device *d = gg_device(dev);
    if (!d || !d->total)
        return 0;
    uint64_t line = atomic_load(&d->enforcing) ? d->limit : d->total, used = gg_device_estimate(d);
    return line > used ? line - used : 0;
}

void gg_torch_answer(const struct gpuguard_torch_view *v)
{
    if (!v || (unsigned)v->dev >= GG_MAX_DEVICES)
        return;
    struct gg_torch_event e;
    memset(&e, 0, sizeof e);
    e.dev = v->dev;
    int kind = kind_of_name(v->why, sizeof v->why);
    uint64_t step2 = 0, asked_bytes = 0, asked_ns = 0;
    bool found = false;
    if (v->seq && gg_spin_trylock(&issued_lock, 100000)) {
        const struct issued *is = &issued[v->seq % ISSUED];
        if (is->seq == v->seq && is->dev == v->dev) {
            found = true;
            step2 = is->step2;
            asked_bytes = is->bytes;
            asked_ns = is->ns;
            if (kind < 0)
                kind = is->kind;
        }
        gg_spin_unlock(&issued_lock);
    }
    if (!found)
        step2 = atomic_load(&last_step2);
    if (!v->seq) {
        /* Unasked: PyTorch's OOM observer. A refusal of the guard's, or the
         * real allocator's failure: the device's last one says which. */
        uint32_t last = atomic_load_explicit(&last_failure[v->dev], memory_order_relaxed);
        if (kind < 0)
            kind = last ? (int)last - 1 : K_OOM;
        if (kind == K_REFUSED || kind == K_OOM) /* the request it settles */
            atomic_fetch_and(&wants[v->dev].kinds, ~((1u << K_REFUSED) | (1u << K_OOM)));
    }
    if (kind < 0)
        return; /* an answer to nothing we know */
    e.why = kind_name[kind];
    e.raised = !v->seq && (kind == K_REFUSED || kind == K_OOM);
    e.has_step = step2 != 0;
    e.step = step2 ? step2 - 1 : 0;
    e.reserved = v->reserved;
    e.allocated = v->allocated;
    e.largest_free = v->largest_free;
    e.inactive_split = v->inactive_split;
    e.request = v->request ? v->request : asked_bytes;
    e.has_request = e.request != 0;
    e.fits = -1;
    e.asked_ns = asked_ns;
    uint64_t unallocated = v->reserved > v->allocated ? v->reserved - v->allocated : 0;
    /* Whether the request would have fit an unfragmented cache is a fact
     * of the moment it was made: only the OOM observer's view is of it
     * (PyTorch raising, its cache emptied, the retry failed); a view read
     * later, at the main thread's next safe point, is of another moment. */
    if (e.has_request && e.raised)
        e.fits = e.request > v->largest_free && e.request <= unallocated + free_outside(v->dev);
    e.segments[0] = v->seg_small;
    e.segments[1] = v->seg_large;
    e.segments[2] = v->seg_huge;
    e.segments[3] = v->seg_expandable;
    e.history = v->history == 1;
    if (e.history) {
        e.ntensors = v->tensors && v->ntensors > 0 ? v->ntensors : 0;
        if (e.ntensors > GG_TORCH_TENSORS)
            e.ntensors = GG_TORCH_TENSORS;
        e.tensors = v->tensors;
    }
    uint64_t kept = 0;
    if (kind == K_LEAK && e.history) { /* the blocks that kept their Python stacks */
        for (int i = 0; i < e.ntensors; i++)
            if (e.tensors[i].nframes > 0)
                kept += e.tensors[i].bytes;
        e.has_kept = true;
        e.kept = kept;
    }
    gg_events_torch(&e);
    if (kind == K_LEAK && found)
        leak_checked(v->dev, e.step, e.history, kept);
    atomic_store_explicit(&last_unallocated1[v->dev], unallocated + 1, memory_order_relaxed);
    atomic_store_explicit(&last_largest1[v->dev], v->largest_free + 1, memory_order_relaxed);
}

#ifdef GG_TESTING
void gg_torch_reset(void)
{
    for (int i = 0; i < GG_MAX_DEVICES; i++) {
        atomic_store(&wants[i].kinds, 0);
        atomic_store(&near_asked[i], 0);
        atomic_store(&last_failure[i], 0);
        atomic_store(&leak_due1[i], 0);
        atomic_store(&last_unallocated1[i], 0);
        atomic_store(&last_largest1[i], 0);
        atomic_store(&forecast_viewed1[i], 0);
        atomic_store(&checking[i], false);
    }
    atomic_store(&callback, NULL);
    atomic_store(&scheduled, false);
    atomic_store(&last_step2, 0);
    atomic_store(&epoch, 1);
    atomic_store(&history_want, false);
    atomic_store(&history_told, false);
    atomic_store(&history_until, 0);
    atomic_store(&history_from, 0);
    gg_spin_reset(&issued_lock);
    memset(issued, 0, sizeof issued);
}
#endif
