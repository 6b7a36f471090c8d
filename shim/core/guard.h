/* guard.h - layer 4: the decisions (docs/how-it-works.md).
 *
 * The hooks describe each call in a gg_call, ask the guard before and tell
 * it after. The guard decides and accounts (ledger, device counters, sites,
 * the peak) and says what happened in a gg_verdict; it writes nothing and
 * advises no one: turning a verdict into journal lines and advice is
 * react.h's job. Far from the headroom line the guard works from the
 * device's estimate; a reading is taken only where it changes the answer.
 */
#ifndef GG_GUARD_H
#define GG_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ledger.h"
#include "prim.h"
#include "sites.h"

/* May a call be refused (docs/how-it-works.md,
 * "What may be refused")? Which module asked decides
 * the rest (never_refuse), and only where a refusal would otherwise happen. */
enum gg_refusable {
    GG_REFUSABLE_NEVER,     /* managed memory: it may oversubscribe the device */
    GG_REFUSABLE,           /* unless the module that asked is one never refused */
};

/* One intercepted allocation. */
struct gg_call {
    int dev;
    uint8_t api;          /* the hook's id (kept in the ledger) */
    uint8_t refusable;    /* enum gg_refusable */
    uint8_t pool;         /* the stream-ordered pool serving it (pools.h); GG_POOL_NONE */
    bool runtime;         /* a runtime call: a first reading may retain the primary context */
    const char *api_name; /* the function's name, for the journal */
    uint64_t bytes;       /* what the caller asked for */
    uint64_t grows;       /* a pool's request: how much the device grows for it, what the
                             pool does not hold free (0: served from memory the pool
                             already holds); a plain one grows it by `bytes` */
    uintptr_t caller;     /* the return address of the call that entered the shim:
                             the module that asked (callers.h) */
    gg_site site;         /* captured by the guard when the policy wants a stack */
    uint64_t pended;      /* a shared GPU: this call's bytes among the process's pending
                             requests (peers.h), given back once it is decided */
};

enum gg_incident { GG_INCIDENT_NONE, GG_INCIDENT_NEAR_MISS, GG_INCIDENT_REFUSED,
                   GG_INCIDENT_OOM };

/* What a decision asks to be said. */
struct gg_verdict {
    uint8_t incident;    /* enum gg_incident */
    bool journal;        /* write the incident's line (per site: the first 8, then powers of 2) */
    bool over_limit;     /* a near miss past the limit (not enforcing, or spared) */
    bool spared;         /* enforcing, past the limit, and let through: the module that
                            asked is never refused ([memory] never_refuse) */
    bool sample;         /* the process's use moved: a timeline point */
    uint64_t used;       /* device-wide use at the decision */
    uint64_t count;      /* the site's running count of this kind of incident */
    uint64_t current;    /* the process's bytes after the call */
    uint64_t peers;      /* a shared GPU: what the other guarded processes held or had
                            claimed at the decision (in `used`) */
    /* A failure waits on this thread for its retry (retry.h): */
    bool retry;          /* this failure is its retry: the same request, not counted again */
    bool settle;         /* this allocation worked: the failure's episode closes */
    uint64_t freed;      /* bytes this free released (a VMM handle never mapped aside):
                            the caller's cache flush */
};

static inline bool gg_verdict_any(const struct gg_verdict *v)
{
    return v->incident != GG_INCIDENT_NONE || v->sample || v->settle || v->freed;
}

/* This thread's failure waiting for its retry, when there is one (set by
 * retry.h): the guard marks what the thread does next (a retry of the same
 * request, an allocation that worked, what a free released). */
extern GG_TLS bool gg_guard_retrying;
extern GG_TLS int gg_guard_retry_dev;
extern GG_TLS uint64_t gg_guard_retry_bytes;
extern GG_TLS const char *gg_guard_retry_api;

/* Is call c the same request as this thread's failed one (the same size on
 * the same device through the same function: PyTorch's retry is the very
 * call again)? */
