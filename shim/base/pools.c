/* pools.c - layer 1: stream-ordered memory pools (see pools.h).
 *
 * The slots are also the hash table: a pool's handle is looked up by
 * probing from its hash, without a lock. A destroyed pool's slot keeps
 * draining under a tombstone handle (a new pool may get the old handle at
 * once), and is taken again only when its last allocation is freed, so no
 * ledger entry ever names a slot that another pool has taken.
 */
#include "pools.h"

#include <string.h>

#include "prim.h"

#define TOMB ((uint64_t)1) /* a handle no pool has: the slot's pool was destroyed */

struct slot {
    _Atomic uint64_t handle;  /* 0: never used; TOMB: destroyed (draining or free) */
    _Atomic bool live;        /* a pool's, or a destroyed one still draining */
    gg_spin lock;             /* the figures below */
    int dev;
    bool host, destroyed;
    uint64_t reserved, used, peak_reserved;
};

static struct slot slots[GG_POOLS + 1]; /* [0]: GG_POOL_NONE */
static gg_spin table_lock = GG_SPIN_INIT;
/* A bit per live slot: a synchronisation visits the pools there are, not
 * every slot. */
static _Atomic uint64_t live_bits[(GG_POOLS + 64) / 64];

static void set_live(unsigned s, bool live)
{
    atomic_store_explicit(&slots[s].live, live, memory_order_release);
    if (live)
        atomic_fetch_or_explicit(&live_bits[s / 64], 1ull << (s % 64), memory_order_release);
    else
        atomic_fetch_and_explicit(&live_bits[s / 64], ~(1ull << (s % 64)), memory_order_release);
}

static inline unsigned probe(uint64_t handle, unsigned i)
{
    return (unsigned)((gg_mix64(handle) + i) % GG_POOLS) + 1;
}

unsigned gg_pools_find(uint64_t handle)
{
    if (handle <= TOMB)
        return GG_POOL_NONE;
    for (unsigned i = 0; i < GG_POOLS; i++) {
        unsigned s = probe(handle, i);
        uint64_t h = atomic_load_explicit(&slots[s].handle, memory_order_acquire);
        if (h == handle)
            return s;
        if (h == 0)
            break;
    }
    return GG_POOL_NONE;
}

unsigned gg_pools_get(uint64_t handle, int dev, bool host)
{
    unsigned s = gg_pools_find(handle);
    if (s != GG_POOL_NONE || handle <= TOMB)
        return s;
    gg_spin_lock(&table_lock);
    s = gg_pools_find(handle); /* another thread may have just added it */
    for (unsigned i = 0; s == GG_POOL_NONE && i < GG_POOLS; i++) {
        unsigned t = probe(handle, i);
        uint64_t h = atomic_load_explicit(&slots[t].handle, memory_order_relaxed);
        if (h != 0 && (h != TOMB || atomic_load_explicit(&slots[t].live, memory_order_acquire)))
            continue;
        struct slot *p = &slots[t];
        gg_spin_lock(&p->lock);
        p->dev = host ? -1 : dev;
        p->host = host;
        p->destroyed = false;
        p->reserved = p->used = p->peak_reserved = 0;
        gg_spin_unlock(&p->lock);
        set_live(t, true);
        atomic_store_explicit(&p->handle, handle, memory_order_release);
        s = t;
    }
    gg_spin_unlock(&table_lock);
    return s;
}

static inline struct slot *slot_of(unsigned s)
{
    if (s == GG_POOL_NONE || s > GG_POOLS || !atomic_load_explicit(&slots[s].live,
                                                                     memory_order_acquire))
        return NULL;
    return &slots[s];
}

bool gg_pools_where(unsigned s, int *dev, bool *host)
{
    struct slot *p = slot_of(s);
    if (!p)
        return false;
    gg_spin_lock(&p->lock);
    *dev = p->dev;
    *host = p->host;
    gg_spin_unlock(&p->lock);
    return true;
}

static inline uint64_t free_bytes(const struct slot *p)
{
    return p->reserved > p->used ? p->reserved - p->used : 0;
}

uint64_t gg_pools_growth(unsigned s, uint64_t n)
{
    struct slot *p = slot_of(s);
    if (!p)
        return n;
    gg_spin_lock(&p->lock);
    uint64_t f = free_bytes(p);
    gg_spin_unlock(&p->lock);
    return n > f ? n - f : 0;
}

