/* unwind.c - layer 3: native stacks (see unwind.h). */
#include "unwind.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#include "prim.h"

/* ---- libunwind, loaded out of sight ------------------------------------------- */

/* Its one function the shim uses, by its real name. */
static struct {
    int (*backtrace)(void **, int);
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
    *(void **)&unw.backtrace = gg_real_dlsym(h, "unw_backtrace");
    unw_ok = unw.backtrace != NULL;
}

static inline bool unw_ready(void)
{
    pthread_once(&unw_once, unw_load);
    return unw_ok;
}

/* ---- the shim's own frames ------------------------------------------------------ */

#define SELF_RANGES 8
#define EXTRA_START 8 /* spare frames for the shim's own */
#define EXTRA_MAX 64

static uintptr_t self_lo[SELF_RANGES], self_hi[SELF_RANGES];
static int self_n;
static _Atomic int self_state; /* 0 unknown, 1 known */
static gg_spin self_lock = GG_SPIN_INIT;

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
    gg_spin_lock(&self_lock);
    if (force || !atomic_load_explicit(&self_state, memory_order_relaxed)) {
        for (int i = 0; i < n; i++) {
            self_lo[i] = lo[i];
            self_hi[i] = hi[i];
        }
        self_n = n;
        atomic_store_explicit(&self_state, 1, memory_order_release);
    }
    gg_spin_unlock(&self_lock);
}

/* The executable segments of the object this file is linked into, found
 * without holding a lock of ours: dl_iterate_phdr takes the loader's, and a
 * thread inside dlopen may be the one waiting for ours. */
static GG_COLD void self_find(void)
{
    struct self_search ss;
    memset(&ss, 0, sizeof ss);
    ss.anchor = (uintptr_t)&self_find;
    dl_iterate_phdr(self_cb, &ss);
    self_publish(ss.lo, ss.hi, ss.n, false);
}

#ifdef GG_TESTING
void gg_unwind_test_self(const uintptr_t *lo, const uintptr_t *hi, size_t n)
{
    if (!lo || !hi) {
        atomic_store_explicit(&self_state, 0, memory_order_release);
        return;
    }
    if (n > SELF_RANGES)
        n = SELF_RANGES;
    self_publish(lo, hi, (int)n, true);
}
#endif

static inline bool in_self(uintptr_t ip)
{
    for (int i = 0; i < self_n; i++)
        if (ip >= self_lo[i] && ip < self_hi[i])
            return true;
    return false;
}

/* Index of the first frame to keep: from the one that is `ra` (what
 * precedes it is the capture's own), then past every frame in the shim's
 * own code. */
static inline int own_frames(void *const *buf, int n, uintptr_t ra)
{
    int i = 0;
    for (int k = 0; k < n && k < 6; k++)
        if ((uintptr_t)buf[k] == ra) {
            i = k;
            break;
        }
    while (i < n && in_self((uintptr_t)buf[i]))
        i++;
    return i;
}

/* ---- capture ---------------------------------------------------------------------- */

static GG_TLS bool busy;                  /* a signal arrived mid-capture */
static _Atomic int extra_frames = EXTRA_START; /* frames asked for beyond depth */

__attribute__((noinline)) size_t gg_unwind_capture(uintptr_t *ips, size_t depth, uintptr_t ra)
{
    if (depth == 0 || busy)
        return 0;
    if (depth > GG_UNWIND_MAX)
        depth = GG_UNWIND_MAX;
    if (gg_unlikely(!unw_ready()))
        return 0;
    /* The raw frames: a kilobyte and more, on the side stack (prim.h). */
    void **buf = gg_side_push((GG_UNWIND_MAX + EXTRA_MAX) * sizeof *buf);
    if (!buf)
        return 0;
    busy = true;
    if (gg_unlikely(!atomic_load_explicit(&self_state, memory_order_acquire)))
        self_find();
    int extra = atomic_load_explicit(&extra_frames, memory_order_relaxed);
    int n, first;
    for (;;) {
        int want = (int)depth + extra;
        n = unw.backtrace(buf, want);
        if (n < 0)
            n = 0;
        first = own_frames(buf, n, ra);
        if (n < want || n - first >= (int)depth || extra >= EXTRA_MAX)
            break;
        /* The buffer filled up with our own frames: ask for more, and
         * remember it for the next capture. */
        int more = first + EXTRA_START;
        extra = more > EXTRA_MAX ? EXTRA_MAX : more;
        int seen = atomic_load_explicit(&extra_frames, memory_order_relaxed);
        while (seen < extra && !atomic_compare_exchange_weak_explicit(
                                   &extra_frames, &seen, extra, memory_order_relaxed,
                                   memory_order_relaxed))
            ;
    }
    size_t kept = (size_t)(n - first);
    if (kept > depth)
        kept = depth;
    for (size_t i = 0; i < kept; i++)
        ips[i] = (uintptr_t)buf[first + (int)i];
    busy = false;
    gg_side_pop(buf);
    return kept;
}

void gg_unwind_warmup(void)
{
    if (!atomic_load_explicit(&self_state, memory_order_acquire))
        self_find();
    if (busy || !unw_ready())
        return;
    busy = true;
    void *buf[GG_UNWIND_MAX];
    (void)unw.backtrace(buf, GG_UNWIND_MAX);
    busy = false;
}
