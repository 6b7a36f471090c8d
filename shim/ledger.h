/* ledger.h - every live device allocation of this process, and the counters
 * per device (DESIGN.md section 2).
 *
 * pointer -> (size, device, site, api) in a hash table split into shards,
 * each with its own short spin lock, so threads allocating at once rarely
 * meet. The counters are atomics: current bytes, peak, allocations, frees,
 * failures. Exact under any number of threads: the peak is the largest value
 * `current` took in the order the atomic additions happened.
 *
 * A failed allocation never enters the ledger; a pointer the ledger does not
 * know is reported as unknown and the caller forwards it untouched.
 */
#ifndef GG_LEDGER_H
#define GG_LEDGER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "stack.h"

#define GG_MAX_DEVICES 64

/* Which API made an allocation: names for the journal's `api` field. */
enum gg_api {
    GG_API_CUDA_MALLOC, GG_API_CUDA_MALLOC_ASYNC, GG_API_CUDA_MALLOC_FROM_POOL,
    GG_API_CUDA_MALLOC_MANAGED, GG_API_CUDA_MALLOC_PITCH,
    GG_API_CU_MEM_ALLOC, GG_API_CU_MEM_ALLOC_ASYNC, GG_API_CU_MEM_ALLOC_FROM_POOL,
    GG_API_CU_MEM_ALLOC_MANAGED, GG_API_CU_MEM_ALLOC_PITCH, GG_API_CU_MEM_CREATE,
    GG_API_COUNT
};
const char *gg_api_name(enum gg_api api);

struct gg_alloc {
    uintptr_t ptr;
    uint64_t size;
    gg_site site;
    int16_t dev;
    uint8_t api;
    uint8_t pad;
};

/* Per device. `current` and `peak` are the only counters every allocation
 * writes through a shared atomic (the exact peak needs one order of
 * additions); allocation and free counts live in the shards, under the lock
 * already held, and are summed when read. */
struct gg_counters {
    _Alignas(64) _Atomic uint64_t current;   /* bytes held now */
    _Alignas(64) _Atomic uint64_t peak;      /* most bytes held */
    _Alignas(64) _Atomic uint64_t ooms;      /* the real allocator said no */
    _Atomic uint64_t refusals;               /* the guard said no */
    _Atomic uint64_t near_misses;
    _Atomic uint64_t unknown_frees;          /* frees of pointers never seen */
};

extern struct gg_counters gg_ledger_counters[GG_MAX_DEVICES];

/* Record a successful allocation: *current is the device's bytes held after
 * it, *new_peak whether it set a peak. False when the ledger could not store
 * the entry (out of memory: the caller says so once and stops counting). */
bool gg_ledger_add(const struct gg_alloc *a, uint64_t *current, bool *new_peak);

/* Forget an allocation that is being freed. False if the pointer is unknown;
 * otherwise *out holds what was recorded and the counters are updated. */
bool gg_ledger_remove(uintptr_t ptr, struct gg_alloc *out);

/* Put back an entry removed for a free that then failed: neither an
 * allocation nor a free happened. */
void gg_ledger_restore(const struct gg_alloc *a);

/* Allocations and frees recorded for a device (live = allocs - frees). */
uint64_t gg_ledger_allocs(int dev);
uint64_t gg_ledger_frees(int dev);

/* Look without changing anything. */
bool gg_ledger_find(uintptr_t ptr, struct gg_alloc *out);

/* Bytes the table itself occupies. */
uint64_t gg_ledger_footprint(void);

/* Forget everything (tests, and a forked child). Not thread-safe. */
void gg_ledger_reset(void);

#endif /* GG_LEDGER_H */
