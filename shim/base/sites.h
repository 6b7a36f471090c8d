/* sites.h - layer 1: call sites, stored once, with what each holds now.
 *
 * A site is one captured stack on one device: native return addresses and,
 * when the calling thread runs Python, its frames as raw (code object,
 * instruction offset) pairs (layer 3 knows what they mean; this table only
 * compares and keeps them). Identical stacks share a site, and every live
 * allocation keeps only its 32-bit site id (heaptrack's way: collect raw,
 * deduplicate, symbolize late).
 *
 * Sites also carry live accounting (bytes and allocations held through them
 * right now), so the guard can say at a peak which sites held the memory.
 *
 * Storage: site records in chunks that are never freed or moved (an id is a
 * stable index; readers take no lock), frames in an arena, a lock-free probe
 * of an open-addressing index; only an insertion takes the lock. Never
 * blocks for long, never mallocs: a stack that cannot be stored is
 * GG_SITE_NONE.
 */
#ifndef GG_SITES_H
#define GG_SITES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef uint32_t gg_site;
#define GG_SITE_NONE 0u
#define GG_SITE_MAX_NATIVE 128  /* native frames per site */
#define GG_SITE_MAX_PYTHON 128  /* Python frames per site (two words each) */

/* The site of this stack on device dev: native[0..n_native) and Python
 * frames py[0..2*n_py) (pairs of words). GG_SITE_NONE when empty or when
 * the table is full. */
gg_site gg_sites_intern(int dev, const uintptr_t *native, size_t n_native, const uintptr_t *py,
                        size_t n_py);

/* A site's native frames / Python frame pairs; the count (0 for NONE). */
size_t gg_sites_native(gg_site site, const uintptr_t **ips);
#ifdef GG_TESTING
size_t gg_sites_python(gg_site site, const uintptr_t **pairs);

/* The device a site was captured on; -1 for GG_SITE_NONE. */
int gg_sites_device(gg_site site);
#endif

/* Live accounting: add (negative: remove) bytes and allocations held
 * through a site. */
void gg_sites_charge(gg_site site, int64_t bytes, int64_t allocs);

struct gg_site_usage { gg_site site; uint64_t bytes, allocs; };

/* The sites of device dev holding memory now, largest first (bytes, then
 * allocations, then the older site); at most max, the count returned. */
size_t gg_sites_top(int dev, struct gg_site_usage *out, size_t max);

/* How many events of a kind (0 .. GG_SITE_EVENTS-1: the guard's near
 * misses, refusals, OOMs) this site has had, this one included; 0 for
 * GG_SITE_NONE. Exact for any number of sites: the journal's per-site
 * line budget (budget.h) counts here. */
#define GG_SITE_EVENTS 3
uint32_t gg_sites_count_event(gg_site site, unsigned kind);

/* A note kept with a site, set once (the first setter wins) and never
 * freed: what a layer above knows of the stack (its Python frames' names,
 * resolved while they were live). NULL until set. */
void *gg_sites_note(gg_site site);
bool gg_sites_set_note(gg_site site, void *note);

/* Distinct sites stored. */
size_t gg_sites_count(void);

/* The insertion lock, for the fork story (life.c). */
void gg_sites_after_fork(void);

#ifdef GG_TESTING
/* For tests: the most sites the table will hold (0: the built-in bound).
 * Not for use while other threads intern. */
void gg_sites_test_limit(size_t max_sites);
#endif

#endif /* GG_SITES_H */
