/* guard.c - layer 4: the decisions (see guard.h). */
#include "guard.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include "budget.h"
#include "callers.h"
#include "device.h"
#include "driver.h"
#include "maps.h"
#include "pools.h"
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

GG_TLS bool gg_guard_retrying;
GG_TLS int gg_guard_retry_dev;
GG_TLS uint64_t gg_guard_retry_bytes;
GG_TLS const char *gg_guard_retry_api;

static inline void clear(struct gg_verdict *v)
{
    v->peers = 0;
    v->incident = GG_INCIDENT_NONE;
    v->journal = false;
    v->over_limit = false;
    v->spared = false;
    v->sample = false;
    v->retry = false;
    v->settle = false;
    v->freed = 0;
}

/* Is this failure the retry of this thread's failed request (the same
 * request, after its caller freed what it could)? Then it is that request
 * still, not another failure to count. */
static inline bool is_retry(const struct gg_call *c)
{
    return gg_unlikely(gg_guard_retrying) &&
           gg_guard_same_request(gg_guard_retry_dev, gg_guard_retry_bytes, gg_guard_retry_api, c);
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
    uint64_t step = d->sample_step;
    uint64_t last = atomic_load_explicit(&d->sample_current, memory_order_relaxed);
    uint64_t moved = cur > last ? cur - last : last - cur;
    v->current = cur;
    if (gg_likely(moved <= step) || !step)
        return;
    if (atomic_compare_exchange_strong_explicit(&d->sample_current, &last, cur,
                                                memory_order_relaxed, memory_order_relaxed))
        sample_moved(d, cur, v);
}

/* ---- pools ---------------------------------------------------------------------- */

/* A pool on device dev reserves delta bytes more (or fewer): the device's
 * view of the process moves with it. */
static void pool_moved(int dev, int64_t delta, struct gg_verdict *v)
{
    struct gg_device *d = gg_device(dev);
    if (!d || !delta)
        return;
    uint64_t r = atomic_fetch_add_explicit(&d->pool_reserved, (uint64_t)delta,
                                           memory_order_relaxed) + (uint64_t)delta;
    uint64_t cur = atomic_fetch_add_explicit(&d->current, (uint64_t)delta,
                                             memory_order_relaxed) + (uint64_t)delta;
    gg_peers_publish(&d->peers, cur);
    if (delta > 0) {
        gg_atomic_max(&d->peak_pool_reserved, r);
        gg_atomic_max(&d->window_peak, cur);
    }
    if (v)
        sample_check(d, cur, v);
}

/* What the driver says the pool in slot s holds now, believed (real CUDA
 * reserves in its own granularity); *used: what it says is handed out. */
static bool pool_reading(unsigned s, struct gg_verdict *v, uint64_t *used)
{
    struct gg_pool_figures f;
    uint64_t reserved, u;
    if (!gg_pools_figures(s, &f) || f.host || f.destroyed ||
        !gg_driver_pool_bytes(f.handle, &reserved, &u))
        return false;
    pool_moved(f.dev, gg_pools_observed(s, reserved), v);
    if (used)
        *used = u;
    return true;
}

/* Every pool of device dev, as the driver sees it: before a reading of the
 * device, so the process's share and the rest are apart again whatever the
 * shim did not see release pool memory. */
static void pools_read(int dev)
{
    struct gg_pool_figures f;
    for (unsigned s = gg_pools_next(GG_POOL_NONE); s != GG_POOL_NONE; s = gg_pools_next(s))
        if (gg_pools_figures(s, &f) && f.dev == dev)
            (void)pool_reading(s, NULL, NULL);
}

static uint64_t reading(struct gg_device *d, int dev, bool may_retain)
{
    if (atomic_load_explicit(&d->pool_reserved, memory_order_relaxed))
        pools_read(dev);
    return gg_device_refresh(d, dev, may_retain);
}

/* ---- the first reading -------------------------------------------------------- */

/* Before a device's first decision the estimate knows nothing of other
 * processes or the context: read the device. */
