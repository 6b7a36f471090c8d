/* arch.c - device code against the GPUs, in the process (see arch.h). */
#include "arch.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "events.h"
#include "fatbin.h"
#include "origin.h"
#include "prim.h"

#define MAX_MODULES 512
#define MAX_SEGS 8
#define PATH_CAP 1024
#define SEEN_SLOTS 8192 /* power of two */
#define MAX_CANDIDATES 128

/* A loaded object as dl_iterate_phdr shows it. */
struct object {
    uintptr_t key;                         /* its lowest mapped address: unique while loaded */
    uintptr_t lo, hi;                      /* its mapped range */
    unsigned nseg;
    struct gg_fatbin_range seg[MAX_SEGS];  /* readable PT_LOAD ranges */
    char path[PATH_CAP];                   /* "" for the main program */
};

/* An object with device code, or with fat binaries registered through the
 * shim. Appended, never moved or freed: readers need no lock. */
struct module {
    struct object obj;
    _Atomic bool checked;            /* claimed by the one thread that checks it */
    uintptr_t reg_first, reg_last;   /* the registered wrappers' range; 0 if none */
    _Atomic unsigned long long subs; /* the loader's unload count when last confirmed */
};

static struct table {
    gg_spin lock;                    /* appends and registration ranges */
    _Atomic unsigned n;
    struct module m[MAX_MODULES];
} *_Atomic table;

/* What a scan keeps between scans; touched only by the scanning thread. */
static struct scan_state {
    unsigned long long adds, subs;   /* the loader's counters this scan saw */
    bool primed;                     /* a scan ran before */
    uintptr_t seen[SEEN_SLOTS];      /* objects looked at (their keys) */
    unsigned nseen;
    unsigned ncand;
    bool full;                       /* more new objects than candidates: scan again */
    struct object cand[MAX_CANDIDATES];
} *_Atomic scan_st;

static atomic_flag scanning = ATOMIC_FLAG_INIT;
static _Atomic bool table_stuck;     /* the table's lock was never free: left alone */
static _Atomic unsigned long long last_adds, last_subs;
static _Atomic unsigned last_hit;    /* the module the last registration came from, + 1 */

static void *alloc_once(void *_Atomic *slot, size_t size)
{
    void *p = atomic_load_explicit(slot, memory_order_acquire);
    if (p)
        return p;
    void *fresh = gg_pages(size), *expected = NULL;
    if (!fresh)
        return NULL;
    if (!atomic_compare_exchange_strong(slot, &expected, fresh)) {
        gg_pages_free(fresh, size);
        return expected;
    }
    return fresh;
}

static struct table *get_table(void)
{
    if (atomic_load_explicit(&table_stuck, memory_order_relaxed))
        return NULL;
    return alloc_once((void *_Atomic *)&table, sizeof(struct table));
}

/* A lock that gives up: a registration may come from a forked child whose
 * parent held it, and bookkeeping is never worth a hang. Once it gave up,
 * the table is left alone for good (registrations are still forwarded). */
static bool try_lock(gg_spin *s)
{
    for (int i = 0; i < 2000 && !atomic_load_explicit(&table_stuck, memory_order_relaxed); i++) {
        if (!atomic_flag_test_and_set_explicit(&s->f, memory_order_acquire))
            return true;
        if (i > 64)
            sched_yield();
    }
    atomic_store(&table_stuck, true);
    return false;
}

/* ---- loaded objects ------------------------------------------------------ */

static void object_from(const struct dl_phdr_info *info, struct object *o)
{
    o->lo = UINTPTR_MAX;
    o->hi = 0;
    o->nseg = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !ph->p_memsz)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        if (a < o->lo)
            o->lo = a;
        if (b > o->hi)
            o->hi = b;
        if ((ph->p_flags & PF_R) && o->nseg < MAX_SEGS)
            o->seg[o->nseg++] = (struct gg_fatbin_range){a, b};
    }
    o->key = o->lo;
    const char *name = info->dlpi_name ? info->dlpi_name : "";
    size_t n = strlen(name);
    if (n >= sizeof o->path)
        n = 0; /* too long to open by name: treated as unreadable */
    memcpy(o->path, name, n);
    o->path[n] = '\0';
}

