/* symbolize.c - layer 3: naming return addresses (see symbolize.h). */
#include "symbolize.h"

#include <string.h>

#include "arena.h"
#include "elfsym.h"
#include "prim.h"

#define SYM_SLOTS (1u << 17)   /* symbolized addresses: half of this */
#define STR_SLOTS (1u << 16)   /* interned names: half of this */
#define ARENA_CHUNKS 32        /* 32 MiB of names and entries */
#define NAME_MAX_LEN 4096      /* longer names are cut */

struct sym_entry {
    uintptr_t ip;
    struct gg_frame_info info;
};

static _Atomic(_Atomic(struct sym_entry *) *) index_; /* SYM_SLOTS */
static uint32_t count;                                /* under lock */
static struct gg_strings names = GG_STRINGS_INIT(ARENA_CHUNKS, STR_SLOTS, NAME_MAX_LEN);
static gg_spin lock = GG_SPIN_INIT;

static const struct sym_entry *cached(uintptr_t ip)
{
    _Atomic(struct sym_entry *) *idx = atomic_load_explicit(&index_, memory_order_acquire);
    if (!idx)
        return NULL;
    size_t i = (size_t)gg_mix64(ip) & (SYM_SLOTS - 1);
    for (size_t probes = 0; probes < SYM_SLOTS; probes++) {
        struct sym_entry *e = atomic_load_explicit(&idx[i], memory_order_acquire);
        if (!e || e->ip == ip)
            return e;
        i = (i + 1) & (SYM_SLOTS - 1);
    }
    return NULL;
}

/* Resolve without the cache: named by a symbol only when ip - 1 lies inside
 * that symbol's extent (elfsym.h), demangled; else module + offset from its
 * load base (for addr2line). Strings may point into `name` or into elfsym's
 * storage. */
static void resolve(uintptr_t ip, struct gg_frame_info *fi, char *name, size_t name_cap)
{
    struct gg_elfsym_hit hit;
    uintptr_t look = ip ? ip - 1 : 0; /* a return address: the call is before it */
    memset(fi, 0, sizeof *fi);
    if (!gg_elfsym_lookup(look, &hit))
        return; /* no module holds it: anonymous memory, JIT code */
    fi->module = hit.module && hit.module[0] ? hit.module : NULL;
    fi->has_off = true;
    if (hit.sym) {
        fi->sym = gg_elfsym_demangle(hit.sym, name, name_cap) ? name : hit.sym;
        fi->off = ip - hit.start;
    } else {
        fi->off = ip - hit.bias;
    }
}

/* Store a resolution; the cached entry, or NULL when out of space. */
static const struct sym_entry *store(uintptr_t ip, const struct gg_frame_info *fi)
{
    const struct sym_entry *r = NULL;
    /* Bounded: the exit path symbolizes, and a signal handler that calls
     * exit() may have interrupted this very thread inside the lock. */
    if (!gg_spin_trylock(&lock, 100000))
        return NULL;
    _Atomic(struct sym_entry *) *idx = atomic_load_explicit(&index_, memory_order_relaxed);
    if (!idx) {
        idx = gg_pages((size_t)SYM_SLOTS * sizeof *idx);
        if (!idx)
            goto out;
        atomic_store_explicit(&index_, idx, memory_order_release);
    }
    size_t i = (size_t)gg_mix64(ip) & (SYM_SLOTS - 1);
    for (;;) {
        struct sym_entry *e = atomic_load_explicit(&idx[i], memory_order_relaxed);
        if (!e)
            break;
        if (e->ip == ip) { /* another thread was first */
            r = e;
            goto out;
        }
        i = (i + 1) & (SYM_SLOTS - 1);
    }
    if (count >= SYM_SLOTS / 2)
        goto out;
    struct sym_entry *e = gg_arena_alloc(&names.arena, sizeof *e, _Alignof(struct sym_entry));
    if (!e)
        goto out;
    e->ip = ip;
    e->info = *fi;
    if ((fi->module && !(e->info.module = gg_strings_intern(&names, fi->module))) ||
        (fi->sym && !(e->info.sym = gg_strings_intern(&names, fi->sym))))
        goto out; /* the entry's space is lost, never published */
    count++;
    atomic_store_explicit(&idx[i], e, memory_order_release);
    r = e;
out:
    gg_spin_unlock(&lock);
    return r;
}

bool gg_symbolize(uintptr_t ip, struct gg_frame_info *out)
{
    const struct sym_entry *e = cached(ip);
    if (!e) {
        /* The demangled name goes to pages of its own, not onto the stack:
         * this may run on a thread with a small stack. */
        char *scratch = gg_pages(NAME_MAX_LEN);
        if (scratch) {
            struct gg_frame_info fi;
            resolve(ip, &fi, scratch, NAME_MAX_LEN);
            e = store(ip, &fi);
            gg_pages_free(scratch, NAME_MAX_LEN);
        }
        if (!e) {
            /* Out of space: nothing that would outlive this call. */
            memset(out, 0, sizeof *out);
            return false;
        }
    }
    *out = e->info;
    return true;
}

void gg_symbolize_after_fork(void)
{
    gg_spin_reset(&lock);
}
