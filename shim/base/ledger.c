/* ledger.c - layer 1: live allocations (see ledger.h).
 *
 * 256 shards chosen by a hash of the key; each shard is an open-addressed
 * table with linear probing and backward-shift deletion (no tombstones),
 * grown by doubling at 3/4 full. Entries are 24 bytes; the tables live in
 * mmap'd memory so the host's malloc never sees them.
 */
#include "ledger.h"

#include <stddef.h>
#include <string.h>

#include "prim.h"

#define SHARDS 256
#define MIN_CAP 64
#define RECENT 4 /* unknown frees remembered per shard, for restore */

struct shard {
    _Alignas(64) gg_spin lock;
    uint32_t cap;   /* power of two, 0 before the first insert */
    uint32_t count;
    struct gg_entry *slot;
    uint32_t unknown_seq;          /* unknown frees seen, ever */
    uintptr_t recent[RECENT];      /* the last ones, by unknown_seq % RECENT */
    /* Written under the lock with plain (not locked) read-modify-writes;
     * read without it when summed. */
    _Atomic uint64_t allocs[GG_MAX_DEVICES + 1], frees[GG_MAX_DEVICES + 1]; /* + no device's */
};

static struct shard shards[SHARDS];

/* +by under the shard's lock: a load and a store, no locked instruction. */
static inline void bump(_Atomic uint64_t *c, int64_t by)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)by,
                          memory_order_relaxed);
}

static inline uint64_t hash(uintptr_t p)
{
    uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 31);
}

static inline struct shard *shard_of(uint64_t h)
{
    return &shards[h >> 56];
}

static size_t table_bytes(uint32_t cap)
{
    return (size_t)cap * sizeof(struct gg_entry);
}

/* Insert into a table known to have room; the key is not present. */
static void place(struct gg_entry *slot, uint32_t cap, const struct gg_entry *e, uint64_t h)
{
    uint32_t mask = cap - 1, i = (uint32_t)h & mask;
    while (slot[i].key)
        i = (i + 1) & mask;
    slot[i] = *e;
}

static GG_COLD bool grow(struct shard *s)
{
    uint32_t cap = s->cap ? s->cap * 2 : MIN_CAP;
    struct gg_entry *slot = gg_pages(table_bytes(cap));
    if (!slot)
        return false;
    for (uint32_t i = 0; i < s->cap; i++)
        if (s->slot[i].key)
            place(slot, cap, &s->slot[i], hash(s->slot[i].key));
    gg_pages_free(s->slot, table_bytes(s->cap));
    s->slot = slot;
    s->cap = cap;
    return true;
}

static inline bool has_room(struct shard *s)
{
    return (s->count + 1) * 4 <= s->cap * 3 || grow(s);
}

/* Index of key in the shard, or -1. Shard locked. */
static inline int64_t lookup(const struct shard *s, uintptr_t key, uint64_t h)
{
    if (!s->cap)
        return -1;
    uint32_t mask = s->cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        if (s->slot[i].key == key)
            return i;
        if (!s->slot[i].key)
            return -1;
    }
}

