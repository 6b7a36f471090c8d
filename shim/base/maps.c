/* maps.c - layer 1: VMM mappings (see maps.h): one open-addressed table with
 * linear probing and backward-shift deletion, mmap'd, under one lock. */
#include "maps.h"

#include "prim.h"

#define MIN_CAP 64

static gg_spin lock = GG_SPIN_INIT;
static struct gg_mapping *slot;
static uint32_t cap, count;

static inline uint32_t home(uintptr_t va, uint32_t mask)
{
    return (uint32_t)gg_mix64(va) & mask;
}

static void place(struct gg_mapping *t, uint32_t c, const struct gg_mapping *m)
{
    uint32_t mask = c - 1, i = home(m->va, mask);
    while (t[i].va)
        i = (i + 1) & mask;
    t[i] = *m;
}

static GG_COLD bool grow(void)
{
    uint32_t c = cap ? cap * 2 : MIN_CAP;
    struct gg_mapping *t = gg_pages((size_t)c * sizeof *t);
    if (!t)
        return false;
    for (uint32_t i = 0; i < cap; i++)
        if (slot[i].va)
            place(t, c, &slot[i]);
    gg_pages_free(slot, (size_t)cap * sizeof *slot);
    slot = t;
    cap = c;
    return true;
}

static int64_t find(uintptr_t va)
{
    if (!cap)
        return -1;
    uint32_t mask = cap - 1;
    for (uint32_t i = home(va, mask);; i = (i + 1) & mask) {
        if (slot[i].va == va)
            return i;
        if (!slot[i].va)
            return -1;
    }
}

static void erase(uint32_t i)
{
    uint32_t mask = cap - 1;
    for (uint32_t j = (i + 1) & mask; slot[j].va; j = (j + 1) & mask) {
        uint32_t h = home(slot[j].va, mask);
        bool stays = (i <= j) ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            slot[i] = slot[j];
            i = j;
        }
    }
    slot[i].va = 0;
    count--;
}

bool gg_maps_add(const struct gg_mapping *m, struct gg_mapping *old, bool *had_old)
{
    bool ok = true;
    *had_old = false;
    if (!m->va)
        return false;
    gg_spin_lock(&lock);
    int64_t at = find(m->va);
    if (at >= 0) {
        *old = slot[at];
        *had_old = true;
        slot[at] = *m;
    } else if ((count + 1) * 4 <= cap * 3 || grow()) {
        place(slot, cap, m);
        count++;
    } else {
        ok = false;
    }
    gg_spin_unlock(&lock);
    return ok;
}

bool gg_maps_take(uintptr_t va, struct gg_mapping *out)
{
    gg_spin_lock(&lock);
    int64_t at = find(va);
    if (at >= 0) {
        *out = slot[at];
        erase((uint32_t)at);
    }
    gg_spin_unlock(&lock);
    return at >= 0;
}

#ifdef GG_TESTING
uint64_t gg_maps_count(void)
{
    return count;
}

void gg_maps_reset(void)
{
    gg_pages_free(slot, (size_t)cap * sizeof *slot);
    slot = NULL;
    cap = count = 0;
    gg_spin_reset(&lock);
}
#endif

void gg_maps_after_fork(void)
{
    gg_spin_reset(&lock);
}