struct find {
    uintptr_t addr;
    struct object *out;
    bool found;
};

/* The callback only copies: dl_iterate_phdr holds the loader's lock. */
static int find_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    struct find *f = ctx;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && f->addr >= a && f->addr - a < ph->p_memsz) {
            object_from(info, f->out);
            f->found = true;
            return 1;
        }
    }
    return 0;
}

/* ---- the module table ---------------------------------------------------- */

/* The module recorded for object o: same address and file (a library
 * unloaded and another loaded in its place is another module). */
static struct module *module_of(struct table *t, const struct object *o)
{
    unsigned n = atomic_load_explicit(&t->n, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (t->m[i].obj.key == o->key && !strcmp(t->m[i].obj.path, o->path))
            return &t->m[i];
    return NULL;
}

/* The module of object o, added if new (`subs`: the loader's unload count
 * now); NULL when the table is full or busy. */
static struct module *module_get(struct table *t, const struct object *o,
                                 unsigned long long subs)
{
    if (!try_lock(&t->lock))
        return NULL;
    struct module *m = module_of(t, o);
    unsigned n = atomic_load_explicit(&t->n, memory_order_relaxed);
    if (!m && n < MAX_MODULES) {
        m = &t->m[n];
        m->obj = *o;
        m->subs = subs;
        atomic_store_explicit(&t->n, n + 1, memory_order_release);
    } else if (m) {
        m->subs = subs; /* still the same library */
    }
    gg_spin_unlock(&t->lock);
    return m;
}

/* Was the file at path judged already, as another module (the same library
 * unloaded and loaded again at another address)? A module is judged once
 * per file: what it carries does not change with where it is mapped. */
static bool judged_before(struct table *t, const char *path, const struct module *self)
{
    if (!path[0])
        return false; /* the main program: loaded once */
    unsigned n = atomic_load_explicit(&t->n, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (&t->m[i] != self && atomic_load(&t->m[i].checked) && !strcmp(t->m[i].obj.path, path))
            return true;
    return false;
}

/* ---- judging -------------------------------------------------------------- */

/* Whose a module is, in its user's terms (origin.h), found once per
 * report and only for a module some GPU cannot run: dpkg's lists and
 * wheels' records are read, at this cold point only. */
struct whose {
    bool known;
    struct gg_origin lib, torch;
    bool torch_here;  /* the process holds PyTorch's libraries */
    char who[640];    /* "It is NCCL, from ...", or "" */
};

struct torch_find {
    char path[PATH_CAP];
    bool found;
};

static int torch_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    (void)size;
    struct torch_find *f = ctx;
    const char *name = info->dlpi_name ? info->dlpi_name : "", *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    if (strncmp(b, "libtorch_cuda.", 14) && strncmp(b, "libc10_cuda.", 12) &&
        strncmp(b, "libtorch.", 9))
        return 0;
    snprintf(f->path, sizeof f->path, "%s", name);
    f->found = true;
    return 1;
}

static void whose_of(const char *path, struct whose *w)
{
    if (w->known)
        return;
    w->known = true;
    gg_origin_of(path, GG_ORIGIN_DPKG, &w->lib);
    struct torch_find f = {.found = false};
    if (!w->lib.torch) { /* the PyTorch it serves, if any is loaded */
        dl_iterate_phdr(torch_cb, &f);
        if (f.found)
            gg_origin_of(f.path, GG_ORIGIN_DPKG, &w->torch);
    }
    w->torch_here = w->lib.torch || f.found;
    gg_origin_describe(&w->lib, f.found ? &w->torch : NULL, w->who, sizeof w->who);
}

/* One `arch` event per distinct compute capability among the process's
 * GPUs; the stderr line when none of them runs the module. */
static void report(const char *path, const struct gg_fatbin *fb, bool from_memory,
                   uint64_t read_ns)
{
    char carries[512], fix[512];
    struct whose w = {.known = false};
    gg_fatbin_describe(fb, carries, sizeof carries);
    bool done[GG_MAX_DEVICES] = {false}, any_ok = false;
    int first_bad = -1, bad = 0;
    for (int i = 0; i < gg_device_count; i++) {
        const struct gg_device *d = &gg_devices[i];
        if (done[i] || !d->present)
            continue;
        struct gg_fatbin_verdict v;
        gg_fatbin_judge(fb, d->cc_major, d->cc_minor, &v);
        char cc[16], used[32], msg[2048];
        snprintf(cc, sizeof cc, "%d.%d", d->cc_major, d->cc_minor);
        gg_fatbin_code_name(v.used, used, sizeof used);
        int arch = d->cc_major * 10 + d->cc_minor;
        if (!v.ok) {
            whose_of(path, &w);
            gg_fatbin_fix(&w.lib, w.torch_here, d->cc_major, d->cc_minor, fix, sizeof fix);
            snprintf(msg, sizeof msg,
                     "no kernel image for sm_%d: the module carries %s.%s%s Fix: %s", arch,
                     carries, w.who[0] ? " " : "", w.who, fix);
        } else if (v.used.kind == GG_FATBIN_PTX) {
            snprintf(msg, sizeof msg, "runs only by JIT compilation of PTX %s (no SASS for sm_%d)",
                     used, arch);
        } else {
            snprintf(msg, sizeof msg, "runs SASS %s", used);
        }
        struct gg_arch_event e = {.dev = i, .cc = cc, .module = path, .fb = fb, .ok = v.ok,
                                  .message = msg, .from_memory = from_memory,
                                  .read_us = read_ns / 1000};
        for (int k = i; k < gg_device_count; k++) /* every GPU of this compute capability */
            if (gg_devices[k].present && gg_devices[k].cc_major == d->cc_major &&
                gg_devices[k].cc_minor == d->cc_minor) {
                done[k] = true;
                e.devs[e.ndevs++] = k;
                if (!v.ok)
                    bad++;
            }
        gg_events_arch(&e);
        if (v.ok)
            any_ok = true;
        else if (first_bad < 0)
            first_bad = i;
    }
    if (any_ok || first_bad < 0)
        return;
    const struct gg_device *d = &gg_devices[first_bad];
    char more[64] = "", line[4096];
    gg_fatbin_fix(&w.lib, w.torch_here, d->cc_major, d->cc_minor, fix, sizeof fix);
    if (bad == 2)
        snprintf(more, sizeof more, " (nor for the other GPU)");
    else if (bad > 2)
        snprintf(more, sizeof more, " (nor for the other %d GPUs)", bad - 1);
    /* gg_say's form, longer: a path, what it carries, whose it is, the fix */
    int n = snprintf(line, sizeof line - 1,
                     "gpuguard: %s has no kernel image for GPU%d %s (compute capability "
                     "%d.%d)%s: it carries %s, so its kernels fail with \"no kernel image is "
                     "available for execution on the device\".%s%s Fix: %s",
                     path, first_bad, d->name, d->cc_major, d->cc_minor, more, carries,
                     w.who[0] ? " " : "", w.who, fix);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof line - 1 ? (size_t)n : sizeof line - 2;
    line[len++] = '\n';
    int saved = errno;
    gg_write_all(2, line, len);
    errno = saved;
}

/* The module's file, or /proc/self/exe for the main program, and the name
 * to show for it. */
static const char *file_of(const struct object *o, char *shown, size_t cap)
{
    if (o->path[0]) {
        snprintf(shown, cap, "%s", o->path);
        return o->path;
    }
    ssize_t n = readlink("/proc/self/exe", shown, cap - 1);
    shown[n > 0 ? n : 0] = '\0';
    return "/proc/self/exe";
}

static bool is_absent(int r)
{
    return r == GG_FATBIN_NONE || r == GG_FATBIN_UNREGISTERED || r == GG_FATBIN_EOPEN ||
           r == GG_FATBIN_ENOTELF;
}

/* Read an object's device code: its file, else (a module whose file cannot
 * be read, or does not hold what it registered) the registered fat binaries
 * in memory. False when there is nothing to judge; a problem is journaled. */
static bool read_code(const struct object *o, uintptr_t reg_first, uintptr_t reg_last,
                      struct gg_fatbin *fb, bool *from_memory, uint64_t *ns)
{
    char shown[PATH_CAP];
    const char *file = file_of(o, shown, sizeof shown);
    uint64_t t0 = gg_now_ns();
    gg_fatbin_init(fb);
    int r = gg_fatbin_read_file(fb, file);
    uint64_t file_off = fb->err_off;
    *from_memory = false;
    if (r != GG_FATBIN_OK && reg_first) {
        int file_r = r;
        gg_fatbin_init(fb);
        r = gg_fatbin_parse_wrappers(fb, (const void *)reg_first, (const void *)reg_last, o->seg,
                                     o->nseg);
        *from_memory = true;
        if (!is_absent(file_r))
            gg_events_problem("%s: cannot read its device code: %s (at offset %llu); %s", shown,
                            gg_fatbin_strerror(file_r), (unsigned long long)file_off,
                            r == GG_FATBIN_OK ? "judged from the fat binaries it registered"
                                              : "nor from the fat binaries it registered; not "
                                                "checked");
        else if (r != GG_FATBIN_OK)
            gg_events_problem("%s: cannot read the fat binaries it registered: %s; not checked",
                            shown, gg_fatbin_strerror(r));
    } else if (r != GG_FATBIN_OK && !is_absent(r)) {
        gg_events_problem("%s: cannot read its device code: %s (at offset %llu); not checked", shown,
                        gg_fatbin_strerror(r), (unsigned long long)file_off);
    }
    *ns = gg_now_ns() - t0;
    return r == GG_FATBIN_OK && fb->ncode > 0;
}

static void judge_module(struct module *m)
{
    struct table *t = atomic_load(&table);
    if (judged_before(t, m->obj.path, m) || atomic_exchange(&m->checked, true))
        return;
    uintptr_t first = 0, last = 0;
    if (try_lock(&t->lock)) {
        first = m->reg_first;
        last = m->reg_last;
        gg_spin_unlock(&t->lock);
    }
    struct gg_fatbin fb;
    bool from_memory;
    uint64_t ns;
    char shown[PATH_CAP];
    file_of(&m->obj, shown, sizeof shown);
    if (read_code(&m->obj, first, last, &fb, &from_memory, &ns))
        report(shown, &fb, from_memory, ns);
}

/* ---- scans ----------------------------------------------------------------- */

static bool seen_insert(struct scan_state *st, uintptr_t key)
{
    if (st->nseen >= SEEN_SLOTS / 4 * 3)
        return true; /* full: looked at again next time, never lost */
    for (size_t i = (key >> 12) * 0x9E3779B97F4A7C15ull % SEEN_SLOTS;; i = (i + 1) % SEEN_SLOTS) {
        if (st->seen[i] == key)
            return false;
        if (!st->seen[i]) {
            st->seen[i] = key;
            st->nseen++;
            return true;
        }
    }
}

static bool has_counters(size_t size)
{
    return size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(unsigned long long);
}

static int collect_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    struct scan_state *st = ctx;
    if (has_counters(size)) {
        st->adds = info->dlpi_adds;
        st->subs = info->dlpi_subs;
    }
    if (st->ncand == MAX_CANDIDATES) {
        st->full = true;
        return 0;
    }
    struct object *o = &st->cand[st->ncand];
    object_from(info, o);
    if (o->lo < o->hi && seen_insert(st, o->key))
        st->ncand++;
    return 0;
}

