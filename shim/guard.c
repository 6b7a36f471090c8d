/* guard.c - layer 4: the decisions (see guard.h). */
#include "guard.h"

#include <string.h>

#include "budget.h"
#include "device.h"
#include "maps.h"
#include "prim.h"
#include "stack.h"

/* In the near-miss band a reading re-anchors the estimate at most this
 * often (a refusal always takes one). */
#define BAND_READING_NS 1000000000ull

static inline uint64_t add_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static inline bool want_stack(const struct gg_device *d, bool incident)
{
    return d->stacks == GG_STACKS_ALL || (incident && d->stacks == GG_STACKS_NEAR_MISS);
}

static inline void capture(const struct gg_device *d, struct gg_call *c)
{
    c->site = gg_stack_capture(c->dev, d->depth);
}

static inline void clear(struct gg_verdict *v)
{
    v->incident = GG_INCIDENT_NONE;
    v->journal = false;
    v->over_limit = false;
    v->sample = false;
}

/* The process's use moved by 1% of the device since the last move: kept
 * for the timeline (its extremes, which the timeline's tick writes, off
 * this path: react.c); one thread takes it, the others carry on. */
static GG_COLD void sample_moved(struct gg_device *d, uint64_t cur, struct gg_verdict *v)
{
    uint64_t now = gg_now_ns();
    if (gg_atomic_max(&d->sample_high, cur))
        atomic_store_explicit(&d->sample_high_ns, now, memory_order_relaxed);
    if (gg_atomic_max(&d->sample_low_inv, ~cur))
        atomic_store_explicit(&d->sample_low_ns, now, memory_order_relaxed);
    v->sample = true;
}

static inline void sample_check(struct gg_device *d, uint64_t cur, struct gg_verdict *v)
{
    uint64_t step = d->total / 100;
    uint64_t last = atomic_load_explicit(&d->sample_current, memory_order_relaxed);
    uint64_t moved = cur > last ? cur - last : last - cur;
    v->current = cur;
    if (gg_likely(moved <= step) || !step)
        return;
    if (atomic_compare_exchange_strong_explicit(&d->sample_current, &last, cur,
                                                memory_order_relaxed, memory_order_relaxed))
        sample_moved(d, cur, v);
}

/* ---- the first reading -------------------------------------------------------- */

/* Before a device's first decision the estimate knows nothing of other
 * processes or the context: read the device. */
static GG_COLD void first_reading(struct gg_device *d, const struct gg_call *c)
{
    (void)gg_device_refresh(d, c->dev, c->runtime);
    /* No reading possible (no context, no retain): the estimate it is; do
     * not ask again on every call. */
    atomic_store_explicit(&d->read_once, true, memory_order_release);
}

/* ---- incidents per site --------------------------------------------------------- */

/* A hot loop in the near-miss zone, or a retry loop of refusals, must not
 * flood the journal: per call site the first 8 incidents of a kind are
 * written, then the 16th, 32nd, 64th... each with its running count
 * (budget.h). The counts live in the site table, exact for any number of
 * sites; incidents without a stack share one count per device and kind. */
static _Atomic uint64_t no_site[GG_MAX_DEVICES][GG_SITE_EVENTS];

static uint64_t incident_count(gg_site site, int dev, enum gg_incident kind)
{
    unsigned k = (unsigned)kind - GG_INCIDENT_NEAR_MISS;
    if (site != GG_SITE_NONE)
        return gg_sites_count_event(site, k);
    if ((unsigned)dev >= GG_MAX_DEVICES || k >= GG_SITE_EVENTS)
        return 1;
    return atomic_fetch_add_explicit(&no_site[dev][k], 1, memory_order_relaxed) + 1;
}

static void incident(struct gg_call *c, struct gg_verdict *v, enum gg_incident kind)
{
    uint64_t n = incident_count(c->site, c->dev, kind);
    v->incident = kind;
    v->count = n;
    v->journal = gg_budget_thin(n);
}

/* ---- the peak ------------------------------------------------------------------ */

/* Which sites held the memory when each device's peak was set: taken again at
 * every new peak (only while the process grows), off the common path. */
#define PEAK_SITES 32
static struct {
    gg_spin lock;
    uint64_t peak;
    size_t n;
    struct gg_site_usage top[PEAK_SITES];
} peak_snap[GG_MAX_DEVICES];

