/* settings.c - layer 2: the table of settings.def (see settings.h). */
#include "settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GG_OFFSET_gpu(f) offsetof(struct gg_settings, f)
#define GG_OFFSET_memory(f) offsetof(struct gg_settings, f)
#define GG_OFFSET_trainer(f) offsetof(struct gg_settings, f)
#define GG_OFFSET_journal(f) offsetof(struct gg_settings, f)
#define GG_OFFSET_process(f) offsetof(struct gg_process, f)
#define GG_IS_PROCESS_gpu false
#define GG_IS_PROCESS_memory false
#define GG_IS_PROCESS_trainer false
#define GG_IS_PROCESS_journal false
#define GG_IS_PROCESS_process true

const struct gg_setting_info gg_setting_info[GG_SET_COUNT] = {
#define SETTING(f, sec, key, env, type, dflt, min, max) \
    {#sec, key, env, dflt, GG_T_##type, min, max, GG_OFFSET_##sec(f), GG_IS_PROCESS_##sec},
#include "settings.def"
#undef SETTING
};

const char *const gg_sections[4] = {"gpu", "memory", "trainer", "journal"};

const struct gg_setting_info *gg_setting_find(const char *section, const char *key)
{
    for (size_t i = 0; i < GG_SET_COUNT; i++) {
        const struct gg_setting_info *s = &gg_setting_info[i];
        if (!s->process && strcasecmp(s->section, section) == 0 && strcasecmp(s->key, key) == 0)
            return s;
    }
    return NULL;
}

void gg_setting_keys(const char *section, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < GG_SET_COUNT; i++) {
        const struct gg_setting_info *s = &gg_setting_info[i];
        if (s->process || strcasecmp(s->section, section) != 0)
            continue;
        int w = snprintf(out + len, cap - len, "%s%s", len ? ", " : "", s->key);
        if (w < 0 || (size_t)w >= cap - len)
            return;
        len += (size_t)w;
    }
}

static void *field(enum gg_setting_id id, struct gg_settings *s, struct gg_process *p)
{
    const struct gg_setting_info *i = &gg_setting_info[id];
    char *base = i->process ? (char *)p : (char *)s;
    return base ? base + i->offset : NULL;
}

static const void *cfield(enum gg_setting_id id, const struct gg_settings *s,
                          const struct gg_process *p)
{
    return field(id, (struct gg_settings *)s, (struct gg_process *)p);
}

static const struct gg_vocab *vocab_of(enum gg_type t)
{
    switch (t) {
    case GG_T_MODE:
        return &gg_vocab_mode;
    case GG_T_ENFORCE:
        return &gg_vocab_enforce;
    case GG_T_STACKS:
        return &gg_vocab_stacks;
    default:
        return NULL;
    }
}

int gg_setting_parse(enum gg_setting_id id, struct gg_settings *s, struct gg_process *p,
                     const char *text, char *why, size_t cap)
{
    const struct gg_setting_info *i = &gg_setting_info[id];
    void *f = field(id, s, p);
    const char *msg = NULL;
    if (!f) {
        snprintf(why, cap, "no place for this setting");
        return -1;
    }
    switch (i->type) {
    case GG_T_SIZE: {
        struct gg_size v;
        if (gg_value_size(text, &v, &msg) != 0)
            break;
        *(struct gg_size *)f = v;
        return 0;
    }
    case GG_T_INT: {
        int v;
        if (gg_value_int(text, i->min, i->max, &v, why, cap) != 0)
            return -1;
        *(int *)f = v;
        return 0;
    }
    case GG_T_BOOL: {
        bool v;
        if (gg_value_bool(text, &v, &msg) != 0)
            break;
        *(bool *)f = v;
        return 0;
    }
    case GG_T_MODE:
    case GG_T_ENFORCE:
    case GG_T_STACKS: {
        int v;
        if (gg_value_word(text, vocab_of(i->type), &v, why, cap) != 0)
            return -1;
        *(int *)f = v;
        return 0;
    }
    case GG_T_SIGNAL: {
        int v;
        if (gg_value_signal(text, &v, &msg) != 0)
            break;
        *(int *)f = v;
        return 0;
    }
    case GG_T_PATH: {
        size_t n = strlen(text);
        if (n == 0)
            msg = "empty (expected a directory)";
        else if (n >= GG_PATH_MAX)
            msg = "too long (at most 1023 characters)";
        else {
            memcpy(f, text, n + 1);
            return 0;
        }
        break;
    }
    case GG_T_GLOBS:
        if (gg_value_globs(text, &msg) != 0)
            break;
        snprintf(f, GG_MATCH_MAX, "%s", text);
        return 0;
    case GG_T_RANK: {
        long v;
        if (gg_value_rank(text, i->max, &v, &msg) != 0)
            break;
        *(long *)f = v;
        return 0;
    }
    }
    snprintf(why, cap, "%s", msg ? msg : "bad value");
    return -1;
}

