/* symbolize.h - layer 3: naming a return address, late and once.
 *
 * Each address is resolved once (elfsym.h: a symbol only when the address
 * lies inside its extent, C++ names demangled; else module + offset) and
 * cached in a lock-free index;
 * module and symbol names are interned into process-lifetime memory, so they
 * survive a dlclose of the object they came from. Never on the allocation
 * path: names are needed only when a journal line is written.
 */
#ifndef GG_SYMBOLIZE_H
#define GG_SYMBOLIZE_H

#include <stdbool.h>
#include <stdint.h>

/* One frame. `sym` is NULL when nothing names the address; `off` is then
 * relative to the module's load base (for addr2line), else to the symbol.
 * `ip` is a return address: the symbol is the one holding ip - 1. */
struct gg_frame_info {
    const char *module, *sym;
    uint64_t off;
    bool has_off;
};

/* Fills *out (strings live as long as the process). False (all empty) only
 * when the cache is out of space and nothing could be said. */
bool gg_symbolize(uintptr_t ip, struct gg_frame_info *out);

/* The fork story (life.c). */
void gg_symbolize_after_fork(void);

#endif /* GG_SYMBOLIZE_H */
