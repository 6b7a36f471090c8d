/* retry.h - layer 4: a failed allocation and what its caller did next
 * (docs/how-it-works.md, "A failure and its retry").
 *
 * PyTorch's caching allocator answers a refusal or an out-of-memory error
 * (exactly that code) by freeing every cached segment no tensor uses and
 * asking again for the same size, on the same thread, under its lock: a
 * full flush of its cache. When the retry fits, the program never sees the
 * failure (it was recovered, at the cost of the flush); when it fails too,
 * PyTorch raises torch.OutOfMemoryError into the program. No Python runs in
 * between, and no view of PyTorch's can be read then; what the shim knows
 * is its own ledger. So a failure opens an episode on its thread:
 *
 *   - the frees on that thread until the retry are what the flush released
 *     (reserved bytes no tensor used: gg_retry_freed);
 *   - an allocation of the same size on the same device, through the same
 *     function, is the retry: it worked (recovered), or failed (raised: the
 *     same request, not a second failure); with expandable segments the
 *     retry is a run of handles of the failed one's size, then their
 *     mappings: it worked once mapped, and failed if one of the run fails;
 *   - any other allocation on that thread, a quarter of a second without
 *     one (the shim's thread), or the exit, closes it unretried: the error
 *     reached the caller.
 *
 * A closed episode is handed back whole (the failure's call, verdict and
 * facts at its moment, and the outcome), for react.h to journal as one
 * line. Nothing here waits or takes a lock. The guard marks, for this
 * thread's open episode, what it does next (guard.h: gg_guard_retrying,
 * which this module sets): the allocation path pays one thread-local load
 * unless an episode is open.
 */
#ifndef GG_RETRY_H
#define GG_RETRY_H

#include <stdbool.h>
#include <stdint.h>

#include "guard.h"
#include "prim.h"
#include "steps.h"

/* What happened after a failure. */
enum gg_retried {
    GG_RETRY_UNKNOWN = -1, /* no episode could be kept: said at once, outcome unknown */
    GG_RETRY_NONE = 0,     /* no retry came: the error reached the caller */
    GG_RETRY_RECOVERED,    /* the same size again worked: PyTorch flushed and went on */
    GG_RETRY_RAISED,       /* the same size again failed: PyTorch raised */
};

/* A failure with its moment's facts and what came of it. */
struct gg_episode {
    struct gg_call call;         /* the failed call (its site, size, device, api) */
    struct gg_verdict verdict;   /* the guard's verdict on it */
    uint64_t ns;                 /* its moment (gg_now_ns) */
    uint64_t reserved;           /* the process's bytes on the device then */
    uint64_t allocated;          /* ... of them handed out (pools: PyTorch's allocated) */
    uint64_t step1;              /* the step in progress then + 1; 0: no step yet */
    struct gg_shape input;       /* ... its input, when told */
    enum gg_retried retried;
    uint64_t freed;              /* bytes the thread freed before its retry (the flush) */
    uint64_t freed_count;        /* ... in so many frees */
    uint64_t freed_largest;      /* ... the largest of them */
};

/* A failure on this thread, with its facts (now: the call, the verdict, the
 * moment, the bytes held, the step). Returns true when e is a whole episode to say
 * now (the open one it closed: a failed retry, or one this failure
 * supersedes), false when nothing is to be said yet. *retry: this failure
 * is the retry of the open episode (the same request: not counted again).
 * When no episode can be kept, the failure itself is handed back, outcome
 * unknown, and *opened is false. */
bool gg_retry_failed(const struct gg_episode *now, bool *retry, bool *opened,
                     struct gg_episode *e);

/* An allocation on this thread worked, with an episode open: the episode,
 * closed (recovered when it is the retry), to say. False: none was open. */
bool gg_retry_allocated(const struct gg_call *c, struct gg_episode *e);

/* This thread mapped memory with an episode open: a VMM retry (expandable
 * segments: the same size of handle made again, then mapped) worked; the
 * episode, closed, to say. False: nothing to close. */
bool gg_retry_mapped(struct gg_episode *e);

/* This thread freed `bytes` with an episode open: part of the flush. */
void gg_retry_freed(uint64_t bytes);

/* Episodes open longer than max_ns (any thread's; all of them with 0, at
 * exit): closed unretried, one per call, to say. False: none. */
bool gg_retry_stale(uint64_t now_ns, uint64_t max_ns, struct gg_episode *e);

/* A forked child: no episode of its parent's threads is its own. */
void gg_retry_after_fork(void);
#ifdef GG_TESTING
/* Start again (unit tests). */
void gg_retry_reset(void);
#endif

#endif /* GG_RETRY_H */
