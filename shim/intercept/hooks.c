/* hooks.c - layer 6: the table of every hook, from hooks.def (see hooks.h),
 * and the one switch that turns the driver's hooks off. */
#include "hooks.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "prim.h"
#include "settings.h"
#include "values.h"

const struct gg_hook_info gg_hooks[GG_HOOK_COUNT] = {
#define HOOK(id, family, export, base, min, max, ptsz, shape, journal) \
    [GG_HOOK_##id] = {#export, #base, journal, min, max, GG_FAMILY_##family, ptsz},
#define GG_FAMILY_RT false
#define GG_FAMILY_DRV true
#include "hooks.def"
#undef HOOK
};

bool gg_hooks_driver_enabled(void)
{
    static _Atomic int enabled = -1;
    int e = atomic_load_explicit(&enabled, memory_order_relaxed);
    if (gg_unlikely(e < 0)) {
        const char *v = getenv(gg_setting_info[GG_SET_driver_hooks].env);
        const char *why;
        bool on = true;
        if (v && *v && gg_value_bool(v, &on, &why) != 0)
            on = true; /* a bad value is said when the settings are read */
        e = on;
        atomic_store_explicit(&enabled, e, memory_order_relaxed);
    }
    return e;
}
