/* stack.c - layer 3: stacks captured as sites (see stack.h). */
#include "stack.h"

#include "prim.h"
#include "unwind.h"

void gg_stack_warmup(void)
{
    gg_unwind_warmup();
}

__attribute__((noinline)) gg_site gg_stack_capture(int dev, int depth)
{
    uintptr_t ips[GG_UNWIND_MAX];
    if (depth <= 0)
        return GG_SITE_NONE;
    size_t n = gg_unwind_capture(ips, (size_t)depth, (uintptr_t)__builtin_return_address(0));
    return gg_sites_intern(dev, ips, n, NULL, 0);
}
