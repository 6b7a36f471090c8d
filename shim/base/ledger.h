/* ledger.h - layer 1: every live device allocation of this process.
 *
 * key -> (size, device, site, api) in a hash table split into shards, each
 * with its own short spin lock, so threads allocating at once rarely meet.
 * A key is a device pointer, or a VMM handle's key (gg_ledger_handle_key).
 * Allocation and free counts per device are kept in the shards under the
 * lock already held. The ledger knows nothing of stacks or devices' byte
 * counters: it says what it stored, removed or evicted, and the caller
 * accounts for it.
 *
 * Exact under any interleaving: a free is a removal; a free whose real call
 * then failed puts the entry back, unless another thread freed the same
 * pointer in the meantime (gg_ledger_unknown_freed), so a racing double free
 * never leaves a phantom allocation.
 */
#ifndef GG_LEDGER_H
#define GG_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

#define GG_MAX_DEVICES 64
/* The `dev` of memory the guard knows but never counts (a host pool's): kept
 * so that its free is no surprise; in no device's figures. */
#define GG_LEDGER_NO_DEVICE GG_MAX_DEVICES

/* A VMM handle still mapped somewhere when it was released: its memory
 * lives until the last mapping goes (cuMemRelease, cuMemUnmap). */
#define GG_ENTRY_RELEASED 0x1u
/* Handed out by a stream-ordered pool (`pool` names it, pools.h): its bytes
 * are the pool's, and stay on the device when it is freed. */
#define GG_ENTRY_POOL 0x2u
/* A VMM handle that was mapped at least once. */
#define GG_ENTRY_MAPPED 0x4u

struct gg_entry {
    uintptr_t key;     /* device pointer, or gg_ledger_handle_key(handle) */
    uint64_t size;     /* bytes counted */
    uint32_t site;     /* the caller's site id (opaque here) */
    uint8_t dev;       /* or GG_LEDGER_NO_DEVICE */
    uint8_t api;       /* which function allocated it (opaque here) */
    uint8_t flags;     /* GG_ENTRY_* */
    union {
        uint8_t refs;  /* VMM mappings of a handle (saturates at 255) */
        uint8_t pool;  /* GG_ENTRY_POOL: its pool's slot (a pointer is never mapped) */
    };
};

/* Handles and pointers share the table: ~handle keeps the key spaces apart
 * (device pointers never have the top bits set). */
static inline uintptr_t gg_ledger_handle_key(uint64_t handle)
{
    return (uintptr_t)~handle;
}

enum gg_ledger_add {
    GG_LEDGER_ADDED,     /* stored */
    GG_LEDGER_REPLACED,  /* stored; *evicted held what the key held (a free not seen) */
    GG_LEDGER_FULL,      /* out of memory: not stored */
};
enum gg_ledger_add gg_ledger_add(const struct gg_entry *e, struct gg_entry *evicted);

/* Remove key for a free; false when unknown. *ticket goes to
 * gg_ledger_restore if the real free fails. */
bool gg_ledger_remove(uintptr_t key, struct gg_entry *out, uint32_t *ticket);

/* The real free of a pointer the ledger did not know succeeded (another
 * thread may be freeing it at the same time: see restore). */
void gg_ledger_unknown_freed(uintptr_t key);

/* The real free failed after gg_ledger_remove: put the entry back (neither
 * an allocation nor a free happened), unless the key was freed by another
 * thread or stored again since. True when it was put back. */
bool gg_ledger_restore(const struct gg_entry *e, uint32_t ticket);

/* VMM: a mapping of a handle came (+1) or went (-1). Going to no mapping
 * removes a handle that was released (true, *out filled). */
bool gg_ledger_map(uintptr_t key, int delta, struct gg_entry *out);

enum gg_ledger_release {
    GG_LEDGER_UNKNOWN,   /* no such key */
    GG_LEDGER_GONE,      /* removed, *out filled */
    GG_LEDGER_KEPT,      /* still mapped: marked released, still counted */
};
/* A handle is released: gone, or kept while mapped. */
enum gg_ledger_release gg_ledger_release(uintptr_t key, struct gg_entry *out);

/* Look without changing anything. */
bool gg_ledger_find(uintptr_t key, struct gg_entry *out);

/* Allocations and frees recorded for a device (live = allocs - frees);
 * GG_LEDGER_NO_DEVICE's too. */
uint64_t gg_ledger_allocs(int dev);
uint64_t gg_ledger_frees(int dev);

#ifdef GG_TESTING
/* Bytes the table itself occupies. */
uint64_t gg_ledger_footprint(void);

/* Forget everything (tests). Not thread-safe. */
void gg_ledger_reset(void);
#endif

/* The fork story (life.c): the child never uses the ledger, only its locks
 * must not stay held. */
void gg_ledger_after_fork(void);

#endif /* GG_LEDGER_H */
