/* nopie.c - a non-PIE program (load bias 0, absolute symbol values) naming
 * its own static function and main through elfsym.c. Run by
 * tests/unit/test_elfsym.c; exit status 0 when both are right. */
#include "elfsym.h"

#include <stdio.h>
#include <string.h>

static __attribute__((noinline)) int nopie_static(int x)
{
    return x * 5 + 3;
}

static int named(uintptr_t addr, const char *want)
{
    struct gg_elfsym_hit h;
    bool ok = gg_elfsym_lookup(addr, &h) && h.sym && strcmp(h.sym, want) == 0 && h.bias == 0 &&
              addr - h.start < h.size;
    printf("nopie: %#lx: %s (bias %#lx) %s\n", (unsigned long)addr, h.sym ? h.sym : "(none)",
           (unsigned long)h.bias, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}

int main(void)
{
    return nopie_static(1) < 0 ? 2 :
           named((uintptr_t)nopie_static + 2, "nopie_static") | named((uintptr_t)main + 1, "main");
}
