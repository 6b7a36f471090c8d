/* sites.c - layer 1: call sites (see sites.h). */
#include "sites.h"

#include <stdbool.h>
#include <string.h>

#include "arena.h"
#include "prim.h"

#define SITES_CAP (1u << 20)               /* sites, ever */
#define SITE_CHUNK_BITS 12
#define SITE_CHUNK (1u << SITE_CHUNK_BITS) /* site records per mmap */
#define SITE_CHUNKS (SITES_CAP / SITE_CHUNK)
#define INDEX_SLOTS (SITES_CAP * 2)        /* load factor <= 1/2 */
#define FRAME_ARENA_CHUNKS 64              /* 64 MiB of frames */

struct site {
    _Alignas(64) _Atomic int64_t bytes;    /* held through this site now */
    _Atomic int64_t allocs;
    uint64_t hash;
    const uintptr_t *words;                /* native frames, then Python pairs */
    _Atomic(void *) note;                  /* see gg_sites_note */
    int32_t dev;
    uint16_t n_native, n_py;
    _Atomic uint32_t events[GG_SITE_EVENTS]; /* see gg_sites_count_event */
};
_Static_assert(sizeof(struct site) == 64, "a site is one cache line");

static _Atomic(struct site *) chunks[SITE_CHUNKS];
static _Atomic uint32_t nsites;            /* ids 1..nsites exist */
static _Atomic(_Atomic uint64_t *) index_; /* INDEX_SLOTS, lazily */
static _Atomic uint32_t limit = SITES_CAP;
static gg_spin lock = GG_SPIN_INIT;
static struct gg_arena frames = GG_ARENA_INIT(FRAME_ARENA_CHUNKS);

static inline struct site *site_at(uint32_t id)
{
    uint32_t i = id - 1;
    struct site *c = atomic_load_explicit(&chunks[i >> SITE_CHUNK_BITS], memory_order_acquire);
    return c ? &c[i & (SITE_CHUNK - 1)] : NULL;
}

/* The site for an id handed out earlier; NULL for GG_SITE_NONE and junk. */
static inline struct site *site_get(gg_site id)
{
    if (id == GG_SITE_NONE || id > atomic_load_explicit(&nsites, memory_order_acquire))
        return NULL;
    return site_at(id);
}

static inline uint64_t hash_words(const uintptr_t *w, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        h = (((h << 23) | (h >> 41)) ^ w[i]) * 0x100000001b3ULL;
    return h;
}

static inline uint64_t hash_stack(int dev, const uintptr_t *native, size_t nn, const uintptr_t *py,
                                  size_t np)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(uint32_t)dev << 32) ^ nn ^ (np << 16);
    h = hash_words(native, nn, h);
    h = hash_words(py, 2 * np, h);
    return gg_mix64(h);
}

static inline bool site_is(const struct site *s, uint64_t h, int dev, const uintptr_t *native,
                           size_t nn, const uintptr_t *py, size_t np)
{
    return s->hash == h && s->dev == dev && s->n_native == nn && s->n_py == np &&
           (nn == 0 || memcmp(s->words, native, nn * sizeof *native) == 0) &&
           (np == 0 || memcmp(s->words + nn, py, 2 * np * sizeof *py) == 0);
}

/* Probe the index: the id, or 0 with *empty the first free slot. */
static uint32_t index_find(_Atomic uint64_t *idx, uint64_t h, int dev, const uintptr_t *native,
                           size_t nn, const uintptr_t *py, size_t np, size_t *empty)
{
    uint64_t tag = h >> 32;
    size_t i = (size_t)h & (INDEX_SLOTS - 1);
    for (size_t probes = 0; probes < INDEX_SLOTS; probes++) {
        uint64_t e = atomic_load_explicit(&idx[i], memory_order_acquire);
        if (e == 0) {
            *empty = i;
            return 0;
        }
        if ((e >> 32) == tag) {
            uint32_t id = (uint32_t)e;
            struct site *s = site_at(id);
            if (s && site_is(s, h, dev, native, nn, py, np))
                return id;
        }
        i = (i + 1) & (INDEX_SLOTS - 1);
    }
    *empty = SIZE_MAX;
    return 0;
}

