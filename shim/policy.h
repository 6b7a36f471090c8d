/* policy.h - per-GPU-model INI policies (DESIGN.md section 1, "Policy files").
 *
 * One policy file per GPU model. For each device the files of a directory
 * are tried in name order and the first whose [gpu] match fits the device
 * name wins; default.ini applies when none does. Environment overrides
 * (GPUGUARD_MODE, GPUGUARD_HEADROOM, ...) are applied on top.
 *
 * Every problem is reported through a gg_policy_report callback as
 * (file, line, message); line is 0 when the problem has no line (a missing
 * file, an environment variable). A policy with a problem is still filled
 * with what could be read, and `broken` is set: the shim then runs that
 * device in observe mode, gpuguard-check --lint exits 1.
 *
 * This module is shared by the shim and gpuguard-check: it allocates nothing
 * that outlives a call, prints nothing, and reads no environment itself.
 */
#ifndef GG_POLICY_H
#define GG_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#define GG_PATH_MAX 1024
#define GG_MATCH_MAX 512

/* auto: observe until a trainer registers (gpuguard_set_batch), then enforce. */
enum gg_mode { GG_MODE_OFF = 0, GG_MODE_OBSERVE = 1, GG_MODE_ENFORCE = 2, GG_MODE_AUTO = 3 };
enum gg_enforce { GG_ENFORCE_RUNTIME = 0, GG_ENFORCE_ALL = 1 };
enum gg_stacks { GG_STACKS_OFF = 0, GG_STACKS_NEAR_MISS = 1, GG_STACKS_ALL = 2 };

/* A size as written: bytes, or a share of the device's total memory. */
struct gg_size {
    uint64_t bytes;        /* when !percent */
    double percent;        /* when percent: 0..100 */
    bool is_percent;
};

struct gg_policy {
    char file[GG_PATH_MAX];        /* the file this came from, "" for built-in */
    char match[GG_MATCH_MAX];      /* [gpu] match, comma-separated globs */
    struct gg_size headroom;       /* [memory] headroom; default 0 */
    struct gg_size near_miss;      /* [memory] near_miss; default 5% */
    enum gg_mode mode;             /* default auto */
    enum gg_enforce enforce;       /* default runtime */
    bool virtualize_meminfo;       /* default yes */
    int signal;                    /* [trainer] signal; 0 = none; default SIGUSR2 */
    int batch_size;                /* 0 = not given */
    int grad_accum;                /* 0 = not given */
    int min_batch_size;            /* default 1 */
    char journal_dir[GG_PATH_MAX]; /* default "." */
    enum gg_stacks stacks;         /* default near_miss */
    int depth;                     /* default 32, 1..128 */
    bool broken;                   /* a problem was reported for this policy */
    /* Added for reporting: where the headroom came from. */
    int headroom_line;             /* line of [memory] headroom in `file`, 0 = none */
    bool headroom_from_env;        /* GPUGUARD_HEADROOM set it */
};

/* Environment overrides, as read once by the shim (options.c). NULL = unset. */
struct gg_policy_env {
    const char *policy;       /* GPUGUARD_POLICY */
    const char *mode;         /* GPUGUARD_MODE */
    const char *headroom;     /* GPUGUARD_HEADROOM */
    const char *journal_dir;  /* GPUGUARD_JOURNAL_DIR */
    const char *signal;       /* GPUGUARD_SIGNAL */
};

typedef void (*gg_policy_report)(void *ctx, const char *file, int line, const char *msg);

/* The built-in defaults, used when no file applies. */
void gg_policy_defaults(struct gg_policy *p);

/* Parse one file into *p (defaults first). Returns the number of problems. */
int gg_policy_load(const char *path, struct gg_policy *p, gg_policy_report report, void *ctx);

/* Choose and load the policy for a device: `where` is a file (used for every
 * device) or a directory (files *.ini in name order, first match wins,
 * default.ini as fallback, built-in defaults when there is no default.ini).
 * Returns the number of problems. */
int gg_policy_select(const char *where, const char *device_name, struct gg_policy *p,
                     gg_policy_report report, void *ctx);

/* Apply GPUGUARD_MODE, GPUGUARD_HEADROOM, GPUGUARD_JOURNAL_DIR, GPUGUARD_SIGNAL.
 * A bad value is reported with the variable's name as the file and line 0.
 * Returns the number of problems. */
int gg_policy_apply_env(struct gg_policy *p, const struct gg_policy_env *env,
                        gg_policy_report report, void *ctx);

/* The limit for a device of `total` bytes: total - headroom. A headroom
 * larger than the device is reported (file of the policy, line 0) and the
 * limit is then `total`. */
uint64_t gg_policy_limit(const struct gg_policy *p, uint64_t total,
                         gg_policy_report report, void *ctx);

/* The near-miss margin in bytes for a device of `total` bytes. */
uint64_t gg_policy_near_miss(const struct gg_policy *p, uint64_t total);

/* Parse "1.5 GiB", "512MB", "4096", "10%". 0 on success, -1 with *why set. */
int gg_size_parse(const char *text, struct gg_size *out, const char **why);
/* Resolve against a device's total memory. */
uint64_t gg_size_bytes(struct gg_size s, uint64_t total);

/* Does `name` match any of the comma-separated globs in `match`? */
bool gg_policy_matches(const char *match, const char *name);

const char *gg_mode_name(enum gg_mode m);
const char *gg_enforce_name(enum gg_enforce e);
const char *gg_stacks_name(enum gg_stacks s);
/* "SIGUSR2" for a known signal, "none" for 0, NULL for a bare number. */
const char *gg_signal_name(int sig);

/* The policy files of a directory: names ending in ".ini" that do not start
 * with '.', directories left out, in strcmp order of the names. Calls
 * fn(arg, path, name) for each (path = dir/name) and stops at the first
 * nonzero return, which it returns; 0 when all were seen; -1 with errno set
 * when the directory cannot be read. Allocates only for the call. */
typedef int (*gg_policy_each_fn)(void *arg, const char *path, const char *name);
int gg_policy_dir_each(const char *dir, gg_policy_each_fn fn, void *arg);

/* A file of a policy directory other than default.ini must have a [gpu]
 * match, or it could never apply. Reports (path, 0, ...) and returns 1 when
 * *p (loaded from path) has none; else 0. */
int gg_policy_check_member(const char *path, const struct gg_policy *p,
                           gg_policy_report report, void *ctx);

#endif /* GG_POLICY_H */
