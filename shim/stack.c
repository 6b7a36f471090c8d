/* stack.c - native call stacks: capture cheaply, store once, symbolize late
 * (see stack.h).
 *
 * Capture: unw_backtrace (raw return addresses, libunwind's cached fast
 * path), then the frames that belong to us are dropped: first everything up
 * to our caller's return address (gg_stack_capture itself), then every
 * leading frame inside the shim's own executable segments (the hooks, the
 * guard), so frame 0 is the code that called the CUDA function.
 *
 * Storage: sites live in chunks of SITE_CHUNK records, mmap'd on demand and
 * never freed or moved, so a site id (1, 2, ...) is a stable index and
 * readers need no lock. Frames go to an mmap'd bump arena. A lookup is a
 * lock-free probe of an open-addressing index (slot = hash tag << 32 | id,
 * published with a release store); only an insertion takes the lock.
 *
 * Symbolization: each IP is resolved once (dladdr, then libunwind's reading
 * of the ELF symbol table for what dladdr cannot name) and cached in another
 * lock-free index; module and symbol names are copied and interned into an
 * mmap'd arena, so they survive a dlclose of the object they came from.
 *
 * IPs are kept raw: every stored frame is a return address (frame 0 too: it
 * is where the hook returns to in its caller). The symbol is looked up for
 * ip - 1, so a call that ends a function is attributed to that function;
 * `off` is still ip - symbol start (or ip - load base of the module when
 * there is no symbol), so `addr2line -e module off-1` finds the call line.
 *
 * Locks: one short spin lock per table, owned by a pid. A child forked while
 * a parent thread held it takes it over (the holder does not exist there);
 * every insertion publishes last, so an interrupted one leaves only unused
 * space. No lock is held across a call out of this file that could wait on
 * another lock (dl_iterate_phdr, dladdr and libunwind run outside them).
 * A capture re-entered on the same thread (a signal handler) gets
 * GG_SITE_NONE instead of waiting for itself. This file never mallocs,
 * prints or aborts; when a table is full the answer is GG_SITE_NONE (or an
 * uncached symbol).
 */
#define UNW_LOCAL_ONLY
#include "stack.h"

#include <dlfcn.h>
#include <libunwind.h>
#include <link.h>
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <pthread.h>

#define TLS __thread __attribute__((tls_model("initial-exec")))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* ---- libunwind, loaded out of sight ------------------------------------- */

/* Linked normally, libunwind's unversioned _Unwind_* would come before
 * libgcc_s's in every program the shim is preloaded into (python3 does not
 * link libgcc_s itself), and C++ unwinding would mix two unwinders: a
 * pthread_exit through C++ frames crashes. So it is loaded RTLD_LOCAL on the
 * first CUDA call, and its few functions are taken by their real names (the
 * header's macros give them: unw_init_local2 is _ULx86_64_init_local2). */
#define STR_(x) #x
#define STR(x) STR_(x)

static struct {
    int (*backtrace)(void **, int);
    int (*getcontext)(unw_context_t *);
    int (*init_local2)(unw_cursor_t *, unw_context_t *, int);
    int (*set_reg)(unw_cursor_t *, unw_regnum_t, unw_word_t);
    int (*get_proc_name)(unw_cursor_t *, char *, size_t, unw_word_t *);
} unw;
static pthread_once_t unw_once = PTHREAD_ONCE_INIT;
static bool unw_ok;