static int counters_cb(struct dl_phdr_info *info, size_t size, void *ctx)
{
    unsigned long long *c = ctx;
    if (has_counters(size)) {
        c[0] = info->dlpi_adds;
        c[1] = info->dlpi_subs;
    }
    return 1;
}

static void check_candidate(struct table *t, const struct object *o, unsigned long long subs)
{
    struct module *m = module_of(t, o);
    if (m) { /* it registered fat binaries */
        judge_module(m);
        gg_progress();
        return;
    }
    if (judged_before(t, o->path, NULL))
        return;
    struct gg_fatbin fb;
    bool from_memory;
    uint64_t ns;
    if (!read_code(o, 0, 0, &fb, &from_memory, &ns))
        return;
    m = module_get(t, o, subs);
    if (m && atomic_exchange(&m->checked, true))
        return; /* its registration got there first */
    char shown[PATH_CAP];
    file_of(o, shown, sizeof shown);
    report(shown, &fb, false, ns);
}

/* Check the objects not looked at yet, MAX_CANDIDATES at a time. */
static void scan(void)
{
    struct scan_state *st = atomic_load(&scan_st);
    struct table *t = get_table();
    if (!st || !t || atomic_flag_test_and_set(&scanning))
        return;
    unsigned long long before_subs = st->subs;
    for (int pass = 0; pass < 64; pass++) {
        st->ncand = 0;
        st->full = false;
        dl_iterate_phdr(collect_cb, st);
        if (st->primed && st->subs != before_subs) {
            /* Objects were unloaded: an address may now be another object's.
             * Look at everything again; modules already reported stay so. */
            memset(st->seen, 0, sizeof st->seen);
            st->nseen = 0;
            st->ncand = 0;
            st->full = false;
            before_subs = st->subs;
            dl_iterate_phdr(collect_cb, st);
        }
        st->primed = true;
        for (unsigned i = 0; i < st->ncand; i++)
            check_candidate(t, &st->cand[i], st->subs);
        if (!st->full)
            break;
    }
    if (!st->full) {
        atomic_store(&last_adds, st->adds);
        atomic_store(&last_subs, st->subs);
    }
    atomic_flag_clear(&scanning);
}

