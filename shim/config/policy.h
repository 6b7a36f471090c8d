/* policy.h - layer 2: per-GPU-model INI policies (docs/policy.md).
 *
 * One policy file per GPU model. For each device the files of a directory
 * are tried in name order and the first whose [gpu] match fits the device
 * name wins; default.ini applies when none does. Environment overrides
 * (GPUGUARD_MODE, GPUGUARD_HEADROOM, ...) apply on top.
 *
 * Every problem goes to a gg_report_fn as (file, line, message). A policy
 * with a problem is still filled with what could be read, and `broken` is
 * set: the shim then runs that device in observe mode, gpuguard-check
 * --lint exits 1. Shared by the shim and gpuguard-check: no global state,
 * no printing, nothing that outlives a call.
 */
#ifndef GG_POLICY_H
#define GG_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "settings.h"

#define GG_POLICY_DIR_MAX 4096 /* files of a directory considered */
#define GG_POLICY_INVALID_MAX 32 /* what a listing quotes of a value it could not read */

struct gg_policy {
    struct gg_settings s;
    char file[GG_PATH_MAX];        /* where it came from; "" for the built-in defaults */
    bool broken;                   /* a problem was reported for it */
    int line[GG_SET_COUNT];        /* the line that set each key in `file`, 0 = default */
    bool from_env[GG_SET_COUNT];   /* an environment variable set it */
    /* A value given for the setting that could not be read (the default
     * stands), quoted as given ('enforced'), cut to fit; "" when none was. Given on line[id] of
     * `file`, or, when line[id] is 0, by its environment variable. */
    char invalid[GG_SET_COUNT][GG_POLICY_INVALID_MAX];
};

/* The built-in defaults (settings.def). */
void gg_policy_defaults(struct gg_policy *p);

/* Parse one file into *p (defaults first). Returns the number of problems. */
int gg_policy_load(const char *path, struct gg_policy *p, gg_report_fn report, void *ctx);

/* Choose and load the policy of each of n devices, named names[i], into
 * out[i]: `where` is a file (used for every device) or a directory (files
 * *.ini in name order, first match wins, default.ini as fallback, the
 * built-in defaults when there is none). Every file is parsed once however
 * many devices there are, and each problem is reported once. What a device
 * is told about a directory: that it cannot be read; each file tried before
 * its winner that cannot be read or has no [gpu] match (it might have been
 * meant for it); every problem of the file it gets. Problems of files no
 * device needed are gpuguard-check --lint's. Returns the number of problems;
 * out[i].broken says which devices they concern. */
int gg_policy_select(const char *where, const char *const *names, int n, struct gg_policy *out,
                     gg_report_fn report, void *ctx);

/* Apply the environment overrides; bad values are reported with the
 * variable's name as the file and line 0. Returns the number of problems. */
int gg_policy_apply_env(struct gg_policy *p, gg_report_fn report, void *ctx);

/* The limit for a device of `total` bytes: total - headroom. A headroom
 * larger than the device is reported (the file and line that set it) and
 * the limit is then `total`. */
uint64_t gg_policy_limit(const struct gg_policy *p, uint64_t total, gg_report_fn report,
                         void *ctx);

/* The near-miss margin in bytes for a device of `total` bytes. */
uint64_t gg_policy_near_miss(const struct gg_policy *p, uint64_t total);

/* The policy files of a directory: regular files named *.ini that do not
 * start with '.', in strcmp order, at most GG_POLICY_DIR_MAX of them. Calls
 * fn(arg, path, name) for each and stops at the first nonzero return, which
 * it returns; 0 when all were seen; -1 with errno set when the directory
 * cannot be read. *more (may be NULL) counts the files left out by the cap. */
typedef int (*gg_policy_each_fn)(void *arg, const char *path, const char *name);
int gg_policy_dir_each(const char *dir, gg_policy_each_fn fn, void *arg, int *more);

/* A file of a policy directory other than default.ini must have a [gpu]
 * match, or it could never apply. Reports (path, 0, ...) and returns 1 when
 * *p (loaded from path) has none; else 0. */
int gg_policy_check_member(const char *path, const struct gg_policy *p, gg_report_fn report,
                           void *ctx);

#endif /* GG_POLICY_H */
