/* retry.c - layer 4: a failure and its caller's retry (see retry.h). */
#include "retry.h"

#include <stdatomic.h>
#include <string.h>

/* Episodes open at once, over all threads; a thread has at most one. */
#define SLOTS 16

enum { FREE, OPEN, BUSY };

static struct slot {
    _Atomic int state;
    _Atomic uintptr_t owner;      /* the owning thread's token */
    struct gg_episode e;          /* written while BUSY, read once BUSY again */
    _Atomic uint64_t freed, freed_count, freed_largest; /* the owner's, while OPEN */
    _Atomic bool retrying;        /* a VMM retry's first handle was made (the owner's) */
} slots[SLOTS];

static GG_TLS int mine;           /* this thread's slot + 1 */
static GG_TLS char token;         /* its address: this thread */

/* This thread has no episode open (any more). */
static void forget(void)
{
    mine = 0;
    gg_guard_retrying = false;
}

/* This thread's open slot, or NULL (none, or closed by another thread: a
 * stale one, or the exit). */
static struct slot *my_slot(void)
{
    if (!mine)
        return NULL;
    struct slot *s = &slots[mine - 1];
    if (atomic_load_explicit(&s->owner, memory_order_acquire) != (uintptr_t)&token ||
        atomic_load_explicit(&s->state, memory_order_acquire) != OPEN) {
        forget();
        return NULL;
    }
    return s;
}

/* Close slot s (taken: BUSY) with outcome r into *e, and free it. */
static void close_slot(struct slot *s, enum gg_retried r, struct gg_episode *e)
{
    *e = s->e;
    e->retried = r;
    e->freed = atomic_load_explicit(&s->freed, memory_order_relaxed);
    e->freed_count = atomic_load_explicit(&s->freed_count, memory_order_relaxed);
    e->freed_largest = atomic_load_explicit(&s->freed_largest, memory_order_relaxed);
    if (r == GG_RETRY_NONE && atomic_load_explicit(&s->retrying, memory_order_relaxed))
        e->retried = r = GG_RETRY_RECOVERED; /* its retry's handles were made: it went on */
    atomic_store_explicit(&s->owner, 0, memory_order_relaxed);
    atomic_store_explicit(&s->state, FREE, memory_order_release);
}

/* Take this thread's open slot to close it; NULL when there is none. */
static struct slot *take_mine(void)
{
    struct slot *s = my_slot();
    int open = OPEN;
    forget();
    if (!s || !atomic_compare_exchange_strong(&s->state, &open, BUSY))
        return NULL;
    return s;
}

/* The same request: the same size on the same device through the same
 * function (PyTorch's retry is the very call again). */
static bool same(const struct gg_episode *e, const struct gg_call *c)
{
    return gg_guard_same_request(e->call.dev, e->call.bytes, e->call.api_name, c);
}

bool gg_retry_failed(const struct gg_episode *now, bool *retry, bool *opened,
                     struct gg_episode *e)
{
    const struct gg_call *c = &now->call;
    *retry = *opened = false;
    bool closed = false;
    struct slot *s = take_mine();
    if (s && same(&s->e, c)) {
        *retry = true; /* the same request again, failed again: PyTorch raises */
        close_slot(s, GG_RETRY_RAISED, e);
        return true;
    }
    if (s) { /* another request: the open one was never retried */
        close_slot(s, GG_RETRY_NONE, e);
        closed = true;
    }
    for (int i = 0; i < SLOTS; i++) {
        struct slot *n = &slots[i];
        int free_slot = FREE;
        if (!atomic_compare_exchange_strong(&n->state, &free_slot, BUSY))
            continue;
        n->e = *now;
        atomic_store_explicit(&n->freed, 0, memory_order_relaxed);
        atomic_store_explicit(&n->freed_count, 0, memory_order_relaxed);
        atomic_store_explicit(&n->freed_largest, 0, memory_order_relaxed);
        atomic_store_explicit(&n->retrying, false, memory_order_relaxed);
        atomic_store_explicit(&n->owner, (uintptr_t)&token, memory_order_relaxed);
        atomic_store_explicit(&n->state, OPEN, memory_order_release);
        mine = i + 1;
        gg_guard_retry_dev = c->dev;
        gg_guard_retry_bytes = c->bytes;
        gg_guard_retry_api = c->api_name;
        gg_guard_retrying = true;
        *opened = true;
        return closed;
    }
    if (closed)
        return true; /* no room for this one: said with the next */
    *e = *now;
    e->retried = GG_RETRY_UNKNOWN;
    return true;
}

/* A VMM handle's request (expandable segments): its retry is a run of
 * such handles, then their mappings. */
static bool is_handle(const struct gg_call *c)
{
    return c->api_name && !strcmp(c->api_name, "cuMemCreate");
}

bool gg_retry_allocated(const struct gg_call *c, struct gg_episode *e)
{
    struct slot *s = my_slot();
    if (s && is_handle(c) && same(&s->e, c)) {
        /* the retry's first handles: it worked once they are mapped, and
         * failed if one of them is refused (a failure of the same size) */
        atomic_store_explicit(&s->retrying, true, memory_order_relaxed);
        return false;
    }
    s = take_mine();
    if (!s)
        return false;
    close_slot(s, same(&s->e, c) ? GG_RETRY_RECOVERED : GG_RETRY_NONE, e);
    return true;
}

bool gg_retry_mapped(struct gg_episode *e)
{
    struct slot *s = my_slot();
    if (!s || !atomic_load_explicit(&s->retrying, memory_order_relaxed) || !(s = take_mine()))
        return false;
    close_slot(s, GG_RETRY_RECOVERED, e);
    return true;
}

void gg_retry_freed(uint64_t bytes)
{
    struct slot *s = my_slot();
    if (!s)
        return;
    atomic_fetch_add_explicit(&s->freed, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->freed_count, 1, memory_order_relaxed);
    gg_atomic_max(&s->freed_largest, bytes);
}

bool gg_retry_stale(uint64_t now_ns, uint64_t max_ns, struct gg_episode *e)
{
    for (int i = 0; i < SLOTS; i++) {
        struct slot *s = &slots[i];
        int open = OPEN;
        if (atomic_load_explicit(&s->state, memory_order_acquire) != OPEN ||
            (max_ns && now_ns - s->e.ns <= max_ns) ||
            !atomic_compare_exchange_strong(&s->state, &open, BUSY))
            continue;
        close_slot(s, GG_RETRY_NONE, e);
        return true;
    }
    return false;
}

void gg_retry_after_fork(void)
{
    for (int i = 0; i < SLOTS; i++) {
        atomic_store(&slots[i].owner, 0);
        atomic_store(&slots[i].state, FREE);
    }
    forget();
}

#ifdef GG_TESTING
void gg_retry_reset(void)
{
    gg_retry_after_fork();
}
#endif