/* The "not given" state of a row whose default is "". */
static void unset(enum gg_setting_id id, struct gg_settings *s, struct gg_process *p)
{
    const struct gg_setting_info *i = &gg_setting_info[id];
    void *f = field(id, s, p);
    if (!f)
        return;
    switch (i->type) {
    case GG_T_PATH:
    case GG_T_GLOBS:
        *(char *)f = '\0';
        break;
    case GG_T_RANK:
        *(long *)f = -1;
        break;
    case GG_T_INT:
        *(int *)f = 0;
        break;
    default:
        break;
    }
}

static void defaults(struct gg_settings *s, struct gg_process *p, bool process)
{
    for (int id = 0; id < GG_SET_COUNT; id++) {
        const struct gg_setting_info *i = &gg_setting_info[id];
        char why[160];
        if (i->process != process)
            continue;
        if (!i->dflt[0])
            unset((enum gg_setting_id)id, s, p);
        else
            (void)gg_setting_parse((enum gg_setting_id)id, s, p, i->dflt, why, sizeof why);
    }
}

void gg_settings_defaults(struct gg_settings *s)
{
    memset(s, 0, sizeof *s);
    defaults(s, NULL, false);
}

void gg_process_defaults(struct gg_process *p)
{
    memset(p, 0, sizeof *p);
    defaults(NULL, p, true);
}

void gg_setting_format(enum gg_setting_id id, const struct gg_settings *s,
                       const struct gg_process *p, char *out, size_t cap)
{
    const struct gg_setting_info *i = &gg_setting_info[id];
    const void *f = cfield(id, s, p);
    if (!f) {
        snprintf(out, cap, "?");
        return;
    }
    switch (i->type) {
    case GG_T_SIZE: {
        const struct gg_size *v = f;
        static const char *const unit[] = {"TiB", "GiB", "MiB", "KiB"};
        int k = 0;
        while (k < 4 && (v->bytes == 0 || v->bytes % (1ull << (10 * (4 - k))) != 0))
            k++;
        if (v->is_percent) {
            /* Fixed notation, which the size parser reads (it takes no
             * exponent: %g made 0.0000001% "1e-07%"), with the fewest
             * decimals that give the value back, at most 15 (the digits
             * the parser holds), and no trailing zeros. */
            char num[32];
            for (int decimals = 0; decimals <= 15; decimals++) {
                snprintf(num, sizeof num, "%.*f", decimals, v->percent);
                if (strtod(num, NULL) == v->percent)
                    break;
            }
            size_t n = strlen(num);
            while (strchr(num, '.') && (num[n - 1] == '0' || num[n - 1] == '.'))
                num[--n] = '\0';
            snprintf(out, cap, "%s%%", num);
        } else if (k < 4)
            snprintf(out, cap, "%llu %s", (unsigned long long)(v->bytes >> (10 * (4 - k))),
                     unit[k]);
        else
            snprintf(out, cap, "%llu", (unsigned long long)v->bytes);
        break;
    }
    case GG_T_INT:
        if (*(const int *)f)
            snprintf(out, cap, "%d", *(const int *)f);
        else
            snprintf(out, cap, "(not given)");
        break;
    case GG_T_BOOL:
        snprintf(out, cap, "%s", *(const bool *)f ? "yes" : "no");
        break;
    case GG_T_MODE:
    case GG_T_ENFORCE:
    case GG_T_STACKS:
        snprintf(out, cap, "%s", gg_value_word_name(vocab_of(i->type), *(const int *)f));
        break;
    case GG_T_SIGNAL: {
        const char *n = gg_signal_name(*(const int *)f);
        if (n)
            snprintf(out, cap, "%s", n);
        else
            snprintf(out, cap, "%d", *(const int *)f);
        break;
    }
    case GG_T_PATH:
    case GG_T_GLOBS:
        snprintf(out, cap, "%s", *(const char *)f || i->type == GG_T_GLOBS ? (const char *)f
                                                                             : "(not given)");
        break;
    case GG_T_RANK:
        if (*(const long *)f >= 0)
            snprintf(out, cap, "%ld", *(const long *)f);
        else
            snprintf(out, cap, "(not set)");
        break;
    }
}