static GG_COLD void new_peak(struct gg_device *d, struct gg_call *c, uint64_t peak)
{
    if (c->site == GG_SITE_NONE)
        capture(d, c);
    atomic_store_explicit(&d->peak_site, c->site, memory_order_relaxed);
    /* A thread interrupted by a signal while it holds this lock must not
     * make the handler wait for it: the next peak takes the snapshot. */
    if (!gg_spin_trylock(&peak_snap[c->dev].lock, 0))
        return;
    if (peak >= peak_snap[c->dev].peak) {
        peak_snap[c->dev].peak = peak;
        peak_snap[c->dev].n = gg_sites_top(c->dev, peak_snap[c->dev].top, PEAK_SITES);
    }
    gg_spin_unlock(&peak_snap[c->dev].lock);
}

size_t gg_guard_peak_sites(int dev, struct gg_site_usage *out, size_t max)
{
    if ((unsigned)dev >= GG_MAX_DEVICES || !gg_spin_trylock(&peak_snap[dev].lock, 1000))
        return 0;
    size_t n = peak_snap[dev].n < max ? peak_snap[dev].n : max;
    memcpy(out, peak_snap[dev].top, n * sizeof *out);
    gg_spin_unlock(&peak_snap[dev].lock);
    return n;
}

/* ---- the hooks' questions --------------------------------------------------------- */