static void unw_load(void)
{
    void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        h = dlopen("libunwind.so", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return;
    *(void **)&unw.backtrace = dlsym(h, "unw_backtrace");
    *(void **)&unw.getcontext = dlsym(h, STR(unw_tdep_getcontext));
    *(void **)&unw.init_local2 = dlsym(h, STR(unw_init_local2));
    *(void **)&unw.set_reg = dlsym(h, STR(unw_set_reg));
    *(void **)&unw.get_proc_name = dlsym(h, STR(unw_get_proc_name));
    unw_ok = unw.backtrace != NULL; /* the rest only names frames */
}

/* Is libunwind there? Loads it the first time. */
static inline bool unw_ready(void)
{
    pthread_once(&unw_once, unw_load);
    return unw_ok;
}

/* ---- bounds ------------------------------------------------------------ */

#define SITES_CAP (1u << 20)              /* sites, ever */
#define SITE_CHUNK_BITS 12
#define SITE_CHUNK (1u << SITE_CHUNK_BITS) /* site records per mmap */
#define SITE_CHUNKS (SITES_CAP / SITE_CHUNK)
#define INDEX_SLOTS (SITES_CAP * 2)       /* load factor <= 1/2 */

#define ARENA_CHUNK (1u << 20)            /* bytes per arena mmap */
#define FRAME_ARENA_CHUNKS 64             /* 64 MiB of frames */
#define SYM_ARENA_CHUNKS 32               /* 32 MiB of names and entries */

#define SYM_SLOTS (1u << 17)              /* symbolized IPs: half of this */
#define STR_SLOTS (1u << 16)              /* interned strings: half of this */
#define NAME_MAX_LEN 4096                 /* longer names are cut */

#define SELF_RANGES 8
#define EXTRA_START 8                     /* spare frames for the shim's own */
#define EXTRA_MAX 64

/* ---- small helpers ----------------------------------------------------- */

static void *pages(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield" ::: "memory");
#endif
}

/* A spin lock owned by a process id: 0 is free. A lock held by another
 * process can only be a parent's, inherited through fork, whose holder does
 * not exist here: it is taken over. */
struct plock { _Atomic int owner; };

static void plock_lock(struct plock *l)
{
    int me = (int)getpid();
    for (unsigned spins = 0;; spins++) {
        int cur = 0;
        if (atomic_compare_exchange_weak_explicit(&l->owner, &cur, me, memory_order_acquire,
                                                  memory_order_relaxed))
            return;
        if (cur != 0 && cur != me &&
            atomic_compare_exchange_strong_explicit(&l->owner, &cur, me, memory_order_acquire,
                                                    memory_order_relaxed))
            return;
        if (spins < 64)
            cpu_relax();
        else
            sched_yield();
    }
}

static void plock_unlock(struct plock *l)
{
    atomic_store_explicit(&l->owner, 0, memory_order_release);
}

/* A bump allocator over mmap'd chunks, never freed. Only under a lock. */
struct arena {
    char *cur;
    size_t left;
    unsigned chunks, max_chunks;
};

static void *arena_alloc(struct arena *a, size_t size, size_t align)
{
    if (size == 0 || size > ARENA_CHUNK)
        return NULL;
    size_t pad = (align - ((uintptr_t)a->cur & (align - 1))) & (align - 1);
    if (!a->cur || pad + size > a->left) {
        if (a->chunks >= a->max_chunks)
            return NULL;
        char *p = pages(ARENA_CHUNK);
        if (!p)
            return NULL;
        a->chunks++;
        a->cur = p;
        a->left = ARENA_CHUNK;
        pad = 0;
    }
    void *r = a->cur + pad;
    a->cur += pad + size;
    a->left -= pad + size;
    return r;
}

static inline uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* ---- the site table ---------------------------------------------------- */

struct site {
    _Alignas(64) _Atomic int64_t bytes;   /* held through this site now */
    _Atomic int64_t allocs;
    uint64_t hash;
    const uintptr_t *frames;
    int32_t dev;
    uint32_t depth;
};

static _Atomic(struct site *) g_site_chunks[SITE_CHUNKS];
static _Atomic uint32_t g_nsites;              /* ids 1..g_nsites exist */
static _Atomic(_Atomic uint64_t *) g_index;    /* INDEX_SLOTS, lazily */
static _Atomic uint32_t g_site_limit = SITES_CAP;
static struct plock g_site_lock;
static struct arena g_frames = { NULL, 0, 0, FRAME_ARENA_CHUNKS };

static inline struct site *site_at(uint32_t id)
{
    uint32_t i = id - 1;
    struct site *c = atomic_load_explicit(&g_site_chunks[i >> SITE_CHUNK_BITS],
                                          memory_order_acquire);
    return c ? &c[i & (SITE_CHUNK - 1)] : NULL;
}

/* The site for an id handed out earlier; NULL for GG_SITE_NONE and junk. */
static inline struct site *site_get(gg_site id)
{
    if (id == GG_SITE_NONE || id > atomic_load_explicit(&g_nsites, memory_order_acquire))
        return NULL;
    return site_at(id);
}

static inline uint64_t hash_stack(int dev, const uintptr_t *ips, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(uint32_t)dev << 32) ^ n;
    for (size_t i = 0; i < n; i++)
        h = (((h << 23) | (h >> 41)) ^ ips[i]) * 0x100000001b3ULL;
    return mix64(h);
}