/* The settings naming a file that secure-execution mode left unread. */
static _Atomic uint64_t secure_ignored;

size_t gg_settings_secure_ignored(char *out, size_t cap)
{
    uint64_t bits = atomic_load(&secure_ignored);
    size_t len = 0;
    if (cap)
        out[0] = '\0';
    for (int id = 0; id < GG_SET_COUNT && cap; id++) {
        if (!(bits & (1ull << id)))
            continue;
        int n = snprintf(out + len, cap - len, "%s%s", len ? ", " : "", gg_setting_info[id].env);
        if (n < 0 || (size_t)n >= cap - len)
            break;
        len += (size_t)n;
    }
    return len;
}

/* One environment override: "GPUGUARD_X: 'value': why" when bad. */
static int from_env(enum gg_setting_id id, struct gg_settings *s, struct gg_process *p,
                    bool *set, gg_report_fn report, void *ctx)
{
    const struct gg_setting_info *i = &gg_setting_info[id];
    char value[GG_PATH_MAX], why[256], msg[GG_PATH_MAX + 300];
    bool too_long;
    if (set)
        *set = false;
    if (i->env && i->type == GG_T_PATH && gg_secure()) {
        /* secure-execution mode: the caller's environment names no file */
        if (getenv(i->env))
            atomic_fetch_or(&secure_ignored, 1ull << id);
        return 0;
    }
    if (!i->env || !gg_env_copy(i->env, value, sizeof value, &too_long)) {
        if (i->env && too_long && report) {
            report(ctx, i->env, 0, "too long (at most 1023 characters); ignored");
            return 1;
        }
        return 0;
    }
    if (gg_setting_parse(id, s, p, value, why, sizeof why) != 0) {
        if (report) {
            snprintf(msg, sizeof msg, "'%.120s': %s", value, why);
            report(ctx, i->env, 0, msg);
        }
        return 1;
    }
    if (set)
        *set = true;
    return 0;
}

int gg_settings_from_env(struct gg_settings *s, bool *set, gg_report_fn report, void *ctx)
{
    int problems = 0;
    for (int id = 0; id < GG_SET_COUNT; id++)
        if (!gg_setting_info[id].process)
            problems += from_env((enum gg_setting_id)id, s, NULL, set ? &set[id] : NULL, report,
                                 ctx);
    return problems;
}

int gg_process_from_env(struct gg_process *p, gg_report_fn report, void *ctx)
{
    int problems = 0;
    for (int id = 0; id < GG_SET_COUNT; id++)
        if (gg_setting_info[id].process)
            problems += from_env((enum gg_setting_id)id, NULL, p, NULL, report, ctx);
    return problems;
}

bool gg_settings_env_off(void)
{
    const char *v = getenv(gg_setting_info[GG_SET_mode].env);
    int mode;
    char why[160];
    return v && gg_value_word(v, &gg_vocab_mode, &mode, why, sizeof why) == 0 &&
           mode == GG_MODE_OFF;
}
