/* settings.h - layer 2: the settings of settings.def, as structs and a table.
 *
 * struct gg_settings holds one policy's values (one per device); struct
 * gg_process the environment-only ones (one per process). The table
 * gg_setting_info describes every row, and everything that reads, checks or
 * shows a setting goes through it: defaults, a policy file's keys, the
 * environment overrides, the linter's messages, gpuguard-check's listing.
 */
#ifndef GG_SETTINGS_H
#define GG_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>

#include "prim.h"
#include "values.h"

/* Where problems go: (file, line, message); line 0 when the problem has no
 * line (a missing file, an environment variable). */
typedef void (*gg_report_fn)(void *ctx, const char *file, int line, const char *msg);

enum gg_type { GG_T_SIZE, GG_T_INT, GG_T_BOOL, GG_T_MODE, GG_T_ENFORCE, GG_T_STACKS,
               GG_T_SIGNAL, GG_T_PATH, GG_T_GLOBS, GG_T_RANK };

#define GG_DECL_SIZE(f) struct gg_size f;
#define GG_DECL_INT(f) int f;
#define GG_DECL_BOOL(f) bool f;
#define GG_DECL_MODE(f) int f;
#define GG_DECL_ENFORCE(f) int f;
#define GG_DECL_STACKS(f) int f;
#define GG_DECL_SIGNAL(f) int f;
#define GG_DECL_PATH(f) char f[GG_PATH_MAX];
#define GG_DECL_GLOBS(f) char f[GG_MATCH_MAX];
#define GG_DECL_RANK(f) long f;
#define GG_POLICY_FIELD_gpu(f, type) GG_DECL_##type(f)
#define GG_POLICY_FIELD_memory(f, type) GG_DECL_##type(f)
#define GG_POLICY_FIELD_trainer(f, type) GG_DECL_##type(f)
#define GG_POLICY_FIELD_journal(f, type) GG_DECL_##type(f)
#define GG_POLICY_FIELD_process(f, type)
#define GG_PROCESS_FIELD_gpu(f, type)
#define GG_PROCESS_FIELD_memory(f, type)
#define GG_PROCESS_FIELD_trainer(f, type)
#define GG_PROCESS_FIELD_journal(f, type)
#define GG_PROCESS_FIELD_process(f, type) GG_DECL_##type(f)

/* One policy's values. An INT "not given" is 0; a RANK not given is -1. */
struct gg_settings {
#define SETTING(f, sec, key, env, type, dflt, min, max) GG_POLICY_FIELD_##sec(f, type)
#include "settings.def"
#undef SETTING
};

/* The environment-only settings. */
struct gg_process {
#define SETTING(f, sec, key, env, type, dflt, min, max) GG_PROCESS_FIELD_##sec(f, type)
#include "settings.def"
#undef SETTING
};

enum gg_setting_id {
#define SETTING(f, sec, key, env, type, dflt, min, max) GG_SET_##f,
#include "settings.def"
#undef SETTING
    GG_SET_COUNT
};

struct gg_setting_info {
    const char *section;   /* "memory", ...; "process" for environment-only */
    const char *key;
    const char *env;       /* NULL: no environment override */
    const char *dflt;
    enum gg_type type;
    long min, max;
    size_t offset;         /* in struct gg_settings, or gg_process when process */
    bool process;
};
extern const struct gg_setting_info gg_setting_info[GG_SET_COUNT];

/* The policy sections, in the order files are expected to use them. */
extern const char *const gg_sections[4];

/* A setting by section and key (any case); NULL when unknown. */
const struct gg_setting_info *gg_setting_find(const char *section, const char *key);
static inline enum gg_setting_id gg_setting_id(const struct gg_setting_info *i)
{
    return (enum gg_setting_id)(i - gg_setting_info);
}

/* "headroom, near_miss, ..." for a section's message. */
void gg_setting_keys(const char *section, char *out, size_t cap);

/* Every row's default. */
void gg_settings_defaults(struct gg_settings *s);
void gg_process_defaults(struct gg_process *p);

/* Parse `text` into setting id of *s (or *p for process rows). 0, or -1
 * with the reason in why (the value and its place are the caller's). */
int gg_setting_parse(enum gg_setting_id id, struct gg_settings *s, struct gg_process *p,
                     const char *text, char *why, size_t why_cap);

/* A setting's value as a policy file would say it. */
void gg_setting_format(enum gg_setting_id id, const struct gg_settings *s,
                       const struct gg_process *p, char *out, size_t cap);

/* The environment overrides of a policy (GPUGUARD_HEADROOM, ...): each bad
 * value reported with the variable as the file and line 0, the setting
 * unchanged. from_env[id] (may be NULL) says which took effect. Returns the
 * number of problems. */
int gg_settings_from_env(struct gg_settings *s, bool *from_env, gg_report_fn report, void *ctx);

/* The environment-only settings (GPUGUARD_POLICY, GPUGUARD_QUIET, ...).
 * Returns the number of problems reported. */
int gg_process_from_env(struct gg_process *p, gg_report_fn report, void *ctx);

/* In secure-execution mode (gg_secure) the settings that name a file or a
 * directory (type PATH: GPUGUARD_POLICY, GPUGUARD_JOURNAL_DIR,
 * GPUGUARD_METRICS_DIR, GPUGUARD_TRACE) are never read from the
 * environment: those that were set, as "GPUGUARD_POLICY, ..." in out (""
 * when none); its length. */
size_t gg_settings_secure_ignored(char *out, size_t cap);

/* GPUGUARD_MODE says off, in any spelling: the shim must be invisible.
 * Cheap, for paths that run before the settings are read. */
bool gg_settings_env_off(void);

#endif /* GG_SETTINGS_H */
