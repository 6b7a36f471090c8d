/* stack.h - layer 3: the calling thread's stack, captured as a site.
 *
 * Native frames (unwind.h) and, when the thread runs Python, its Python
 * frames, stored once in the site table (sites.h); a live allocation keeps
 * only the site id. Names come later, once (symbolize.h).
 */
#ifndef GG_STACK_H
#define GG_STACK_H

#include "sites.h"

/* Load what capturing needs; called at start. */
void gg_stack_warmup(void);

/* The calling thread's stack on device dev, at most `depth` native frames
 * past the shim's own: its site, or GG_SITE_NONE. */
gg_site gg_stack_capture(int dev, int depth);

#endif /* GG_STACK_H */