static inline bool gg_guard_same_request(int dev, uint64_t bytes, const char *api,
                                         const struct gg_call *c)
{
    return dev == c->dev && bytes == c->bytes &&
           (api == c->api_name || (api && c->api_name && !__builtin_strcmp(api, c->api_name)));
}

/* Before the real allocation: false means refuse it (the hook then returns
 * the allocator's out-of-memory code without calling it). */
bool gg_guard_admit(struct gg_call *c, struct gg_verdict *v);

/* After the real allocation succeeded with key (a pointer or a handle's key). */
void gg_guard_allocated(struct gg_call *c, uintptr_t key, struct gg_verdict *v);

/* After the real allocation failed; oom: with the out-of-memory code. */
void gg_guard_failed(struct gg_call *c, bool oom, struct gg_verdict *v);

/* Before the real free of key: forget it (the address may be handed out
 * again the moment the real free returns). False when key is unknown (the
 * hook forwards it untouched); *out and *ticket for gg_guard_unrelease. */
bool gg_guard_release(uintptr_t key, struct gg_entry *out, uint32_t *ticket,
                      struct gg_verdict *v);

/* The real free failed after gg_guard_release: put the entry back. */
void gg_guard_unrelease(const struct gg_entry *e, uint32_t ticket);

/* The real free of a key the guard did not know succeeded on device dev
 * (-1: unknown). Counted; true the first time (said once). */
bool gg_guard_unknown_free(uintptr_t key, int dev);

/* VMM: handle `key` mapped at va / the mapping at va unmapped (the memory
 * lives while mapped) / the handle released. */
void gg_guard_mapped(uintptr_t va, uint64_t size, uintptr_t key);
void gg_guard_unmapped(uintptr_t va, uint64_t size, struct gg_verdict *v);
bool gg_guard_release_handle(uintptr_t key, struct gg_verdict *v);

/* ---- stream-ordered pools (pools.h) --------------------------------------------------- */

/* A pool's request is described by the pool that serves it: gg_guard_pool
 * fills c->dev (the pool's device, not the caller's), c->pool and c->grows;
 * a host pool's (false) is passed by, never counted. The pool is `pool`, or
 * with 0 device dev's current one (cudaMallocAsync's); trust_cache: the
 * shim sees every change of a device's current pool (its driver hooks are
 * on), so the last one known is still right. */
bool gg_guard_pool(struct gg_call *c, uint64_t pool, int dev, bool trust_cache);
/* Host memory handed out at key (a host pool's): known, never counted, so
 * that its free is no surprise. */
void gg_guard_host_allocated(uintptr_t key);
/* A pool was made on device dev, or on the host. */
void gg_guard_pool_created(uint64_t pool, int dev, bool host);
/* Device dev's current pool is now `pool` (0: ask the driver next time). */
void gg_guard_current_pool(int dev, uint64_t pool);
/* A pool was trimmed to keep bytes / destroyed; every pool may have given
 * memory back (a synchronisation). v: samples for the timeline. */
void gg_guard_pool_trimmed(uint64_t pool, uint64_t keep, struct gg_verdict *v);
void gg_guard_pool_destroyed(uint64_t pool, struct gg_verdict *v);
void gg_guard_pools_synced(struct gg_verdict *v);

/* cudaMemGetInfo as the policy wants it answered: rewrites free and total
 * of device dev when it is enforcing and virtualize_meminfo is on. */
void gg_guard_meminfo(int dev, size_t *free_b, size_t *total_b);

/* A trainer registered (gpuguard_set_batch): every device in mode auto
 * enforces from now on. Returns a bit per device that switched. */
uint64_t gg_guard_trainer_registered(void);

/* The sites that held device dev's memory at its peak, largest first. */
size_t gg_guard_peak_sites(int dev, struct gg_site_usage *out, size_t max);

/* The fork story (life.c). */
void gg_guard_after_fork(void);

#endif /* GG_GUARD_H */