uint64_t gg_pools_allocated(unsigned s, uint64_t n)
{
    struct slot *p = slot_of(s);
    if (!p)
        return 0;
    gg_spin_lock(&p->lock);
    uint64_t f = free_bytes(p), grew = n > f ? n - f : 0;
    p->reserved += grew;
    p->used += n;
    if (p->reserved > p->peak_reserved)
        p->peak_reserved = p->reserved;
    gg_spin_unlock(&p->lock);
    return grew;
}

uint64_t gg_pools_freed(unsigned s, uint64_t n)
{
    struct slot *p = slot_of(s);
    if (!p)
        return 0;
    uint64_t left = 0;
    gg_spin_lock(&p->lock);
    n = n < p->used ? n : p->used;
    p->used -= n;
    bool drained = false;
    if (p->destroyed) {
        left = p->reserved - p->used; /* a destroyed pool holds no free bytes */
        p->reserved = p->used;
        drained = p->used == 0;
    }
    gg_spin_unlock(&p->lock);
    if (drained)
        set_live((unsigned)(p - slots), false);
    return left;
}

static int64_t set_reserved(struct slot *p, uint64_t r)
{
    gg_spin_lock(&p->lock);
    if (r < p->used)
        r = p->used; /* it holds at least what it handed out */
    int64_t delta = (int64_t)(r - p->reserved);
    p->reserved = r;
    if (r > p->peak_reserved)
        p->peak_reserved = r;
    gg_spin_unlock(&p->lock);
    return delta;
}

int64_t gg_pools_observed(unsigned s, uint64_t reserved)
{
    struct slot *p = slot_of(s);
    return p ? set_reserved(p, reserved) : 0;
}

int64_t gg_pools_trimmed(unsigned s, uint64_t keep)
{
    struct slot *p = slot_of(s);
    if (!p)
        return 0;
    gg_spin_lock(&p->lock);
    uint64_t r = p->reserved < keep ? p->reserved : keep; /* a trim never grows it */
    gg_spin_unlock(&p->lock);
    return set_reserved(p, r);
}

int64_t gg_pools_destroyed(uint64_t handle, unsigned *out)
{
    unsigned s = gg_pools_find(handle);
    struct slot *p = slot_of(s);
    *out = s;
    if (!p)
        return 0;
    gg_spin_lock(&table_lock);
    atomic_store_explicit(&p->handle, TOMB, memory_order_release);
    gg_spin_lock(&p->lock);
    p->destroyed = true;
    int64_t delta = -(int64_t)free_bytes(p);
    p->reserved = p->used;
    bool drained = p->used == 0;
    gg_spin_unlock(&p->lock);
    if (drained)
        set_live((unsigned)(p - slots), false);
    gg_spin_unlock(&table_lock);
    return delta;
}

bool gg_pools_figures(unsigned s, struct gg_pool_figures *out)
{
    struct slot *p = slot_of(s);
    if (!p)
        return false;
    out->handle = atomic_load_explicit(&p->handle, memory_order_acquire);
    gg_spin_lock(&p->lock);
    out->reserved = p->reserved;
    out->used = p->used;
    out->peak_reserved = p->peak_reserved;
    out->dev = p->dev;
    out->host = p->host;
    out->destroyed = p->destroyed;
    gg_spin_unlock(&p->lock);
    return true;
}

unsigned gg_pools_next(unsigned after)
{
    for (unsigned s = after + 1; s <= GG_POOLS;) {
        uint64_t bits = atomic_load_explicit(&live_bits[s / 64], memory_order_acquire) >> (s % 64);
        if (bits)
            return s + (unsigned)__builtin_ctzll(bits);
        s = (s / 64 + 1) * 64;
    }
    return GG_POOL_NONE;
}

#ifdef GG_TESTING
void gg_pools_reset(void)
{
    memset(slots, 0, sizeof slots);
    memset(live_bits, 0, sizeof live_bits);
    gg_spin_reset(&table_lock);
}
#endif

void gg_pools_after_fork(void)
{
    gg_spin_reset(&table_lock);
    for (unsigned s = 0; s <= GG_POOLS; s++)
        gg_spin_reset(&slots[s].lock);
}
