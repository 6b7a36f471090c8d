/* ledger.c - live allocations and per-device counters (see ledger.h).
 *
 * 256 shards chosen by a hash of the pointer; each shard is an open-addressed
 * table with linear probing and backward-shift deletion (no tombstones), grown
 * by doubling at 3/4 full. Entries are 24 bytes; the tables live in mmap'd
 * memory so the host's malloc never sees them.
 */
#include "ledger.h"

#include <stddef.h>
#include <string.h>

#include "os.h"

#define SHARDS 256
#define MIN_CAP 64

struct shard {
    _Alignas(64) gg_spin lock;
    uint32_t cap;   /* power of two, 0 before the first insert */
    uint32_t count;
    struct gg_alloc *slot;
    /* Written under the lock with plain (relaxed, not locked) stores; read
     * without it when summed. */
    _Atomic uint64_t allocs[GG_MAX_DEVICES], frees[GG_MAX_DEVICES];
};

/* +1 under the shard's lock: a load and a store, no locked instruction. */
static inline void bump(_Atomic uint64_t *c, int64_t by)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + (uint64_t)by,
                          memory_order_relaxed);
}

static struct shard shards[SHARDS];
struct gg_counters gg_ledger_counters[GG_MAX_DEVICES];

static const char *const api_names[GG_API_COUNT] = {
    [GG_API_CUDA_MALLOC] = "cudaMalloc",
    [GG_API_CUDA_MALLOC_ASYNC] = "cudaMallocAsync",
    [GG_API_CUDA_MALLOC_FROM_POOL] = "cudaMallocFromPoolAsync",
    [GG_API_CUDA_MALLOC_MANAGED] = "cudaMallocManaged",
    [GG_API_CUDA_MALLOC_PITCH] = "cudaMallocPitch",
    [GG_API_CU_MEM_ALLOC] = "cuMemAlloc",
    [GG_API_CU_MEM_ALLOC_ASYNC] = "cuMemAllocAsync",
    [GG_API_CU_MEM_ALLOC_FROM_POOL] = "cuMemAllocFromPoolAsync",
    [GG_API_CU_MEM_ALLOC_MANAGED] = "cuMemAllocManaged",
    [GG_API_CU_MEM_ALLOC_PITCH] = "cuMemAllocPitch",
    [GG_API_CU_MEM_CREATE] = "cuMemCreate",
};

const char *gg_api_name(enum gg_api api)
{
    return (unsigned)api < GG_API_COUNT ? api_names[api] : "unknown";
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
    return (size_t)cap * sizeof(struct gg_alloc);
}

/* Insert into a table known to have room; the pointer is not present. */
static void place(struct gg_alloc *slot, uint32_t cap, const struct gg_alloc *a, uint64_t h)
{
    uint32_t mask = cap - 1, i = (uint32_t)h & mask;
    while (slot[i].ptr)
        i = (i + 1) & mask;
    slot[i] = *a;
}

static GG_COLD bool grow(struct shard *s)
{
    uint32_t cap = s->cap ? s->cap * 2 : MIN_CAP;
    struct gg_alloc *slot = gg_os_alloc(table_bytes(cap));
    if (!slot)
        return false;
    for (uint32_t i = 0; i < s->cap; i++)
        if (s->slot[i].ptr)
            place(slot, cap, &s->slot[i], hash(s->slot[i].ptr));
    gg_os_free(s->slot, table_bytes(s->cap));
    s->slot = slot;
    s->cap = cap;
    return true;
}

/* Index of ptr in the shard, or -1. Shard locked. */
static inline int64_t lookup(const struct shard *s, uintptr_t ptr, uint64_t h)
{
    if (!s->cap)
        return -1;
    uint32_t mask = s->cap - 1;
    for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
        if (s->slot[i].ptr == ptr)
            return i;
        if (!s->slot[i].ptr)
            return -1;
    }
}

