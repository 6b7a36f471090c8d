/* options.h - the environment, read once into a table (DESIGN.md section 1).
 *
 * Read on the first CUDA call, never at load time. Values are copied, so a
 * later setenv() in the host program changes nothing under the shim.
 */
#ifndef GG_OPTIONS_H
#define GG_OPTIONS_H

#include <stdbool.h>
#include "policy.h"

struct gg_options {
    const char *policy;       /* GPUGUARD_POLICY, or the default policy dir */
    const char *mode;         /* GPUGUARD_MODE, NULL if unset */
    const char *headroom;     /* GPUGUARD_HEADROOM */
    const char *journal_dir;  /* GPUGUARD_JOURNAL_DIR */
    const char *signal;       /* GPUGUARD_SIGNAL */
    const char *rank;         /* RANK */
    bool quiet;               /* GPUGUARD_QUIET=1 */
    bool driver_hooks;        /* GPUGUARD_DRIVER_HOOKS, default on */
    bool off;                 /* GPUGUARD_MODE=off: the whole shim passes through */
};

extern struct gg_options gg_opt;

/* Fill gg_opt from the environment. Bad values are said once on stderr. */
void gg_options_read(void);

/* The GPUGUARD_* overrides as the policy module takes them. */
struct gg_policy_env gg_options_policy_env(void);

#endif /* GG_OPTIONS_H */