static GG_COLD void first_reading(struct gg_device *d, const struct gg_call *c)
{
    (void)reading(d, c->dev, c->runtime);
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

/* Past the line, and enforcing: may the module that asked be refused? Not
 * one that cannot survive a failed allocation ([memory] never_refuse, under
 * enforce = runtime). Asked only here, where a refusal would happen. */
static GG_COLD bool spared(const struct gg_device *d, const struct gg_call *c)
{
    char module[64];
    if (d->enforce == GG_ENFORCE_ALL || !d->never_refuse || !d->never_refuse[0])
        return false;
    return gg_callers_module(c->caller, module, sizeof module) &&
           gg_globs_match(d->never_refuse, module);
}

/* A pool's request would be refused: what does the pool hold free, as the
 * driver says? A request it can serve from that grows nothing. */
static GG_COLD void pool_recheck(struct gg_call *c)
{
    uint64_t used = 0;
    if (!pool_reading(c->pool, NULL, &used))
        return;
    uint64_t grows = gg_pools_growth(c->pool, c->bytes);
    struct gg_pool_figures f;
    /* The driver may count more as handed out than was asked (its rounding). */
    if (gg_pools_figures(c->pool, &f) && used > f.used) {
        uint64_t free_b = f.reserved > used ? f.reserved - used : 0;
        if (c->bytes > free_b && c->bytes - free_b > grows)
            grows = c->bytes - free_b;
    }
    c->grows = grows;
}

static GG_COLD void refuse(struct gg_device *d, struct gg_call *c, struct gg_verdict *v,
                           uint64_t used)
{
    if (is_retry(c)) { /* refused again: the same request */
        v->incident = GG_INCIDENT_REFUSED;
        v->retry = true;
        v->used = used;
        return;
    }
    atomic_fetch_add_explicit(&d->refusals, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        capture(d, c);
    incident(c, v, GG_INCIDENT_REFUSED);
    v->used = used;
}

/* ---- a GPU shared with this user's other guarded processes (peers.h) ----------------- */

/* How long a request waits for others deciding at the same moment, at most. */
#define SHARED_WAIT_NS 20000000ull

static void nap_ns(uint64_t ns)
{
    struct timespec ts = {0, (long)ns};
    nanosleep(&ts, NULL);
}

/* A short wait of its own length, so that two processes backing off at the
 * same moment do not come back at the same moment. */
static uint64_t backoff_ns(void)
{
    static GG_TLS uint64_t seed;
    if (!seed)
        seed = gg_mix64(gg_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)&seed) | 1;
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return 10000 + seed % 40000; /* 10-50 us */
}

/* The claim down to what the process holds and has in flight, with
 * `slack` (a refusal's or a back-off's, or memory given back). */
static void shared_settle(struct gg_device *d, uint64_t slack)
{
    uint64_t k = gg_peers_claim(&d->peers);
    uint64_t want = add_sat(add_sat(atomic_load_explicit(&d->current, memory_order_relaxed),
                                    gg_peers_pending(&d->peers, 0)), slack);
    gg_peers_lower(&d->peers, k, want);
}

/* Memory given back: a claim far above what is held goes down, so that
 * the others may have it. */
static inline void shared_freed(struct gg_device *d, uint64_t cur)
{
    struct gg_peer_slot *self = d->peers.self;
    if (gg_likely(!self))
        return;
    atomic_store_explicit(&self->cur, cur, memory_order_relaxed);
    /* device sizes: no overflow */
    if (gg_unlikely(atomic_load_explicit(&self->claim, memory_order_relaxed) >
                    cur + 4 * d->claim_slack))
        shared_settle(d, d->claim_slack);
}

/* A request that went past the claim is decided: it no longer waits. */
static GG_COLD void decided(struct gg_device *d, struct gg_call *c)
{
    if (d)
        gg_peers_pending(&d->peers, -(int64_t)c->pended);
    c->pended = 0;
}

/* Others deciding at the same moment: the first (no member before it in
 * the ledger is deciding) waits, its request still published, until the
 * others have stepped back; the others step back (their request and claim
 * withdrawn) and wait until no member before them is deciding. False once
 * SHARED_WAIT_NS have passed since the first wait: then everything counts. */
static bool shared_wait(struct gg_device *d, struct gg_call *c, bool first, uint64_t *deadline)
{
    uint64_t now = gg_now_ns();
    if (!*deadline)
        *deadline = now + SHARED_WAIT_NS;
    if (now >= *deadline)
        return false;
    if (!first) {
        decided(d, c);
        shared_settle(d, 0);
    }
    for (;;) {
        struct gg_peers_sum s;
        nap_ns(backoff_ns());
        gg_peers_sum(&d->peers, &s);
        if ((first ? !s.pending : s.first) || gg_now_ns() >= *deadline)
            return true;
    }
}

/* A request past the process's claim on a shared GPU. The claim is raised
 * first (published: sequentially consistent), then the others are summed:
 * of two processes deciding at the same moment at least one sees the
 * other's claim. Near the line the device is read; what the others hold is
 * in the reading, what they have claimed beyond it is added. When it does
 * not fit and others are deciding too, the one whose slot comes first goes
 * on and the others step back and try again (at most SHARED_WAIT_NS), so
 * that one of them gets it rather than none. Observing, or a request that
 * may not be refused: the claim is raised and the request let through. */
static GG_COLD bool shared_admit(struct gg_device *d, struct gg_call *c, uint64_t need,
                                 struct gg_verdict *v)
{
    struct gg_peers *p = &d->peers;
    bool may_refuse = atomic_load_explicit(&d->enforcing, memory_order_relaxed) &&
                      c->refusable != GG_REFUSABLE_NEVER;
    uint64_t deadline = 0;
    for (;;) {
        uint64_t cur = atomic_load_explicit(&d->current, memory_order_relaxed);
        if (!c->pended) {
            if (add_sat(cur, need) <= gg_peers_claim(p))
                return true; /* another thread raised it meanwhile */
            gg_peers_pending(p, (int64_t)need);
            c->pended = need;
        }
        uint64_t exact = add_sat(cur, gg_peers_pending(p, 0));
        gg_peers_raise(p, add_sat(exact, d->claim_slack)); /* the intent, published */
        struct gg_peers_sum s;
        gg_device_peers(d, &s);
        if (!may_refuse)
            return true;
        uint64_t claim = gg_peers_claim(p), mine = claim > cur ? claim - cur : 0;
        uint64_t used = add_sat(gg_device_estimate(d), s.extra);
        if (add_sat(add_sat(used, mine), d->near) > d->limit) {
            /* near the line: the device's own word (the others' held bytes
             * are in it, their claims beyond them are not) */
            used = add_sat(reading(d, c->dev, c->runtime), s.extra);
        }
        if (add_sat(used, mine) > d->limit && claim > exact) {
            gg_peers_lower(p, claim, exact); /* no slack this close to the line */
            mine = exact > cur ? exact - cur : 0;
        }
        v->peers = s.cur + s.extra;
        if (add_sat(used, mine) <= d->limit)
            return true; /* c->pended is given back once the call returns */
        /* Others are deciding too, and it would fit but for what they
         * claimed: the first of them goes on, the rest step back until it
         * has decided, then ask again. */
        if (s.pending && add_sat(used - s.extra, mine) <= d->limit &&
            shared_wait(d, c, s.first, &deadline))
            continue;
        decided(d, c);
        shared_settle(d, 0);
        if (spared(d, c)) {
            v->spared = true;
            return true;
        }
        refuse(d, c, v, used);
        return false;
    }
}

bool gg_guard_admit(struct gg_call *c, struct gg_verdict *v)
{
    struct gg_device *d = gg_device(c->dev);
    clear(v);
    c->site = GG_SITE_NONE;
    c->pended = 0;
    if (!d || d->mode == GG_MODE_OFF)
        return true;
    if (gg_unlikely(!atomic_load_explicit(&d->read_once, memory_order_acquire)))
        first_reading(d, c);
    if (want_stack(d, false))
        capture(d, c);
    struct gg_peer_slot *self = d->peers.self;
    if (self) {
        /* A shared GPU: within the claim, nothing to ask; past it, the
         * others are asked (what grows the device: a pool's growth). */
        uint64_t need = gg_likely(c->pool == GG_POOL_NONE) ? c->bytes : c->grows;
        if (gg_unlikely(add_sat(atomic_load_explicit(&d->current, memory_order_relaxed), need) >
                        atomic_load_explicit(&self->claim, memory_order_relaxed)) && need)
            return shared_admit(d, c, need, v);
    }
    if (!atomic_load_explicit(&d->enforcing, memory_order_relaxed) ||
        c->refusable == GG_REFUSABLE_NEVER)
        return true;
    /* A pool's request grows the device by at most what it asks for: when
     * that fits, so does its growth. */
    if (gg_likely(add_sat(gg_device_estimate(d), c->bytes) <= d->limit))
        return true; /* the estimate says it fits: no reading */
    uint64_t grows = c->bytes;
    if (c->pool != GG_POOL_NONE) {
        if (c->grows && add_sat(gg_device_estimate(d), c->grows) > d->limit)
            pool_recheck(c); /* what does the pool really hold free? */
        grows = c->grows;
        if (!grows || add_sat(gg_device_estimate(d), grows) <= d->limit)
            return true; /* served, at least in part, from memory its pool holds */
    }
    uint64_t used = reading(d, c->dev, c->runtime);
    if (add_sat(used, grows) <= d->limit)
        return true;
    if (spared(d, c)) {
        v->spared = true; /* counted; a near miss past the limit when it succeeds */
        return true;
    }
    refuse(d, c, v, used);
    return false;
}

static GG_COLD void near_miss(struct gg_device *d, struct gg_call *c, uint64_t used,
                              struct gg_verdict *v)
{
    uint64_t last = atomic_load_explicit(&d->last_reading_ns, memory_order_relaxed);
    if (gg_now_ns() - last > BAND_READING_NS)
        used = reading(d, c->dev, false);
    if (add_sat(used, d->near) <= d->limit)
        return;
    atomic_fetch_add_explicit(&d->near_misses, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        capture(d, c);
    incident(c, v, GG_INCIDENT_NEAR_MISS);
    v->used = used;
    v->over_limit = used > d->limit;
    if (gg_peers_on(&d->peers)) /* what the others held, as last seen */
        v->peers = (uint64_t)((int64_t)atomic_load_explicit(&d->peers_at_reading,
                                                            memory_order_relaxed) +
                              atomic_load_explicit(&d->peers_delta, memory_order_relaxed));
}

/* A pool's entry left the ledger (a free, or replaced by a new key): its
 * bytes go back to the pool, and leave the device only with a destroyed
 * pool. Returns the device's `current`. */
static GG_COLD uint64_t account_pool_free(struct gg_device *d, const struct gg_entry *e)
{
    if (e->site != GG_SITE_NONE)
        gg_sites_charge(e->site, -(int64_t)e->size, -1);
    atomic_fetch_sub_explicit(&d->pool_used, e->size, memory_order_relaxed);
    uint64_t left = gg_pools_freed(e->pool, e->size);
    atomic_fetch_sub_explicit(&d->pool_reserved, left, memory_order_relaxed);
    uint64_t cur = atomic_fetch_sub_explicit(&d->current, left, memory_order_relaxed) - left;
    shared_freed(d, cur);
    return cur;
}

/* Bytes no longer held: the device's and the site's. */
static inline uint64_t account_free(struct gg_device *d, const struct gg_entry *e)
{
    if (gg_unlikely(e->flags & GG_ENTRY_POOL))
        return account_pool_free(d, e);
    if (e->site != GG_SITE_NONE)
        gg_sites_charge(e->site, -(int64_t)e->size, -1);
    uint64_t cur = atomic_fetch_sub_explicit(&d->current, e->size, memory_order_relaxed) - e->size;
    shared_freed(d, cur);
    return cur;
}

static GG_COLD void evicted(const struct gg_entry *old)
{
    struct gg_device *o = gg_device(old->dev);
    if (o)
        (void)account_free(o, old);
}

/* A pool handed out c->bytes: what it grew by is what the device gave. When
 * it grew, the driver says by how much (its granularity), and that is
 * believed, whatever the others did meanwhile. */
static GG_COLD uint64_t pool_allocated(struct gg_device *d, const struct gg_call *c)
{
    uint64_t grew = gg_pools_allocated(c->pool, c->bytes);
    atomic_fetch_add_explicit(&d->pool_used, c->bytes, memory_order_relaxed);
    if (grew) {
        uint64_t r = atomic_fetch_add_explicit(&d->pool_reserved, grew, memory_order_relaxed) + grew;
        gg_atomic_max(&d->peak_pool_reserved, r);
        gg_peers_publish(&d->peers,
                         atomic_fetch_add_explicit(&d->current, grew, memory_order_relaxed) + grew);
        (void)pool_reading(c->pool, NULL, NULL);
    }
    return atomic_load_explicit(&d->current, memory_order_relaxed);
}

void gg_guard_allocated(struct gg_call *c, uintptr_t key, struct gg_verdict *v)
{
    struct gg_device *d = gg_device(c->dev);
    if (gg_unlikely(c->pended))
        decided(d, c);
    if (!d || d->mode == GG_MODE_OFF || !key)
        return;
    struct gg_entry e = {.key = key, .size = c->bytes, .site = c->site, .dev = (uint8_t)c->dev,
                         .api = c->api};
    if (gg_unlikely(c->pool != GG_POOL_NONE)) {
        e.flags = GG_ENTRY_POOL;
        e.pool = c->pool;
    }
    struct gg_entry old;
    enum gg_ledger_add r = gg_ledger_add(&e, &old);
    if (gg_unlikely(r != GG_LEDGER_ADDED)) {
        if (r == GG_LEDGER_FULL)
            return; /* not counted; the ledger's pages could not grow */
        evicted(&old);
    }
    uint64_t cur = gg_likely(c->pool == GG_POOL_NONE)
                       ? atomic_fetch_add_explicit(&d->current, c->bytes, memory_order_relaxed) +
                             c->bytes
                       : pool_allocated(d, c);
    gg_peers_publish(&d->peers, cur);
    bool peak = gg_atomic_max(&d->window_peak, cur) &&
                cur > atomic_load_explicit(&d->peak_before, memory_order_relaxed);
    if (c->site != GG_SITE_NONE)
        gg_sites_charge(c->site, (int64_t)c->bytes, 1);
    uint64_t used = add_sat(cur, (uint64_t)atomic_load_explicit(&d->used_offset,
                                                                 memory_order_relaxed));
    gg_atomic_max(&d->window_used, used);
    if (gg_unlikely(add_sat(used, d->near) > d->limit) && (c->pool == GG_POOL_NONE || c->grows))
        near_miss(d, c, used, v);
    if (gg_unlikely(peak) && d->stacks != GG_STACKS_OFF)
        new_peak(d, c, cur);
    sample_check(d, cur, v);
    if (gg_unlikely(gg_guard_retrying))
        v->settle = true;
}

void gg_guard_failed(struct gg_call *c, bool oom, struct gg_verdict *v)
{
    struct gg_device *d = gg_device(c->dev);
    if (gg_unlikely(c->pended))
        decided(d, c);
    if (!d || d->mode == GG_MODE_OFF || !oom)
        return;
    if (is_retry(c)) { /* failed again: the same request */
        v->incident = GG_INCIDENT_OOM;
        v->retry = true;
        v->used = reading(d, c->dev, false);
        return;
    }
    atomic_fetch_add_explicit(&d->ooms, 1, memory_order_relaxed);
    if (c->site == GG_SITE_NONE && want_stack(d, true))
        capture(d, c);
    incident(c, v, GG_INCIDENT_OOM);
    v->used = reading(d, c->dev, false);
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
    if (gg_unlikely(gg_guard_retrying))
        v->freed = out->size;
    return true;
}

void gg_guard_unrelease(const struct gg_entry *e, uint32_t ticket)
{
    struct gg_device *d = gg_device(e->dev);
    if (!gg_ledger_restore(e, ticket) || !d)
        return;
    if (gg_unlikely(e->flags & GG_ENTRY_POOL)) {
        /* handed out again by its pool: from the bytes it just got back */
        struct gg_call c = {.dev = e->dev, .pool = e->pool, .bytes = e->size};
        (void)pool_allocated(d, &c);
    } else {
        gg_peers_publish(&d->peers, atomic_fetch_add_explicit(&d->current, e->size,
                                                              memory_order_relaxed) + e->size);
    }
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
        if (gg_ledger_map(m.key, -1, &gone) && (d = gg_device(gone.dev))) {
            sample_check(d, account_free(d, &gone), v);
            if (gg_unlikely(gg_guard_retrying))
                v->freed += gone.size;
        }
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
        /* A handle never mapped is a growth taken back, not cache freed. */
        if (gg_unlikely(gg_guard_retrying) && (e.flags & GG_ENTRY_MAPPED))
            v->freed = e.size;
        return true;
    }
    case GG_LEDGER_KEPT: /* still mapped: the memory lives until the unmap */
        return true;
    default:
        return false;
    }
}