bool gg_guard_admit(struct gg_call *c, struct gg_verdict *v)
{
    struct gg_device *d = gg_device(c->dev);
    clear(v);
    c->site = GG_SITE_NONE;
    if (!d || d->mode == GG_MODE_OFF)
        return true;
    if (gg_unlikely(!atomic_load_explicit(&d->read_once, memory_order_acquire)))
        first_reading(d, c);
    if (want_stack(d, false))
        capture(d, c);
    if (!atomic_load_explicit(&d->enforcing, memory_order_relaxed) ||
        c->refusable == GG_REFUSABLE_NEVER ||
        (c->refusable == GG_REFUSABLE_UNDER_ALL && d->enforce != GG_ENFORCE_ALL))
        return true;
    if (gg_likely(add_sat(gg_device_estimate(d), c->bytes) <= d->limit))
        return true; /* the estimate says it fits: no reading */
    uint64_t used = gg_device_refresh(d, c->dev, c->runtime);
    if (add_sat(used, c->bytes) <= d->limit)
        return true;
    atomic_fetch_add_explicit(&d->refusals, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        capture(d, c);
    incident(c, v, GG_INCIDENT_REFUSED);
    v->used = used;
    return false;
}

static GG_COLD void near_miss(struct gg_device *d, struct gg_call *c, uint64_t used,
                              struct gg_verdict *v)
{
    uint64_t last = atomic_load_explicit(&d->last_reading_ns, memory_order_relaxed);
    if (gg_now_ns() - last > BAND_READING_NS)
        used = gg_device_refresh(d, c->dev, false);
    if (add_sat(used, d->near) <= d->limit)
        return;
    atomic_fetch_add_explicit(&d->near_misses, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        capture(d, c);
    incident(c, v, GG_INCIDENT_NEAR_MISS);
    v->used = used;
    v->over_limit = used > d->limit;
}

/* Bytes no longer held: the device's and the site's. */
static inline uint64_t account_free(struct gg_device *d, const struct gg_entry *e)
{
    if (e->site != GG_SITE_NONE)
        gg_sites_charge(e->site, -(int64_t)e->size, -1);
    return atomic_fetch_sub_explicit(&d->current, e->size, memory_order_relaxed) - e->size;
}

static GG_COLD void evicted(const struct gg_entry *old)
{
    struct gg_device *o = gg_device(old->dev);
    if (o)
        (void)account_free(o, old);
}

void gg_guard_allocated(struct gg_call *c, uintptr_t key, struct gg_verdict *v)
{
    struct gg_device *d = gg_device(c->dev);
    if (!d || d->mode == GG_MODE_OFF || !key)
        return;
    struct gg_entry e = {.key = key, .size = c->bytes, .site = c->site, .dev = (uint8_t)c->dev,
                         .api = c->api};
    struct gg_entry old;
    enum gg_ledger_add r = gg_ledger_add(&e, &old);
    if (gg_unlikely(r != GG_LEDGER_ADDED)) {
        if (r == GG_LEDGER_FULL)
            return; /* not counted; the ledger's pages could not grow */
        evicted(&old);
    }
    uint64_t cur = atomic_fetch_add_explicit(&d->current, c->bytes, memory_order_relaxed) + c->bytes;
    bool peak = gg_atomic_max(&d->window_peak, cur) &&
                cur > atomic_load_explicit(&d->peak_before, memory_order_relaxed);
    if (c->site != GG_SITE_NONE)
        gg_sites_charge(c->site, (int64_t)c->bytes, 1);
    uint64_t used = add_sat(cur, (uint64_t)atomic_load_explicit(&d->used_offset,
                                                                 memory_order_relaxed));
    gg_atomic_max(&d->window_used, used);
    if (gg_unlikely(add_sat(used, d->near) > d->limit))
        near_miss(d, c, used, v);
    if (gg_unlikely(peak) && d->stacks != GG_STACKS_OFF)
        new_peak(d, c, cur);
    sample_check(d, cur, v);
}

void gg_guard_failed(struct gg_call *c, bool oom, struct gg_verdict *v)
{
    struct gg_device *d = gg_device(c->dev);
    if (!d || d->mode == GG_MODE_OFF || !oom)
        return;
    atomic_fetch_add_explicit(&d->ooms, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        capture(d, c);
    incident(c, v, GG_INCIDENT_OOM);
    v->used = gg_device_refresh(d, c->dev, false);
}

bool gg_guard_release(uintptr_t key, struct gg_entry *out, uint32_t *ticket,
                      struct gg_verdict *v)
{
    clear(v);
    if (!key || !gg_ledger_remove(key, out, ticket))
        return false;
    struct gg_device *d = gg_device(out->dev);
    if (d)
        sample_check(d, account_free(d, out), v);
    return true;
}

void gg_guard_unrelease(const struct gg_entry *e, uint32_t ticket)
{
    struct gg_device *d = gg_device(e->dev);
    if (!gg_ledger_restore(e, ticket) || !d)
        return;
    atomic_fetch_add_explicit(&d->current, e->size, memory_order_relaxed);
    if (e->site != GG_SITE_NONE)
        gg_sites_charge(e->site, (int64_t)e->size, 1);
}

bool gg_guard_unknown_free(uintptr_t key, int dev)
{
    static _Atomic bool said;
    struct gg_device *d = gg_device(dev);
    gg_ledger_unknown_freed(key);
    if (d)
        atomic_fetch_add_explicit(&d->unknown_frees, 1, memory_order_relaxed);
    return !atomic_exchange(&said, true);
}

/* ---- VMM ---------------------------------------------------------------------------- */

void gg_guard_mapped(uintptr_t va, uint64_t size, uintptr_t key)
{
    struct gg_entry e, gone;
    struct gg_mapping m = {va, size, key}, old;
    bool had_old;
    if (!gg_ledger_find(key, &e) || !gg_maps_add(&m, &old, &had_old))
        return; /* a handle the guard does not count */
    gg_ledger_map(key, +1, &gone);
    if (had_old && gg_ledger_map(old.key, -1, &gone))
        evicted(&gone);
}

void gg_guard_unmapped(uintptr_t va, uint64_t size, struct gg_verdict *v)
{
    struct gg_mapping m;
    struct gg_entry gone;
    clear(v);
    /* An unmap may cover several mappings, back to back. */
    for (uint64_t done = 0; done < size && gg_maps_take(va + done, &m); done += m.size) {
        struct gg_device *d;
        if (gg_ledger_map(m.key, -1, &gone) && (d = gg_device(gone.dev)))
            sample_check(d, account_free(d, &gone), v);
        if (!m.size)
            break;
    }
}

bool gg_guard_release_handle(uintptr_t key, struct gg_verdict *v)
{
    struct gg_entry e;
    clear(v);
    switch (gg_ledger_release(key, &e)) {
    case GG_LEDGER_GONE: {
        struct gg_device *d = gg_device(e.dev);
        if (d)
            sample_check(d, account_free(d, &e), v);
        return true;
    }
    case GG_LEDGER_KEPT: /* still mapped: the memory lives until the unmap */
        return true;
    default:
        return false;
    }
}

/* ---- what the process sees -------------------------------------------------------- */

void gg_guard_meminfo(int dev, size_t *free_b, size_t *total_b)
{
    struct gg_device *d = gg_device(dev);
    /* Only an enforcing device moves the line: observe changes nothing the
     * process sees. */
    if (!d || !atomic_load_explicit(&d->enforcing, memory_order_relaxed) ||
        !d->virtualize_meminfo || !free_b || !total_b || *total_b < *free_b)
        return;
    uint64_t used = *total_b - *free_b;
    *total_b = d->limit;
    *free_b = d->limit > used ? d->limit - used : 0;
}

uint64_t gg_guard_trainer_registered(void)
{
    uint64_t switched = 0;
    for (int i = 0; i < gg_device_count; i++) {
        struct gg_device *d = gg_device(i);
        bool no = false;
        if (d && d->mode == GG_MODE_AUTO &&
            atomic_compare_exchange_strong(&d->enforcing, &no, true))
            switched |= 1ull << i;
    }
    return switched;
}

void gg_guard_after_fork(void)
{
    for (int i = 0; i < GG_MAX_DEVICES; i++)
        gg_spin_reset(&peak_snap[i].lock);
}
