/* maps.h - layer 1: VMM mappings, address -> (handle, size).
 *
 * cuMemCreate allocates physical memory behind a handle; cuMemMap puts it at
 * a virtual address; the memory lives until the handle is released *and*
 * its last mapping is unmapped (NVIDIA's samples release right after
 * mapping). The ledger counts handles; this table remembers which handle
 * each mapping refers to, so an unmap can drop the handle's reference.
 * Mappings are few and change off the allocation fast path: one lock.
 */
#ifndef GG_MAPS_H
#define GG_MAPS_H

#include <stdbool.h>
#include <stdint.h>

struct gg_mapping {
    uintptr_t va;      /* where it starts */
    uint64_t size;
    uintptr_t key;     /* the handle's ledger key */
};

/* Remember a mapping; false when out of memory (the mapping is then not
 * counted as keeping its handle alive). A mapping already at va is replaced
 * and returned in *old (true in *had_old). */
bool gg_maps_add(const struct gg_mapping *m, struct gg_mapping *old, bool *had_old);

/* Forget the mapping that starts at va; false when there is none. */
bool gg_maps_take(uintptr_t va, struct gg_mapping *out);

#ifdef GG_TESTING
/* Mappings remembered. */
uint64_t gg_maps_count(void);

void gg_maps_reset(void);       /* tests */
#endif
void gg_maps_after_fork(void);  /* the fork story (life.c) */

#endif /* GG_MAPS_H */