static inline bool site_is(const struct site *s, uint64_t h, int dev, const uintptr_t *ips,
                           size_t n)
{
    return s->hash == h && s->dev == dev && s->depth == n &&
           (n == 0 || memcmp(s->frames, ips, n * sizeof *ips) == 0);
}

/* Probe the index: the id, or 0 with *empty the first free slot. */
static uint32_t index_find(_Atomic uint64_t *idx, uint64_t h, int dev, const uintptr_t *ips,
                           size_t n, size_t *empty)
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
            if (s && site_is(s, h, dev, ips, n))
                return id;
        }
        i = (i + 1) & (INDEX_SLOTS - 1);
    }
    *empty = SIZE_MAX;
    return 0;
}

static gg_site site_insert(uint64_t h, int dev, const uintptr_t *ips, size_t n)
{
    gg_site id = GG_SITE_NONE;
    plock_lock(&g_site_lock);
    _Atomic uint64_t *idx = atomic_load_explicit(&g_index, memory_order_relaxed);
    if (!idx) {
        idx = pages((size_t)INDEX_SLOTS * sizeof *idx);
        if (!idx)
            goto out;
        atomic_store_explicit(&g_index, idx, memory_order_release);
    }
    size_t slot;
    id = index_find(idx, h, dev, ips, n, &slot);   /* another thread was first? */
    if (id != GG_SITE_NONE || slot == SIZE_MAX)
        goto out;

    uint32_t count = atomic_load_explicit(&g_nsites, memory_order_relaxed);
    if (count >= atomic_load_explicit(&g_site_limit, memory_order_relaxed) || count >= SITES_CAP)
        goto out;
    uintptr_t *frames = NULL;
    if (n) {
        frames = arena_alloc(&g_frames, n * sizeof *frames, sizeof *frames);
        if (!frames)
            goto out;
        memcpy(frames, ips, n * sizeof *frames);
    }
    _Atomic(struct site *) *chunkp = &g_site_chunks[count >> SITE_CHUNK_BITS];
    struct site *chunk = atomic_load_explicit(chunkp, memory_order_relaxed);
    if (!chunk) {
        chunk = pages(SITE_CHUNK * sizeof *chunk);
        if (!chunk)
            goto out;
        atomic_store_explicit(chunkp, chunk, memory_order_release);
    }
    struct site *s = &chunk[count & (SITE_CHUNK - 1)];
    atomic_store_explicit(&s->bytes, 0, memory_order_relaxed);
    atomic_store_explicit(&s->allocs, 0, memory_order_relaxed);
    s->hash = h;
    s->frames = frames;
    s->dev = dev;
    s->depth = (uint32_t)n;
    id = count + 1;
    /* Publish the record, then the index entry that leads to it. */
    atomic_store_explicit(&g_nsites, id, memory_order_release);
    atomic_store_explicit(&idx[slot], (h >> 32) << 32 | id, memory_order_release);
out:
    plock_unlock(&g_site_lock);
    return id;
}

static gg_site site_intern(int dev, const uintptr_t *ips, size_t n)
{
    uint64_t h = hash_stack(dev, ips, n);
    _Atomic uint64_t *idx = atomic_load_explicit(&g_index, memory_order_acquire);
    if (likely(idx != NULL)) {
        size_t empty;
        gg_site id = index_find(idx, h, dev, ips, n, &empty);
        if (likely(id != GG_SITE_NONE))
            return id;
    }
    return site_insert(h, dev, ips, n);
}

