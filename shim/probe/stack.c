/* stack.c - layer 3: stacks captured as sites (see stack.h). */
#include "stack.h"

#include <string.h>
#include <sys/prctl.h>

#include "arena.h"
#include "prim.h"
#include "unwind.h"

#define NOTE_ARENA_CHUNKS 64 /* 64 MiB of notes */

static gg_spin lock = GG_SPIN_INIT; /* the notes' arena */
static struct gg_arena notes = GG_ARENA_INIT(NOTE_ARENA_CHUNKS);

void gg_stack_warmup(bool python)
{
    gg_unwind_warmup();
    if (python)
        (void)gg_py_state();
    else
        gg_py_disable();
}

/* A new site: name its Python frames now, while they are live. */
static GG_COLD void annotate(gg_site site, const struct gg_py_raw *raw, int npy)
{
    size_t size = sizeof(struct gg_stack_note) + (size_t)npy * sizeof(struct gg_py_frame);
    struct gg_stack_note *n;
    /* A bounded wait: a signal handler's capture may interrupt this thread
     * inside the lock; then the site just has no note. */
    if (!gg_spin_trylock(&lock, 10000))
        return;
    n = gg_arena_alloc(&notes, size, _Alignof(struct gg_stack_note));
    gg_spin_unlock(&lock);
    if (!n)
        return;
    n->npy = npy;
    if (npy)
        gg_py_resolve(raw, npy, true, n->py); /* one it cannot name says "?" */
    memset(n->thread, 0, sizeof n->thread);
    if (!npy)
        prctl(PR_GET_NAME, n->thread, 0, 0, 0);
    gg_sites_set_note(site, n); /* another thread may have been first */
}

/* The frames of one capture: kilobytes, kept on the side stack (prim.h). */
struct capture {
    uintptr_t ips[GG_UNWIND_MAX], words[2 * GG_STACK_PYTHON_MAX];
    struct gg_py_raw raw[GG_STACK_PYTHON_MAX];
};

__attribute__((noinline)) gg_site gg_stack_capture(int dev, int depth)
{
    struct capture *cap = depth > 0 ? gg_side_push(sizeof *cap) : NULL;
    if (!cap)
        return GG_SITE_NONE;
    uintptr_t *ips = cap->ips, *words = cap->words;
    struct gg_py_raw *raw = cap->raw;
    size_t n = gg_unwind_capture(ips, (size_t)depth, (uintptr_t)__builtin_return_address(0));
    int npy = gg_py_capture(raw, GG_STACK_PYTHON_MAX);
    for (int i = 0; i < npy; i++) {
        words[2 * i] = raw[i].code;
        words[2 * i + 1] = (uintptr_t)(uint32_t)raw[i].addr | (uintptr_t)raw[i].ident << 32;
    }
    gg_site site = gg_sites_intern(dev, ips, n, words, (size_t)npy);
    if (site != GG_SITE_NONE && gg_unlikely(!gg_sites_note(site)))
        annotate(site, raw, npy);
    gg_side_pop(cap);
    return site;
}

const struct gg_stack_note *gg_stack_note(gg_site site)
{
    return gg_sites_note(site);
}

void gg_stack_after_fork(void)
{
    gg_spin_reset(&lock);
}