/* ---- pools: what the hooks tell ------------------------------------------------------ */

/* Each device's current pool (cudaMallocAsync's), as last seen; 0: ask. */
static _Atomic uint64_t current_pool[GG_MAX_DEVICES];

/* The device a pool the shim did not see made holds memory on: a device's
 * default pool says so; any other (imported, made before the hooks) is
 * taken to be on the device of the call. */
static GG_COLD unsigned pool_unknown(uint64_t pool, int dev)
{
    int on = dev;
    for (int i = 0; i < gg_device_count; i++)
        if (gg_driver_device_pool(i, true) == pool) {
            on = i;
            break;
        }
    return gg_pools_get(pool, on, false);
}

bool gg_guard_pool(struct gg_call *c, uint64_t pool, int dev, bool trust_cache)
{
    if (!pool && (unsigned)dev < GG_MAX_DEVICES) {
        pool = trust_cache ? atomic_load_explicit(&current_pool[dev], memory_order_relaxed) : 0;
        if (!pool && (pool = gg_driver_device_pool(dev, false)) && trust_cache)
            atomic_store_explicit(&current_pool[dev], pool, memory_order_relaxed);
    }
    unsigned s = gg_pools_find(pool);
    if (gg_unlikely(s == GG_POOL_NONE) && pool)
        s = pool_unknown(pool, dev);
    int on;
    bool host;
    if (s == GG_POOL_NONE || !gg_pools_where(s, &on, &host))
        return true; /* a pool the shim cannot follow: counted as a plain allocation */
    if (host)
        return false;
    c->dev = on;
    c->pool = (uint8_t)s;
    c->grows = gg_pools_growth(s, c->bytes);
    return true;
}