gg_site gg_stack_intern(int dev, const uintptr_t *ips, size_t n)
{
    if (n > GG_STACK_MAX_DEPTH || (n && !ips))
        return GG_SITE_NONE;
    return site_intern(dev, ips, n);
}

/* ---- the shim's own frames ---------------------------------------------- */

static uintptr_t g_self_lo[SELF_RANGES], g_self_hi[SELF_RANGES];
static int g_self_n;
static _Atomic int g_self_state;          /* 0 unknown, 1 known */
static struct plock g_self_lock;

struct self_search {
    uintptr_t anchor;
    uintptr_t lo[SELF_RANGES], hi[SELF_RANGES];
    int n;
};

static int self_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct self_search *ss = arg;
    bool mine = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && ss->anchor >= lo && ss->anchor < lo + ph->p_memsz)
            mine = true;
    }
    if (!mine)
        return 0;
    for (int i = 0; i < info->dlpi_phnum && ss->n < SELF_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            ss->lo[ss->n] = info->dlpi_addr + ph->p_vaddr;
            ss->hi[ss->n] = ss->lo[ss->n] + ph->p_memsz;
            ss->n++;
        }
    }
    return 1;
}

/* Set the ranges; unless `force`, only when none are known yet. */
static void self_publish(const uintptr_t *lo, const uintptr_t *hi, int n, bool force)
{
    plock_lock(&g_self_lock);
    if (force || !atomic_load_explicit(&g_self_state, memory_order_relaxed)) {
        for (int i = 0; i < n; i++) {
            g_self_lo[i] = lo[i];
            g_self_hi[i] = hi[i];
        }
        g_self_n = n;
        atomic_store_explicit(&g_self_state, 1, memory_order_release);
    }
    plock_unlock(&g_self_lock);
}

/* The executable segments of the object this file is linked into. Found
 * without holding a lock of ours: dl_iterate_phdr takes the loader's, and a
 * thread inside dlopen may be the one waiting for ours. */
static __attribute__((cold, noinline)) void self_find(void)
{
    struct self_search ss;
    memset(&ss, 0, sizeof ss);
    ss.anchor = (uintptr_t)&self_find;
    dl_iterate_phdr(self_cb, &ss);
    self_publish(ss.lo, ss.hi, ss.n, false);
}

void gg_stack_test_self(const uintptr_t *lo, const uintptr_t *hi, size_t n)
{
    if (!lo || !hi) {
        atomic_store_explicit(&g_self_state, 0, memory_order_release);
        return;
    }
    if (n > SELF_RANGES)
        n = SELF_RANGES;
    self_publish(lo, hi, (int)n, true);
}

static inline bool in_self(uintptr_t ip)
{
    for (int i = 0; i < g_self_n; i++)
        if (ip >= g_self_lo[i] && ip < g_self_hi[i])
            return true;
    return false;
}

/* Index of the first frame to keep: past our caller's return address `ra`
 * (what precedes it is gg_stack_capture itself), then past every frame in
 * the shim's own code. */
static inline int own_frames(void *const *buf, int n, uintptr_t ra)
{
    int i = 0;
    for (int k = 0; k < n && k < 4; k++)
        if ((uintptr_t)buf[k] == ra) {
            i = k;
            break;
        }
    while (i < n && in_self((uintptr_t)buf[i]))
        i++;
    return i;
}

/* ---- capture ------------------------------------------------------------ */

static TLS bool t_busy;                      /* a signal arrived mid-capture */
static _Atomic int g_extra = EXTRA_START;    /* frames asked for beyond depth */

