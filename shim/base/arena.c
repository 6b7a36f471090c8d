/* arena.c - layer 1: process-lifetime memory and interned strings (see arena.h). */
#include "arena.h"

#include <string.h>

#include "prim.h"

void *gg_arena_alloc(struct gg_arena *a, size_t size, size_t align)
{
    if (size == 0 || size > GG_ARENA_CHUNK)
        return NULL;
    size_t pad = (align - ((uintptr_t)a->cur & (align - 1))) & (align - 1);
    if (!a->cur || pad + size > a->left) {
        if (a->chunks >= a->max_chunks)
            return NULL;
        char *p = gg_pages(GG_ARENA_CHUNK);
        if (!p)
            return NULL;
        a->chunks++;
        a->cur = p;
        a->left = GG_ARENA_CHUNK;
        pad = 0;
    }
    void *r = a->cur + pad;
    a->cur += pad + size;
    a->left -= pad + size;
    return r;
}

#ifdef GG_TESTING
size_t gg_arena_footprint(const struct gg_arena *a)
{
    return (size_t)a->chunks * GG_ARENA_CHUNK;
}
#endif

const char *gg_strings_intern(struct gg_strings *t, const char *s)
{
    size_t len = strnlen(s, t->max_len - 1);
    if (!t->index)
        t->index = gg_pages((size_t)t->slots * sizeof *t->index);
    size_t slot = SIZE_MAX;
    if (t->index) {
        size_t mask = t->slots - 1;
        size_t i = (size_t)gg_mix64(gg_hash_bytes(s, len)) & mask;
        for (size_t probes = 0; probes < t->slots; probes++, i = (i + 1) & mask) {
            const char *u = t->index[i];
            if (!u) {
                slot = i;
                break;
            }
            if (strncmp(u, s, len) == 0 && u[len] == '\0')
                return u;
        }
    }
    char *copy = gg_arena_alloc(&t->arena, len + 1, 1);
    if (!copy)
        return NULL;
    memcpy(copy, s, len);
    copy[len] = '\0';
    if (slot != SIZE_MAX && t->count < t->slots / 2) {
        t->index[slot] = copy;
        t->count++;
    }
    return copy;
}