void gg_guard_host_allocated(uintptr_t key)
{
    struct gg_entry e = {.key = key, .dev = GG_LEDGER_NO_DEVICE}, old;
    if (key && gg_ledger_add(&e, &old) == GG_LEDGER_REPLACED)
        evicted(&old);
}

void gg_guard_pool_created(uint64_t pool, int dev, bool host)
{
    (void)gg_pools_get(pool, dev, host);
}

void gg_guard_current_pool(int dev, uint64_t pool)
{
    if ((unsigned)dev < GG_MAX_DEVICES)
        atomic_store_explicit(&current_pool[dev], pool, memory_order_relaxed);
}

void gg_guard_pool_trimmed(uint64_t pool, uint64_t keep, struct gg_verdict *v)
{
    clear(v);
    unsigned s = gg_pools_find(pool);
    struct gg_pool_figures f;
    if (s == GG_POOL_NONE || pool_reading(s, v, NULL) || !gg_pools_figures(s, &f) || f.host)
        return;
    pool_moved(f.dev, gg_pools_trimmed(s, keep), v);
}

void gg_guard_pool_destroyed(uint64_t pool, struct gg_verdict *v)
{
    unsigned s;
    struct gg_pool_figures f;
    clear(v);
    bool known = gg_pools_figures(gg_pools_find(pool), &f);
    int64_t delta = gg_pools_destroyed(pool, &s);
    if (known && !f.host)
        pool_moved(f.dev, delta, v);
    for (int i = 0; i < GG_MAX_DEVICES; i++) { /* a device whose current pool it was: its default */
        uint64_t cur = pool;
        atomic_compare_exchange_strong(&current_pool[i], &cur, 0);
    }
}

void gg_guard_pools_synced(struct gg_verdict *v)
{
    struct gg_pool_figures f;
    clear(v);
    for (unsigned s = gg_pools_next(GG_POOL_NONE); s != GG_POOL_NONE; s = gg_pools_next(s))
        if (gg_pools_figures(s, &f) && !f.host && f.reserved > f.used)
            (void)pool_reading(s, v, NULL);
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
    gg_pools_after_fork();
    gg_callers_after_fork();
}
