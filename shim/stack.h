/* stack.h - native call stacks: capture cheaply, store once, symbolize late.
 *
 * A capture takes raw instruction pointers with libunwind's unw_backtrace and
 * drops the shim's own frames, so the first frame is the code that called the
 * CUDA function. Identical stacks on the same device share one site in a
 * table (hash of the IPs and the device -> site id), and every live
 * allocation keeps only its 32-bit site id. A site becomes text
 * ({ip, module, sym, off} per frame) only when a journal line needs it; each
 * IP is symbolized once and cached.
 *
 * Sites also carry live accounting (bytes and allocations held by the
 * process right now) so the guard can say, at a device's peak, which sites
 * held the memory.
 *
 * Thread-safe, never blocks for long, never takes the GIL, never aborts: a
 * capture that cannot be stored returns GG_SITE_NONE.
 */
#ifndef GG_STACK_H
#define GG_STACK_H

#include <stddef.h>
#include <stdint.h>
#include "json.h"

typedef uint32_t gg_site;
#define GG_SITE_NONE 0u
#define GG_STACK_MAX_DEPTH 128

/* Load and exercise libunwind once; called on the first CUDA call. */
void gg_stack_warmup(void);

/* Capture the calling thread's stack (at most `depth` frames after the
 * shim's own are dropped) and return its site for device `dev`. */
gg_site gg_stack_capture(int dev, int depth);

/* The raw frames of a site; returns their count (0 for GG_SITE_NONE). */
size_t gg_stack_frames(gg_site site, const uintptr_t **ips);

/* Write the site's frames as a JSON array of {ip, module, sym, off}. */
void gg_stack_json(struct gg_json *j, gg_site site);

/* Live accounting: add (or with negative values, remove) bytes and
 * allocations held through a site. */
void gg_site_charge(gg_site site, int64_t bytes, int64_t allocs);

struct gg_site_usage { gg_site site; uint64_t bytes, allocs; };

/* The sites of device `dev` holding memory now, largest first; at most
 * `max` written, the count written returned. */
size_t gg_site_top(int dev, struct gg_site_usage *out, size_t max);

/* How many distinct sites are stored. */
size_t gg_stack_sites(void);

/* ---- additions ---------------------------------------------------------- */

/* The site of a given IP sequence (at most GG_STACK_MAX_DEPTH, kept raw) on
 * device `dev`, as if it had been captured. */
gg_site gg_stack_intern(int dev, const uintptr_t *ips, size_t n);

/* The device a site was captured on; -1 for GG_SITE_NONE. */
int gg_site_device(gg_site site);

/* One frame, symbolized (and cached: strings live as long as the process).
 * `sym` is NULL when nothing names the address; `off` is then relative to
 * the module's load base (for addr2line), else to the symbol; `ip` and
 * `off` are return addresses, the symbol is the one holding ip - 1.
 * Returns false (all fields empty) only when the cache is out of space. */
struct gg_frame_info { const char *module, *sym; uint64_t off; bool has_off; };
bool gg_stack_symbolize(uintptr_t ip, struct gg_frame_info *out);

/* For tests. The code ranges whose leading frames a capture drops
 * (default: the executable segments of the object holding stack.c; lo ==
 * NULL returns to it), and the most sites the table will hold (0: the
 * built-in bound). Not for use while other threads capture. */
void gg_stack_test_self(const uintptr_t *lo, const uintptr_t *hi, size_t n);
void gg_stack_test_limit(size_t max_sites);

#endif /* GG_STACK_H */