static GG_COLD gg_site insert(uint64_t h, int dev, const uintptr_t *native, size_t nn,
                              const uintptr_t *py, size_t np)
{
    gg_site id = GG_SITE_NONE;
    /* Held for microseconds; a signal handler interrupting an insertion
     * on its own thread gets no site rather than waiting for itself. */
    if (!gg_spin_trylock(&lock, 1000000))
        return GG_SITE_NONE;
    _Atomic uint64_t *idx = atomic_load_explicit(&index_, memory_order_relaxed);
    if (!idx) {
        idx = gg_pages((size_t)INDEX_SLOTS * sizeof *idx);
        if (!idx)
            goto out;
        atomic_store_explicit(&index_, idx, memory_order_release);
    }
    size_t slot;
    id = index_find(idx, h, dev, native, nn, py, np, &slot); /* another thread was first? */
    if (id != GG_SITE_NONE || slot == SIZE_MAX)
        goto out;
    uint32_t count = atomic_load_explicit(&nsites, memory_order_relaxed);
    if (count >= atomic_load_explicit(&limit, memory_order_relaxed) || count >= SITES_CAP)
        goto out;
    size_t nw = nn + 2 * np;
    uintptr_t *words = gg_arena_alloc(&frames, nw * sizeof *words, sizeof *words);
    if (!words)
        goto out;
    if (nn)
        memcpy(words, native, nn * sizeof *words);
    if (np)
        memcpy(words + nn, py, 2 * np * sizeof *words);
    _Atomic(struct site *) *chunkp = &chunks[count >> SITE_CHUNK_BITS];
    struct site *chunk = atomic_load_explicit(chunkp, memory_order_relaxed);
    if (!chunk) {
        chunk = gg_pages(SITE_CHUNK * sizeof *chunk);
        if (!chunk)
            goto out;
        atomic_store_explicit(chunkp, chunk, memory_order_release);
    }
    struct site *s = &chunk[count & (SITE_CHUNK - 1)];
    atomic_store_explicit(&s->bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&s->allocs, 0, memory_order_relaxed);
    s->hash = h;
    s->words = words;
    atomic_store_explicit(&s->note, NULL, memory_order_relaxed);
    s->dev = dev;
    s->n_native = (uint16_t)nn;
    s->n_py = (uint16_t)np;
    for (int k = 0; k < GG_SITE_EVENTS; k++)
        atomic_store_explicit(&s->events[k], 0, memory_order_relaxed);
    id = count + 1;
    /* Publish the record before its id, and the id before its index slot:
     * a reader that sees either finds a whole site. */
    atomic_store_explicit(&nsites, id, memory_order_release);
    atomic_store_explicit(&idx[slot], (h >> 32) << 32 | id, memory_order_release);
out:
    gg_spin_unlock(&lock);
    return id;
}

gg_site gg_sites_intern(int dev, const uintptr_t *native, size_t nn, const uintptr_t *py,
                        size_t np)
{
    if (nn > GG_SITE_MAX_NATIVE)
        nn = GG_SITE_MAX_NATIVE;
    if (np > GG_SITE_MAX_PYTHON)
        np = GG_SITE_MAX_PYTHON;
    if (nn + np == 0)
        return GG_SITE_NONE;
    uint64_t h = hash_stack(dev, native, nn, py, np);
    _Atomic uint64_t *idx = atomic_load_explicit(&index_, memory_order_acquire);
    if (idx) {
        size_t empty;
        uint32_t id = index_find(idx, h, dev, native, nn, py, np, &empty);
        if (id)
            return id;
    }
    return insert(h, dev, native, nn, py, np);
}

size_t gg_sites_native(gg_site site, const uintptr_t **ips)
{
    struct site *s = site_get(site);
    if (ips)
        *ips = s ? s->words : NULL;
    return s ? s->n_native : 0;
}

#ifdef GG_TESTING
size_t gg_sites_python(gg_site site, const uintptr_t **pairs)
{
    struct site *s = site_get(site);
    if (pairs)
        *pairs = s ? s->words + s->n_native : NULL;
    return s ? s->n_py : 0;
}

