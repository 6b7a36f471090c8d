/* arena.h - layer 1: memory that lives as long as the process, and strings
 * interned in it.
 *
 * A bump allocator over mmap'd chunks that are never freed or moved, so a
 * pointer handed out stays valid (a site's frames, a symbol's name after the
 * library it came from was dlclosed). The host's malloc never sees it. Not
 * thread-safe: the caller holds its own lock.
 */
#ifndef GG_ARENA_H
#define GG_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define GG_ARENA_CHUNK ((size_t)1 << 20) /* bytes per mmap */

struct gg_arena {
    char *cur;
    size_t left;
    unsigned chunks, max_chunks;
};
#define GG_ARENA_INIT(max_chunks) { NULL, 0, 0, (max_chunks) }

/* size bytes aligned to align (a power of two); NULL when the arena reached
 * max_chunks, size is 0 or larger than a chunk, or mmap failed. */
void *gg_arena_alloc(struct gg_arena *a, size_t size, size_t align);

#ifdef GG_TESTING
/* Bytes mapped so far. */
size_t gg_arena_footprint(const struct gg_arena *a);
#endif

/* Interned strings: equal strings share one copy in the arena. */
struct gg_strings {
    struct gg_arena arena;
    const char **index;    /* slots, mmap'd on first use */
    uint32_t slots;        /* a power of two */
    uint32_t count;
    size_t max_len;        /* longer strings are cut */
};
#define GG_STRINGS_INIT(max_chunks, slots, max_len) \
    { GG_ARENA_INIT(max_chunks), NULL, (slots), 0, (max_len) }

/* The interned copy of s (cut at max_len); NULL when out of space. A full
 * index still copies (the string is then not shared). */
const char *gg_strings_intern(struct gg_strings *t, const char *s);

#endif /* GG_ARENA_H */