__attribute__((noinline)) gg_site gg_stack_capture(int dev, int depth)
{
    if (depth <= 0 || t_busy)
        return GG_SITE_NONE;
    if (depth > GG_STACK_MAX_DEPTH)
        depth = GG_STACK_MAX_DEPTH;
    if (unlikely(!unw_ready()))
        return GG_SITE_NONE;
    t_busy = true;
    uintptr_t ra = (uintptr_t)__builtin_return_address(0);
    if (unlikely(!atomic_load_explicit(&g_self_state, memory_order_acquire)))
        self_find();

    void *buf[GG_STACK_MAX_DEPTH + EXTRA_MAX];
    int extra = atomic_load_explicit(&g_extra, memory_order_relaxed);
    int n, first;
    for (;;) {
        int want = depth + extra;
        n = unw.backtrace(buf, want);
        if (n < 0)
            n = 0;
        first = own_frames(buf, n, ra);
        if (n < want || n - first >= depth || extra >= EXTRA_MAX)
            break;
        /* The buffer filled up with our own frames: ask for more, and
         * remember it for the next capture. */
        int more = first + EXTRA_START;
        extra = more > EXTRA_MAX ? EXTRA_MAX : more;
        int seen = atomic_load_explicit(&g_extra, memory_order_relaxed);
        while (seen < extra && !atomic_compare_exchange_weak_explicit(
                                   &g_extra, &seen, extra, memory_order_relaxed,
                                   memory_order_relaxed))
            ;
    }
    size_t kept = (size_t)(n - first);
    if (kept > (size_t)depth)
        kept = (size_t)depth;
    if (kept == 0) {   /* nothing unwound, or nothing but the shim */
        t_busy = false;
        return GG_SITE_NONE;
    }
    uintptr_t ips[GG_STACK_MAX_DEPTH];
    for (size_t i = 0; i < kept; i++)
        ips[i] = (uintptr_t)buf[first + (int)i];
    gg_site site = site_intern(dev, ips, kept);
    t_busy = false;
    return site;
}

void gg_stack_warmup(void)
{
    if (!atomic_load_explicit(&g_self_state, memory_order_acquire))
        self_find();
    if (t_busy || !unw_ready())
        return;
    t_busy = true;
    void *buf[GG_STACK_MAX_DEPTH];
    (void)unw.backtrace(buf, GG_STACK_MAX_DEPTH);
    t_busy = false;
}

/* ---- sites --------------------------------------------------------------- */

size_t gg_stack_frames(gg_site site, const uintptr_t **ips)
{
    struct site *s = site_get(site);
    if (ips)
        *ips = s ? s->frames : NULL;
    return s ? s->depth : 0;
}

int gg_site_device(gg_site site)
{
    struct site *s = site_get(site);
    return s ? s->dev : -1;
}

void gg_site_charge(gg_site site, int64_t bytes, int64_t allocs)
{
    struct site *s = site_get(site);
    if (!s)
        return;
    if (bytes)
        atomic_fetch_add_explicit(&s->bytes, bytes, memory_order_relaxed);
    if (allocs)
        atomic_fetch_add_explicit(&s->allocs, allocs, memory_order_relaxed);
}

size_t gg_stack_sites(void)
{
    return atomic_load_explicit(&g_nsites, memory_order_acquire);
}

void gg_stack_test_limit(size_t max_sites)
{
    if (max_sites == 0 || max_sites > SITES_CAP)
        max_sites = SITES_CAP;
    atomic_store_explicit(&g_site_limit, (uint32_t)max_sites, memory_order_relaxed);
}

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