int gg_sites_device(gg_site site)
{
    struct site *s = site_get(site);
    return s ? s->dev : -1;
}
#endif

void gg_sites_charge(gg_site site, int64_t bytes, int64_t allocs)
{
    struct site *s = site_get(site);
    if (!s)
        return;
    if (bytes)
        atomic_fetch_add_explicit(&s->bytes, bytes, memory_order_relaxed);
    if (allocs)
        atomic_fetch_add_explicit(&s->allocs, allocs, memory_order_relaxed);
}

uint32_t gg_sites_count_event(gg_site site, unsigned kind)
{
    struct site *s = site_get(site);
    if (!s || kind >= GG_SITE_EVENTS)
        return 0;
    uint32_t n = atomic_fetch_add_explicit(&s->events[kind], 1, memory_order_relaxed) + 1;
    return n ? n : UINT32_MAX; /* saturates in effect: 2^32 events later, still "many" */
}

void *gg_sites_note(gg_site site)
{
    struct site *s = site_get(site);
    return s ? atomic_load_explicit(&s->note, memory_order_acquire) : NULL;
}

bool gg_sites_set_note(gg_site site, void *note)
{
    struct site *s = site_get(site);
    void *none = NULL;
    return s && atomic_compare_exchange_strong_explicit(&s->note, &none, note,
                                                        memory_order_release,
                                                        memory_order_relaxed);
}

size_t gg_sites_count(void)
{
    return atomic_load_explicit(&nsites, memory_order_acquire);
}

void gg_sites_after_fork(void)
{
    gg_spin_reset(&lock);
}

#ifdef GG_TESTING
void gg_sites_test_limit(size_t max_sites)
{
    if (max_sites == 0 || max_sites > SITES_CAP)
        max_sites = SITES_CAP;
    atomic_store_explicit(&limit, (uint32_t)max_sites, memory_order_relaxed);
}
#endif

/* ---- the largest sites ------------------------------------------------------ */

/* Largest first: more bytes, then more allocations, then the older site. */
static inline bool usage_before(const struct gg_site_usage *a, const struct gg_site_usage *b)
{
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes;
    if (a->allocs != b->allocs)
        return a->allocs > b->allocs;
    return a->site < b->site;
}

/* A heap whose root is the entry that sorts last. */
static void heap_down(struct gg_site_usage *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, last = i;
        if (l < n && usage_before(&h[last], &h[l]))
            last = l;
        if (r < n && usage_before(&h[last], &h[r]))
            last = r;
        if (last == i)
            return;
        struct gg_site_usage t = h[i];
        h[i] = h[last];
        h[last] = t;
        i = last;
    }
}

static void heap_up(struct gg_site_usage *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!usage_before(&h[p], &h[i]))
            return;
        struct gg_site_usage t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

size_t gg_sites_top(int dev, struct gg_site_usage *out, size_t max)
{
    if (!out || max == 0)
        return 0;
    uint32_t count = atomic_load_explicit(&nsites, memory_order_acquire);
    size_t n = 0;
    for (uint32_t id = 1; id <= count; id++) {
        struct site *s = site_at(id);
        if (!s || s->dev != dev)
            continue;
        int64_t bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed);
        if (bytes <= 0)
            continue;
        int64_t allocs = atomic_load_explicit(&s->allocs, memory_order_relaxed);
        struct gg_site_usage u = {id, (uint64_t)bytes, allocs > 0 ? (uint64_t)allocs : 0};
        if (n < max) {
            out[n] = u;
            heap_up(out, n++);
        } else if (usage_before(&u, &out[0])) {
            out[0] = u;
            heap_down(out, n, 0);
        }
    }
    /* Heap sort: the root (last in order) goes to the end each time. */
    for (size_t m = n; m > 1; m--) {
        struct gg_site_usage t = out[0];
        out[0] = out[m - 1];
        out[m - 1] = t;
        heap_down(out, m - 1, 0);
    }
    return n;
}
