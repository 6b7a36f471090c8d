/* stack.h - layer 3: the calling thread's stack, captured as a site.
 *
 * Native frames (unwind.h) and, when the thread runs Python, its Python
 * frames (pyframes.h), stored once in the site table (sites.h); a live
 * allocation keeps only the site id. A new site's Python frames are named
 * at once, while the thread that captured them still holds them (their code
 * objects cannot be gone), and the names are kept with the site; native
 * frames are named late (symbolize.h). A site with no Python frames keeps
 * the name of the thread that made it (autograd's backward threads, NCCL's
 * have none): the report says so rather than guess.
 */
#ifndef GG_STACK_H
#define GG_STACK_H

#include <stdbool.h>

#include "pyframes.h"
#include "sites.h"

#define GG_STACK_PYTHON_MAX 64 /* Python frames kept per stack */

/* What a site's note holds (gg_sites_note). */
struct gg_stack_note {
    int npy;                       /* Python frames named below */
    char thread[16];               /* the capturing thread's name */
    struct gg_py_frame py[];       /* innermost first */
};

/* Load what capturing needs; python: look for the interpreter now (and off
 * for good when false: GPUGUARD_PYTHON=0, [journal] python = no). */
void gg_stack_warmup(bool python);

/* The calling thread's stack on device dev, at most `depth` native frames
 * past the shim's own, and its Python frames: its site, or GG_SITE_NONE. */
gg_site gg_stack_capture(int dev, int depth);

/* A site's note; NULL when it has none (a site interned without capture). */
const struct gg_stack_note *gg_stack_note(gg_site site);

/* The fork story (life.c). */
void gg_stack_after_fork(void);

#endif /* GG_STACK_H */