/* Remove slot i, shifting later members of its probe run back. */
static void erase(struct shard *s, uint32_t i)
{
    uint32_t mask = s->cap - 1;
    for (uint32_t j = (i + 1) & mask; s->slot[j].key; j = (j + 1) & mask) {
        uint32_t home = (uint32_t)hash(s->slot[j].key) & mask;
        /* Move j back to i when its home does not lie cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            s->slot[i] = s->slot[j];
            i = j;
        }
    }
    s->slot[i].key = 0;
    s->count--;
}

enum gg_ledger_add gg_ledger_add(const struct gg_entry *e, struct gg_entry *evicted)
{
    uint64_t h = hash(e->key);
    struct shard *s = shard_of(h);
    enum gg_ledger_add r = GG_LEDGER_ADDED;
    gg_spin_lock(&s->lock);
    if (gg_unlikely(!has_room(s))) {
        gg_spin_unlock(&s->lock);
        return GG_LEDGER_FULL;
    }
    /* One probe: the key's slot if it is there, else the first empty one. */
    uint32_t mask = s->cap - 1, i = (uint32_t)h & mask;
    while (s->slot[i].key && s->slot[i].key != e->key)
        i = (i + 1) & mask;
    if (gg_unlikely(s->slot[i].key)) {
        /* The allocator handed out a key we think is live: a free we did
         * not see (a path we do not hook). The new entry replaces it. */
        *evicted = s->slot[i];
        bump(&s->frees[evicted->dev], 1);
        r = GG_LEDGER_REPLACED;
    } else {
        s->count++;
    }
    s->slot[i] = *e;
    bump(&s->allocs[e->dev], 1);
    gg_spin_unlock(&s->lock);
    return r;
}

bool gg_ledger_remove(uintptr_t key, struct gg_entry *out, uint32_t *ticket)
{
    uint64_t h = hash(key);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    int64_t at = lookup(s, key, h);
    if (at < 0) {
        gg_spin_unlock(&s->lock);
        return false;
    }
    *out = s->slot[at];
    erase(s, (uint32_t)at);
    bump(&s->frees[out->dev], 1);
    if (ticket)
        *ticket = s->unknown_seq;
    gg_spin_unlock(&s->lock);
    return true;
}

void gg_ledger_unknown_freed(uintptr_t key)
{
    uint64_t h = hash(key);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    s->recent[s->unknown_seq % RECENT] = key;
    s->unknown_seq++;
    gg_spin_unlock(&s->lock);
}

/* Was key freed as unknown since `ticket`? When more unknown frees than the
 * shard remembers came since, it cannot tell: say yes (a lost entry is
 * corrected by the next device reading; a phantom would be refused against
 * forever). */
static bool freed_since(const struct shard *s, uintptr_t key, uint32_t ticket)
{
    uint32_t since = s->unknown_seq - ticket;
    if (since > RECENT)
        return true;
    for (uint32_t k = 0; k < since; k++)
        if (s->recent[(ticket + k) % RECENT] == key)
            return true;
    return false;
}

bool gg_ledger_restore(const struct gg_entry *e, uint32_t ticket)
{
    uint64_t h = hash(e->key);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    bool ok = lookup(s, e->key, h) < 0 && !freed_since(s, e->key, ticket) && has_room(s);
    if (ok) {
        place(s->slot, s->cap, e, h);
        s->count++;
        bump(&s->frees[e->dev], -1);
    }
    gg_spin_unlock(&s->lock);
    return ok;
}

bool gg_ledger_map(uintptr_t key, int delta, struct gg_entry *out)
{
    uint64_t h = hash(key);
    struct shard *s = shard_of(h);
    bool gone = false;
    gg_spin_lock(&s->lock);
    int64_t at = lookup(s, key, h);
    if (at >= 0) {
        struct gg_entry *e = &s->slot[at];
        if (delta > 0)
            e->flags |= GG_ENTRY_MAPPED;
        if (delta > 0 && e->refs < UINT8_MAX)
            e->refs++;
        else if (delta < 0 && e->refs > 0 && e->refs < UINT8_MAX)
            e->refs--;
        if (e->refs == 0 && (e->flags & GG_ENTRY_RELEASED)) {
            *out = *e;
            erase(s, (uint32_t)at);
            bump(&s->frees[out->dev], 1);
            gone = true;
        }
    }
    gg_spin_unlock(&s->lock);
    return gone;
}

enum gg_ledger_release gg_ledger_release(uintptr_t key, struct gg_entry *out)
{
    uint64_t h = hash(key);
    struct shard *s = shard_of(h);
    enum gg_ledger_release r = GG_LEDGER_UNKNOWN;
    gg_spin_lock(&s->lock);
    int64_t at = lookup(s, key, h);
    if (at >= 0) {
        struct gg_entry *e = &s->slot[at];
        *out = *e;
        if (e->refs) {
            e->flags |= GG_ENTRY_RELEASED;
            r = GG_LEDGER_KEPT;
        } else {
            erase(s, (uint32_t)at);
            bump(&s->frees[out->dev], 1);
            r = GG_LEDGER_GONE;
        }
    }
    gg_spin_unlock(&s->lock);
    return r;
}

bool gg_ledger_find(uintptr_t key, struct gg_entry *out)
{
    uint64_t h = hash(key);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    int64_t at = lookup(s, key, h);
    if (at >= 0)
        *out = s->slot[at];
    gg_spin_unlock(&s->lock);
    return at >= 0;
}

static uint64_t sum(size_t offset, int dev)
{
    uint64_t n = 0;
    for (int k = 0; k < SHARDS; k++) {
        const _Atomic uint64_t *arr = (const _Atomic uint64_t *)((const char *)&shards[k] + offset);
        n += atomic_load_explicit(&arr[dev], memory_order_relaxed);
    }
    return n;
}

uint64_t gg_ledger_allocs(int dev)
{
    return (unsigned)dev <= GG_LEDGER_NO_DEVICE ? sum(offsetof(struct shard, allocs), dev) : 0;
}

uint64_t gg_ledger_frees(int dev)
{
    return (unsigned)dev <= GG_LEDGER_NO_DEVICE ? sum(offsetof(struct shard, frees), dev) : 0;
}

#ifdef GG_TESTING
uint64_t gg_ledger_footprint(void)
{
    uint64_t bytes = sizeof shards;
    for (int k = 0; k < SHARDS; k++)
        bytes += table_bytes(shards[k].cap);
    return bytes;
}

void gg_ledger_reset(void)
{
    for (int k = 0; k < SHARDS; k++) {
        gg_pages_free(shards[k].slot, table_bytes(shards[k].cap));
        memset(&shards[k], 0, sizeof shards[k]);
    }
}
#endif

void gg_ledger_after_fork(void)
{
    for (int k = 0; k < SHARDS; k++)
        gg_spin_reset(&shards[k].lock);
}
