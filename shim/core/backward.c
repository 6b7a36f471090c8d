/* backward.c - layer 4: `backward` lines, thinned per call site (see
 * backward.h). */
#include "backward.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>

#include "budget.h"
#include "events.h"
#include "prim.h"
#include "torch.h"

#define SITES 1024          /* call sites counted apart; the rest share one count */
#define FILE_MAX 512
#define FUNC_MAX 256
#define THREAD_MAX 64

/* Call sites by the hash of their frames (0: a free slot), with their counts. */
static struct {
    _Atomic uint64_t key;
    _Atomic uint64_t count;
} sites[SITES];
static _Atomic uint64_t others; /* calls of sites that found no slot */
static _Atomic uint64_t calls;  /* every call, thinned lines or not */

/* The latest call, kept while its line is not written. */
static struct latest {
    uint64_t ns, count, step;
    bool has_step;
    int n;
    char thread[THREAD_MAX];
    struct {
        char file[FILE_MAX];
        char func[FUNC_MAX];
        int line;
    } f[GG_BACKWARD_FRAMES];
} latest;
static _Atomic bool unwritten;
static gg_spin latest_lock = GG_SPIN_INIT;

static uint64_t site_key(const struct gpuguard_pyframe *f, int n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; i++) {
        const char *file = f[i].file ? f[i].file : "", *func = f[i].func ? f[i].func : "";
        h = gg_mix64(h ^ gg_hash_bytes(file, strnlen(file, FILE_MAX)));
        h = gg_mix64(h ^ gg_hash_bytes(func, strnlen(func, FUNC_MAX)));
        h = gg_mix64(h ^ (uint64_t)(uint32_t)f[i].line);
    }
    return h ? h : 1;
}

/* The site's slot, claimed when new; NULL when the table is full. */
static _Atomic uint64_t *site_count(uint64_t key, bool claim)
{
    for (unsigned i = 0, at = (unsigned)(key % SITES); i < 64; i++, at = (at + 1) % SITES) {
        uint64_t k = atomic_load_explicit(&sites[at].key, memory_order_acquire);
        if (k == key)
            return &sites[at].count;
        if (k == 0) {
            if (!claim)
                return NULL;
            uint64_t free_slot = 0;
            if (atomic_compare_exchange_strong(&sites[at].key, &free_slot, key) || free_slot == key)
                return &sites[at].count;
        }
    }
    return claim ? &others : NULL;
}

static void copy_str(char *out, size_t cap, const char *s)
{
    size_t n = s ? strnlen(s, cap - 1) : 0;
    while (n > 0 && s[n] && ((unsigned char)s[n] & 0xC0) == 0x80)
        n--; /* cut at a character boundary */
    if (n)
        memcpy(out, s, n);
    out[n] = '\0';
}

/* Write the kept call's line (it was thinned out); under no lock. */
static void write_kept(void)
{
    struct latest *c = gg_side_push(sizeof *c);
    if (!c)
        return;
    if (!gg_spin_trylock(&latest_lock, 1000)) {
        gg_side_pop(c);
        return;
    }
    bool due = atomic_exchange(&unwritten, false);
    if (due)
        *c = latest;
    gg_spin_unlock(&latest_lock);
    if (due) {
        struct gpuguard_pyframe f[GG_BACKWARD_FRAMES];
        for (int i = 0; i < c->n; i++)
            f[i] = (struct gpuguard_pyframe){c->f[i].file, c->f[i].func, c->f[i].line};
        gg_events_backward(gg_clock_at(c->ns), c->thread, f, c->n, c->has_step, c->step, c->count);
    }
    gg_side_pop(c);
}

void gg_backward_call(const struct gpuguard_pyframe *f, int n, const char *thread)
{
    if (!f || n < 0)
        n = 0;
    if (n > GG_BACKWARD_FRAMES)
        n = GG_BACKWARD_FRAMES;
    char name[THREAD_MAX] = "";
    if (thread)
        copy_str(name, sizeof name, thread);
    else
        prctl(PR_GET_NAME, name, 0, 0, 0); /* 16 bytes at most, NUL included */
    uint64_t now = gg_now_ns(), step = 0;
    bool has_step = gg_torch_step(&step);
    atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed);
    uint64_t count = atomic_fetch_add(site_count(site_key(f, n), true), 1) + 1;
    bool write = gg_budget_thin(count);
    if (write) {
        if (atomic_exchange(&unwritten, false)) /* a kept call, superseded by this one */
            gg_events_suppress(GG_EVENT_backward);
        gg_events_backward(gg_clock_at(now), name, f, n, has_step, step, count);
        return;
    }
    /* Kept for the next incident; the call it replaces was left out for good. */
    if (!gg_spin_trylock(&latest_lock, 1000)) {
        gg_events_suppress(GG_EVENT_backward);
        return;
    }
    if (atomic_load(&unwritten))
        gg_events_suppress(GG_EVENT_backward);
    latest.ns = now;
    latest.count = count;
    latest.step = step;
    latest.has_step = has_step;
    latest.n = n;
    copy_str(latest.thread, sizeof latest.thread, name);
    for (int i = 0; i < n; i++) {
        copy_str(latest.f[i].file, FILE_MAX, f[i].file ? f[i].file : "?");
        copy_str(latest.f[i].func, FUNC_MAX, f[i].func ? f[i].func : "?");
        latest.f[i].line = f[i].line;
    }
    atomic_store(&unwritten, true);
    gg_spin_unlock(&latest_lock);
}

void gg_backward_flush(void)
{
    if (atomic_load_explicit(&unwritten, memory_order_relaxed))
        write_kept();
}

uint64_t gg_backward_calls(void)
{
    return atomic_load_explicit(&calls, memory_order_relaxed);
}

#ifdef GG_TESTING
uint64_t gg_backward_count(const struct gpuguard_pyframe *f, int n)
{
    if (n > GG_BACKWARD_FRAMES)
        n = GG_BACKWARD_FRAMES;
    _Atomic uint64_t *c = site_count(site_key(f, n < 0 ? 0 : n), false);
    return c ? atomic_load(c) : 0;
}
#endif

void gg_backward_after_fork(void)
{
    gg_spin_reset(&latest_lock);
}

#ifdef GG_TESTING
void gg_backward_reset(void)
{
    for (int i = 0; i < SITES; i++) {
        atomic_store(&sites[i].key, 0);
        atomic_store(&sites[i].count, 0);
    }
    atomic_store(&others, 0);
    atomic_store(&calls, 0);
    atomic_store(&unwritten, false);
    gg_spin_reset(&latest_lock);
}
#endif
