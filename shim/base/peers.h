/* peers.h - layer 1: the guarded processes of one user that share a GPU
 * (docs/how-it-works.md, "A GPU shared by processes").
 *
 * A process's own estimate of device-wide use is its last reading of the
 * device plus what it did since: what another guarded process did since is
 * not in it, and two processes that decide at the same moment each read the
 * device before the other's allocation lands there. So the guarded
 * processes of one user on one host keep one small shared ledger per GPU,
 * keyed by the GPU's UUID: a file of slots, one per process, in a
 * directory of the user's own (mode 0700; /dev/shm/gpuguard-<uid>, the
 * file named after the IPC namespace and the UUID, mode 0600, created
 * O_EXCL|O_NOFOLLOW, and never one that another user could have made).
 *
 * Each process publishes in its own slot, with atomics and no lock:
 *   - cur: the bytes it holds on the GPU (a relaxed store after each
 *     change: one plain store to a cache line only it writes);
 *   - claim: what it may hold without asking again, at least cur plus
 *     what it has in flight; allocations within the claim ask nothing of
 *     anyone (the allocation path's cost is one comparison), and one past
 *     it raises the claim first, then sums the others and decides: the
 *     order that makes at least one of two processes deciding at the same
 *     moment see the other (both sides sequentially consistent);
 *   - pending: the bytes of its requests being decided or in flight past
 *     its old claim, so that two processes that see each other can tell who
 *     backs off (gg_peers_sum's `first`).
 *
 * A member is alive while it holds a POSIX record lock on its slot's byte
 * (fcntl F_SETLK, taken when it joins, released by the kernel when it
 * dies, whatever its pid namespace and however its pid is reused); the
 * others probe it without blocking (F_GETLK) and drop a dead member's
 * share. The last member to leave removes the file.
 */
#ifndef GG_PEERS_H
#define GG_PEERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_PEERS_SLOTS 64

struct gg_peer_slot {
    _Alignas(64) _Atomic uint64_t cur;
    _Atomic uint64_t claim;
    _Atomic uint64_t pending;
    _Atomic int32_t pid;      /* the member's own pid (for the journal), 0: free */
    uint32_t reserved;
};

/* This process's membership of one GPU's ledger. */
struct gg_peers {
    struct gg_peer_slot *self; /* NULL: not shared */
    void *map;
    int fd, index;
    char dir[256], name[128];
};

/* What the others hold, from their slots (live members only). */
struct gg_peers_sum {
    uint64_t cur;     /* the bytes they hold */
    uint64_t extra;   /* what their claims add beyond that: claim - cur, summed */
    uint64_t pending; /* their requests being decided */
    int members;      /* live members besides this process */
    int dropped;      /* dead members whose share was dropped by this sum */
    bool first;       /* no member with pending requests comes before this one:
                         of several deciding at once, this one goes first */
    int32_t pids[8];  /* some of their pids (0: none) */
};

/* The user's directory for the ledgers, made if missing (mode 0700; one
 * that is a link, another user's or open to others is refused): 0, or -1
 * with why. base: /dev/shm, or where tests say. */
int gg_peers_dir(const char *base, char *out, size_t cap, char *why, size_t wcap);

/* Join the ledger called `key` (a GPU's UUID) in dir: 0, or -1 with why
 * (the process then decides alone, as without peers). */
int gg_peers_join(struct gg_peers *p, const char *dir, const char *key, char *why, size_t wcap);

/* Leave at exit: the slot is zeroed and its lock given back; the last
 * member removes the file. */
void gg_peers_leave(struct gg_peers *p);

/* A forked child is not a member: it never writes its parent's slot. */
void gg_peers_after_fork(struct gg_peers *p);

static inline bool gg_peers_on(const struct gg_peers *p)
{
    return p->self != NULL;
}

/* This process holds cur bytes now. */
static inline void gg_peers_publish(const struct gg_peers *p, uint64_t cur)
{
    if (p->self)
        atomic_store_explicit(&p->self->cur, cur, memory_order_relaxed);
}

/* The claim, and its raise to at least `want` (sequentially consistent:
 * before the sum that decides). */
static inline uint64_t gg_peers_claim(const struct gg_peers *p)
{
    return p->self ? atomic_load_explicit(&p->self->claim, memory_order_relaxed) : UINT64_MAX;
}
void gg_peers_raise(const struct gg_peers *p, uint64_t want);
/* Lower the claim from `from` to `to` (if it is still `from`). */
void gg_peers_lower(const struct gg_peers *p, uint64_t from, uint64_t to);

/* Requests being decided: +bytes before the sum, -bytes once decided
 * against or landed; the total after the change. */
uint64_t gg_peers_pending(const struct gg_peers *p, int64_t delta);

/* The others, as their slots say now; dead members' shares dropped. */
void gg_peers_sum(const struct gg_peers *p, struct gg_peers_sum *out);

#endif /* GG_PEERS_H */
