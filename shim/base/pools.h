/* pools.h - layer 1: the stream-ordered memory pools of the process, as
 * the device sees them (docs/how-it-works.md).
 *
 * A pool (cudaMallocAsync's default or current pool, one made by
 * cuMemPoolCreate) holds `reserved` bytes on its device, of which `used`
 * are handed out. A request is served from the pool's free bytes first and
 * grows the pool, and so the device, only by what is missing; a free gives
 * the bytes back to the pool, not to the device. Memory leaves a pool when
 * it is trimmed (cuMemPoolTrimTo: down to max(keep, used)), at a
 * synchronisation (down to max(release threshold, used)), or when the pool
 * is destroyed (its free bytes at once, the rest with its last
 * allocation). So the guard charges a device what its pools reserve, and a
 * request a pool can serve grows nothing.
 *
 * This is the bookkeeping only: each pool's device and location, and its
 * reserved and used bytes, in a fixed table of slots (a ledger entry names
 * its pool by slot). Each change returns how much the device's memory moved,
 * for the guard to account. The driver's own figures (the pool's reserved
 * bytes, which real CUDA rounds to its granularity) correct the table
 * whenever the guard reads them (gg_pools_observed).
 *
 * Slots are taken under one lock (pools are made rarely); a pool's figures
 * move under its own. Host pools are remembered so that their allocations
 * are known and passed by, never counted.
 */
#ifndef GG_POOLS_H
#define GG_POOLS_H

#include <stdbool.h>
#include <stdint.h>

/* Slots 1..GG_POOLS; 0 names no pool. */
#define GG_POOLS 255
#define GG_POOL_NONE 0u

/* The slot of pool `handle`, registered with its device (dev; -1 with host)
 * when it is new. GG_POOL_NONE when the table is full (the pool's
 * allocations are then counted as plain ones). */
unsigned gg_pools_get(uint64_t handle, int dev, bool host);

/* The slot of a registered, not destroyed pool; GG_POOL_NONE if none. */
unsigned gg_pools_find(uint64_t handle);

/* Where a slot's memory lives: its device, or host. False for a free slot. */
bool gg_pools_where(unsigned slot, int *dev, bool *host);

/* How much the device would grow to hand out n bytes now: what the pool's
 * free bytes do not cover (0: the pool serves it from what it holds). */
uint64_t gg_pools_growth(unsigned slot, uint64_t n);

/* n bytes were handed out: returns how much the pool grew. */
uint64_t gg_pools_allocated(unsigned slot, uint64_t n);

/* n bytes came back (a free): returns what left the device with them
 * (only a destroyed pool's memory does; the slot is free once drained). */
uint64_t gg_pools_freed(unsigned slot, uint64_t n);

/* The pool holds `reserved` bytes now (the driver said so; at least what
 * is handed out): returns the change of its reservation. */
int64_t gg_pools_observed(unsigned slot, uint64_t reserved);

/* The pool was trimmed to `keep` and the driver could not say what it
 * holds: down to max(keep, used). Returns the change. */
int64_t gg_pools_trimmed(unsigned slot, uint64_t keep);

/* The pool was destroyed: its free bytes leave now (the change returned),
 * the rest with its allocations; its handle may name a new pool from now
 * on. *slot: the slot it had (GG_POOL_NONE when unknown). */
int64_t gg_pools_destroyed(uint64_t handle, unsigned *slot);

/* A slot's figures (tests, the journal). */
struct gg_pool_figures {
    uint64_t handle, reserved, used, peak_reserved;
    int dev;
    bool host, destroyed;
};
bool gg_pools_figures(unsigned slot, struct gg_pool_figures *out);

/* The slots in use after `after` (0: from the first), one at a time;
 * GG_POOL_NONE at the end. */
unsigned gg_pools_next(unsigned after);

#ifdef GG_TESTING
/* Forget every pool (tests). Not thread-safe. */
void gg_pools_reset(void);
#endif

/* The fork story (life.c): the locks must not stay held. */
void gg_pools_after_fork(void);

#endif /* GG_POOLS_H */