size_t gg_site_top(int dev, struct gg_site_usage *out, size_t max)
{
    if (!out || max == 0)
        return 0;
    uint32_t count = atomic_load_explicit(&g_nsites, memory_order_acquire);
    size_t n = 0;
    for (uint32_t id = 1; id <= count; id++) {
        struct site *s = site_at(id);
        if (!s || s->dev != dev)
            continue;
        int64_t bytes = atomic_load_explicit(&s->bytes, memory_order_relaxed);
        if (bytes <= 0)
            continue;
        int64_t allocs = atomic_load_explicit(&s->allocs, memory_order_relaxed);
        struct gg_site_usage u = { id, (uint64_t)bytes, allocs > 0 ? (uint64_t)allocs : 0 };
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

/* ---- symbolization --------------------------------------------------------- */

struct sym_entry {
    uintptr_t ip;
    struct gg_frame_info info;
};

static _Atomic(_Atomic(struct sym_entry *) *) g_sym_index;   /* SYM_SLOTS */
static uint32_t g_sym_count;                                /* under g_sym_lock */
static const char **g_str_index;                            /* STR_SLOTS, under lock */
static uint32_t g_str_count;
static struct arena g_sym_arena = { NULL, 0, 0, SYM_ARENA_CHUNKS };
static struct plock g_sym_lock;

static const struct sym_entry *sym_cached(uintptr_t ip)
{
    _Atomic(struct sym_entry *) *idx = atomic_load_explicit(&g_sym_index, memory_order_acquire);
    if (!idx)
        return NULL;
    size_t i = (size_t)mix64(ip) & (SYM_SLOTS - 1);
    for (size_t probes = 0; probes < SYM_SLOTS; probes++) {
        struct sym_entry *e = atomic_load_explicit(&idx[i], memory_order_acquire);
        if (!e || e->ip == ip)
            return e;
        i = (i + 1) & (SYM_SLOTS - 1);
    }
    return NULL;
}

/* A copy of s (cut at NAME_MAX_LEN) that lives as long as the process;
 * equal strings share one copy. NULL when out of space. Under g_sym_lock. */
static const char *str_intern(const char *s)
{
    size_t len = strnlen(s, NAME_MAX_LEN - 1);
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
    if (!g_str_index)
        g_str_index = pages((size_t)STR_SLOTS * sizeof *g_str_index);
    size_t slot = SIZE_MAX;
    if (g_str_index) {
        size_t i = (size_t)mix64(h) & (STR_SLOTS - 1);
        for (size_t probes = 0; probes < STR_SLOTS; probes++) {
            const char *t = g_str_index[i];
            if (!t) {
                slot = i;
                break;
            }
            if (strncmp(t, s, len) == 0 && t[len] == '\0')
                return t;
            i = (i + 1) & (STR_SLOTS - 1);
        }
    }
    char *copy = arena_alloc(&g_sym_arena, len + 1, 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    if (slot != SIZE_MAX && g_str_count < STR_SLOTS / 2) {
        g_str_index[slot] = copy;
        g_str_count++;
    }
    return copy;
}

/* libunwind's name for the procedure holding `ip` (it reads the ELF symbol
 * table, so it knows static functions that dladdr cannot see); *off is
 * relative to ip. */
static bool unw_name(uintptr_t ip, char *buf, size_t cap, uint64_t *off)
{
    unw_word_t o = 0;
    buf[0] = '\0';
    if (!unw_ready() || !unw.getcontext || !unw.init_local2 || !unw.set_reg ||
        !unw.get_proc_name)
        return false;
    /* No lookup by address in every libunwind: point a local cursor at it. */
    unw_context_t uc;
    unw_cursor_t c;
    if (unw.getcontext(&uc) != 0 || unw.init_local2(&c, &uc, UNW_INIT_SIGNAL_FRAME) != 0 ||
        unw.set_reg(&c, UNW_REG_IP, (unw_word_t)ip) != 0)
        return false;
    int rc = unw.get_proc_name(&c, buf, cap, &o);
    if ((rc != 0 && rc != -UNW_ENOMEM) || buf[0] == '\0')
        return false;
    buf[cap - 1] = '\0';
    *off = o;
    return true;
}

/* Resolve without the cache. Strings may point into `name` and `path`, or
 * into the loader's own tables. */
static void resolve(uintptr_t ip, struct gg_frame_info *fi, char *name, size_t name_cap,
                    char *path, size_t path_cap)
{
    memset(fi, 0, sizeof *fi);
    uintptr_t look = ip ? ip - 1 : 0;   /* a return address: the call is before it */
    Dl_info di;
    struct link_map *lm = NULL;
    memset(&di, 0, sizeof di);
    uintptr_t base = 0;
    if (dladdr1((void *)look, &di, (void **)&lm, RTLD_DL_LINKMAP) != 0) {
        fi->module = di.dli_fname;
        base = lm ? (uintptr_t)lm->l_addr : (uintptr_t)di.dli_fbase;
        if (lm && lm->l_name && lm->l_name[0] == '\0') {
            /* The main program: dladdr says argv[0], which may be no path. */
            ssize_t k = readlink("/proc/self/exe", path, path_cap - 1);
            if (k > 0) {
                path[k] = '\0';
                fi->module = path;
            }
        }
        if (fi->module && fi->module[0] == '\0')
            fi->module = NULL;
        if (di.dli_sname && di.dli_saddr) {
            fi->sym = di.dli_sname;
            fi->off = ip - (uintptr_t)di.dli_saddr;
            fi->has_off = true;
            return;
        }
    }
    uint64_t off;
    if (unw_name(look, name, name_cap, &off)) {
        fi->sym = name;
        fi->off = off + (ip - look);
        fi->has_off = true;
        return;
    }
    if (fi->module) {
        fi->off = ip - base;
        fi->has_off = true;
    }
}

/* Store a resolution; the cached entry, or NULL when out of space. */
static const struct sym_entry *sym_store(uintptr_t ip, const struct gg_frame_info *fi)
{
    const struct sym_entry *r = NULL;
    plock_lock(&g_sym_lock);
    _Atomic(struct sym_entry *) *idx = atomic_load_explicit(&g_sym_index, memory_order_relaxed);
    if (!idx) {
        idx = pages((size_t)SYM_SLOTS * sizeof *idx);
        if (!idx)
            goto out;
        atomic_store_explicit(&g_sym_index, idx, memory_order_release);
    }
    size_t i = (size_t)mix64(ip) & (SYM_SLOTS - 1);
    for (;;) {
        struct sym_entry *e = atomic_load_explicit(&idx[i], memory_order_relaxed);
        if (!e)
            break;
        if (e->ip == ip) {   /* another thread was first */
            r = e;
            goto out;
        }
        i = (i + 1) & (SYM_SLOTS - 1);
    }
    if (g_sym_count >= SYM_SLOTS / 2)
        goto out;
    struct sym_entry *e = arena_alloc(&g_sym_arena, sizeof *e, _Alignof(struct sym_entry));
    if (!e)
        goto out;
    e->ip = ip;
    e->info = *fi;
    if ((fi->module && !(e->info.module = str_intern(fi->module))) ||
        (fi->sym && !(e->info.sym = str_intern(fi->sym))))
        goto out;   /* the entry's space is lost, never published */
    g_sym_count++;
    atomic_store_explicit(&idx[i], e, memory_order_release);
    r = e;
out:
    plock_unlock(&g_sym_lock);
    return r;
}

bool gg_stack_symbolize(uintptr_t ip, struct gg_frame_info *out)
{
    const struct sym_entry *e = sym_cached(ip);
    if (!e) {
        char name[NAME_MAX_LEN], path[PATH_MAX];
        struct gg_frame_info fi;
        resolve(ip, &fi, name, sizeof name, path, sizeof path);
        e = sym_store(ip, &fi);
    }
    if (!e) {
        memset(out, 0, sizeof *out);
        return false;
    }
    *out = e->info;
    return true;
}

static void frame_json(struct gg_json *j, uintptr_t ip)
{
    char name[NAME_MAX_LEN], path[PATH_MAX];
    struct gg_frame_info fi;
    const struct sym_entry *e = sym_cached(ip);
    if (!e) {
        resolve(ip, &fi, name, sizeof name, path, sizeof path);
        e = sym_store(ip, &fi);   /* when that fails, fi is still good for this line */
    }
    if (e)
        fi = e->info;
    gg_json_obj(j);
    gg_json_key(j, "ip");
    gg_json_hex(j, ip);
    gg_json_kstr(j, "module", fi.module);
    gg_json_kstr(j, "sym", fi.sym);
    gg_json_key(j, "off");
    if (fi.has_off)
        gg_json_u64(j, fi.off);
    else
        gg_json_null(j);
    gg_json_obj_end(j);
}

void gg_stack_json(struct gg_json *j, gg_site site)
{
    const uintptr_t *ips;
    size_t n = gg_stack_frames(site, &ips);
    gg_json_arr(j);
    for (size_t i = 0; i < n; i++)
        frame_json(j, ips[i]);
    gg_json_arr_end(j);
}