void gg_arch_start(void)
{
    if (alloc_once((void *_Atomic *)&scan_st, sizeof(struct scan_state)))
        scan();
}

void gg_arch_poll(void)
{
    if (!atomic_load_explicit(&scan_st, memory_order_relaxed))
        return;
    unsigned long long c[2] = {0, 0};
    dl_iterate_phdr(counters_cb, c);
    if (c[0] != atomic_load(&last_adds) || c[1] != atomic_load(&last_subs))
        scan();
}

/* ---- registrations -------------------------------------------------------- */

/* The module a registration comes from (added if new), its range noted.
 * Registrations come by the thousand from one library's constructors: the
 * last module matched is tried first, and the loader is asked only for a
 * new library, or when libraries were unloaded since (an address range may
 * now be another library's). */
static struct module *registered(const void *wrapper)
{
    struct table *t = get_table();
    uintptr_t w = (uintptr_t)wrapper;
    if (!t)
        return NULL;
    unsigned long long counters[2] = {0, 0};
    dl_iterate_phdr(counters_cb, counters);
    struct module *m = NULL;
    unsigned hit = atomic_load_explicit(&last_hit, memory_order_relaxed);
    unsigned n = atomic_load_explicit(&t->n, memory_order_acquire);
    if (hit && hit <= n && w >= t->m[hit - 1].obj.lo && w < t->m[hit - 1].obj.hi)
        m = &t->m[hit - 1];
    for (unsigned i = 0; !m && i < n; i++)
        if (w >= t->m[i].obj.lo && w < t->m[i].obj.hi)
            m = &t->m[i];
    if (!m || m->subs != counters[1]) {
        struct object o;
        struct find f = {.addr = w, .out = &o};
        dl_iterate_phdr(find_cb, &f);
        if (!f.found)
            return NULL; /* not in a loaded object: nothing to tie it to */
        m = module_get(t, &o, counters[1]);
        if (!m)
            return NULL;
    }
    atomic_store_explicit(&last_hit, (unsigned)(m - t->m) + 1, memory_order_relaxed);
    if (try_lock(&t->lock)) {
        if (!m->reg_first || w < m->reg_first)
            m->reg_first = w;
        if (w > m->reg_last)
            m->reg_last = w;
        gg_spin_unlock(&t->lock);
    }
    return m;
}

void *gg_arch_registering(const void *fat_cubin)
{
    return registered(fat_cubin);
}

void gg_arch_registered(void *module)
{
    if (module)
        judge_module(module);
}