/* Remove slot i, shifting later members of its probe run back. */
static void erase(struct shard *s, uint32_t i)
{
    uint32_t mask = s->cap - 1;
    for (uint32_t j = (i + 1) & mask; s->slot[j].ptr; j = (j + 1) & mask) {
        uint32_t home = (uint32_t)hash(s->slot[j].ptr) & mask;
        /* Move j back to i when its home does not lie cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            s->slot[i] = s->slot[j];
            i = j;
        }
    }
    s->slot[i].ptr = 0;
    s->count--;
}

bool gg_ledger_add(const struct gg_alloc *a, uint64_t *current, bool *new_peak)
{
    uint64_t h = hash(a->ptr);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    if (gg_unlikely((s->count + 1) * 4 > s->cap * 3) && !grow(s)) {
        gg_spin_unlock(&s->lock);
        return false;
    }
    /* One probe: the pointer's slot if it is there, else the first empty one. */
    uint32_t mask = s->cap - 1, i = (uint32_t)h & mask;
    while (s->slot[i].ptr && s->slot[i].ptr != a->ptr)
        i = (i + 1) & mask;
    if (gg_unlikely(s->slot[i].ptr)) {
        /* The allocator handed out a pointer we think is live: a free we did
         * not see (a path we do not hook). The new allocation replaces it. */
        struct gg_alloc old = s->slot[i];
        bump(&s->frees[old.dev], 1);
        atomic_fetch_sub_explicit(&gg_ledger_counters[old.dev].current, old.size,
                                  memory_order_relaxed);
        gg_site_charge(old.site, -(int64_t)old.size, -1);
    } else {
        s->count++;
    }
    s->slot[i] = *a;
    bump(&s->allocs[a->dev], 1);
    gg_spin_unlock(&s->lock);

    struct gg_counters *c = &gg_ledger_counters[a->dev];
    uint64_t cur = atomic_fetch_add_explicit(&c->current, a->size, memory_order_relaxed) + a->size;
    *new_peak = gg_atomic_max(&c->peak, cur);
    *current = cur;
    return true;
}

bool gg_ledger_remove(uintptr_t ptr, struct gg_alloc *out)
{
    uint64_t h = hash(ptr);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    int64_t at = lookup(s, ptr, h);
    if (at < 0) {
        gg_spin_unlock(&s->lock);
        return false;
    }
    *out = s->slot[at];
    erase(s, (uint32_t)at);
    bump(&s->frees[out->dev], 1);
    gg_spin_unlock(&s->lock);

    atomic_fetch_sub_explicit(&gg_ledger_counters[out->dev].current, out->size,
                              memory_order_relaxed);
    return true;
}

void gg_ledger_restore(const struct gg_alloc *a)
{
    uint64_t h = hash(a->ptr);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    if (lookup(s, a->ptr, h) >= 0 || ((s->count + 1) * 4 > s->cap * 3 && !grow(s))) {
        gg_spin_unlock(&s->lock);
        return;
    }
    place(s->slot, s->cap, a, h);
    s->count++;
    bump(&s->frees[a->dev], -1);
    gg_spin_unlock(&s->lock);
    atomic_fetch_add_explicit(&gg_ledger_counters[a->dev].current, a->size, memory_order_relaxed);
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
    return (unsigned)dev < GG_MAX_DEVICES ? sum(offsetof(struct shard, allocs), dev) : 0;
}

uint64_t gg_ledger_frees(int dev)
{
    return (unsigned)dev < GG_MAX_DEVICES ? sum(offsetof(struct shard, frees), dev) : 0;
}

bool gg_ledger_find(uintptr_t ptr, struct gg_alloc *out)
{
    uint64_t h = hash(ptr);
    struct shard *s = shard_of(h);
    gg_spin_lock(&s->lock);
    int64_t at = lookup(s, ptr, h);
    if (at >= 0)
        *out = s->slot[at];
    gg_spin_unlock(&s->lock);
    return at >= 0;
}

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
        gg_os_free(shards[k].slot, table_bytes(shards[k].cap));
        shards[k].slot = NULL;
        shards[k].cap = shards[k].count = 0;
        memset((void *)shards[k].allocs, 0, sizeof shards[k].allocs);
        memset((void *)shards[k].frees, 0, sizeof shards[k].frees);
        atomic_flag_clear(&shards[k].lock.f);
    }
    memset(gg_ledger_counters, 0, sizeof gg_ledger_counters);
}
