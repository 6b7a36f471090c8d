/* policy.c - layer 2: per-GPU-model INI policies (see policy.h). */
#include "policy.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "inifile.h"

#define SHOW "%.120s" /* how much of a value a message quotes */
#define MSG_MAX 768

/* ---- reporting ------------------------------------------------------------- */

struct sink {
    gg_report_fn report;
    void *ctx;
    int problems;
};

__attribute__((format(printf, 4, 5))) static void say(struct sink *s, const char *file, int line,
                                                      const char *fmt, ...)
{
    char msg[MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->problems++;
    if (s->report)
        s->report(s->ctx, file ? file : "", line, msg);
}

static const char *basename_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* ---- one file ----------------------------------------------------------------- */

/* SEC_MALFORMED: under a header that could not be read (its line said so);
 * each key line under it is said too, since none of them is read. */
enum { SEC_NONE = -1, SEC_IGNORED = -2, SEC_MALFORMED = -3 }; /* else an index of gg_sections */

struct load {
    struct gg_policy *p;
    const char *path;
    struct sink sink;
    int section;
    int malformed_line; /* the header of SEC_MALFORMED */
};

/* What could not be read of a setting's value, quoted, kept for the listing. */
static void keep_invalid(struct gg_policy *p, enum gg_setting_id id, const char *value)
{
    size_t cap = sizeof p->invalid[id];
    if (strlen(value) + 3 <= cap)
        snprintf(p->invalid[id], cap, "'%s'", value);
    else
        snprintf(p->invalid[id], cap, "'%.*s...'", (int)(cap - 6), value);
}

static void on_section(void *ctx, int line, const char *name)
{
    struct load *ld = ctx;
    ld->section = SEC_IGNORED;
    if (!name) {
        /* malformed: ini.c has said so */
        ld->section = SEC_MALFORMED;
        ld->malformed_line = line;
        return;
    }
    for (int i = 0; i < (int)GG_COUNT(gg_sections); i++)
        if (strcasecmp(gg_sections[i], name) == 0)
            ld->section = i;
    if (ld->section == SEC_IGNORED)
        say(&ld->sink, ld->path, line,
            "unknown section [%s] (expected [gpu], [memory], [trainer] or [journal])", name);
}

static void on_pair(void *ctx, int line, const char *key, const char *value)
{
    struct load *ld = ctx;
    struct gg_policy *p = ld->p;
    if (ld->section == SEC_IGNORED)
        return;
    if (ld->section == SEC_MALFORMED) {
        say(&ld->sink, ld->path, line,
            "key '" SHOW "' is not read: it is under the malformed section header on line %d",
            key, ld->malformed_line);
        return;
    }
    if (ld->section == SEC_NONE) {
        say(&ld->sink, ld->path, line,
            "key '" SHOW "' is outside a section (expected it under [gpu], [memory], "
            "[trainer] or [journal])", key);
        return;
    }
    const char *section = gg_sections[ld->section];
    if (!*key) {
        say(&ld->sink, ld->path, line, "missing key name before '='");
        return;
    }
    const struct gg_setting_info *info = gg_setting_find(section, key);
    if (!info) {
        char known[256];
        gg_setting_keys(section, known, sizeof known);
        say(&ld->sink, ld->path, line, "unknown key '" SHOW "' in [%s] (known: %s)", key, section,
            known);
        return;
    }
    enum gg_setting_id id = gg_setting_id(info);
    if (p->line[id]) {
        say(&ld->sink, ld->path, line, "[%s] %s is given twice (first on line %d)", section,
            info->key, p->line[id]);
        return;
    }
    p->line[id] = line;
    char why[256];
    if (gg_setting_parse(id, &p->s, NULL, value, why, sizeof why) != 0) {
        keep_invalid(p, id, value);
        say(&ld->sink, ld->path, line, "[%s] %s = '" SHOW "': %s", section, info->key, value, why);
    }
}

static void on_problem(void *ctx, int line, const char *msg)
{
    struct load *ld = ctx;
    say(&ld->sink, ld->path, line, "%s", msg);
}

/* What no single key can say: relations between keys. */
static void check_whole(struct load *ld)
{
    const struct gg_policy *p = ld->p;
    if (p->s.batch_size && p->s.min_batch_size > p->s.batch_size)
        say(&ld->sink, ld->path,
            p->line[GG_SET_min_batch_size] ? p->line[GG_SET_min_batch_size]
                                           : p->line[GG_SET_batch_size],
            "[trainer] min_batch_size = %d is larger than batch_size = %d", p->s.min_batch_size,
            p->s.batch_size);
}

void gg_policy_defaults(struct gg_policy *p)
{
    memset(p, 0, sizeof *p);
    gg_settings_defaults(&p->s);
}

int gg_policy_load(const char *path, struct gg_policy *p, gg_report_fn report, void *ctx)
{
    struct load ld = {.p = p, .path = path, .sink = {report, ctx, 0}, .section = SEC_NONE};
    gg_policy_defaults(p);
    if (!path || !*path) {
        say(&ld.sink, "", 0, "no policy file given");
        p->broken = true;
        return ld.sink.problems;
    }
    snprintf(p->file, sizeof p->file, "%s", path);
    if (strlen(path) >= sizeof p->file)
        say(&ld.sink, path, 0, "path too long (at most %zu characters)", sizeof p->file - 1);
    struct gg_inifile_handler h = {on_section, on_pair, on_problem, &ld};
    char why[GG_PATH_MAX];
    if (gg_inifile_parse(path, &h, why, sizeof why) != 0)
        say(&ld.sink, path, 0, "%s", why);
    else
        check_whole(&ld);
    p->broken = ld.sink.problems > 0;
    return ld.sink.problems;
}

int gg_policy_check_member(const char *path, const struct gg_policy *p, gg_report_fn report,
                           void *ctx)
{
    struct sink sink = {report, ctx, 0};
    if (!path || strcmp(basename_of(path), "default.ini") == 0 || p->s.match[0])
        return 0;
    say(&sink, path, 0,
        "no [gpu] match: a policy file in a directory must name the GPUs it is for "
        "(only default.ini may leave it out)");
    return sink.problems;
}

/* ---- directories ---------------------------------------------------------------- */

static int is_policy_name(const struct dirent *d)
{
    size_t len = strlen(d->d_name);
    return d->d_name[0] != '.' && len > 4 && strcmp(d->d_name + len - 4, ".ini") == 0;
}

static int name_order(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int join(char *out, size_t cap, const char *dir, const char *name)
{
    size_t len = strlen(dir);
    const char *sep = len && dir[len - 1] == '/' ? "" : "/";
    int w = snprintf(out, cap, "%s%s%s", dir, sep, name);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int gg_policy_dir_each(const char *dir, gg_policy_each_fn fn, void *arg, int *more)
{
    struct dirent **names;
    char path[GG_PATH_MAX];
    int n = scandir(dir, &names, is_policy_name, name_order);
    int rc = 0, err = 0, seen = 0;
    if (more)
        *more = 0;
    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        if (rc == 0 && err == 0) {
            if (join(path, sizeof path, dir, names[i]->d_name) != 0)
                err = ENAMETOOLONG;
            else if (is_dir(path))
                ; /* a directory named *.ini is not a policy */
            else if (seen == GG_POLICY_DIR_MAX) {
                if (more)
                    ++*more;
            } else {
                seen++;
                rc = fn(arg, path, names[i]->d_name);
                gg_progress();
            }
        }
        free(names[i]);
    }
    free(names);
    if (err) {
        errno = err;
        return -1;
    }
    return rc;
}

/* ---- selection ------------------------------------------------------------------ */

struct scan {
    const char *const *names;
    int n;
    struct gg_policy *out;
    bool *chosen;         /* out[i] has its file */
    int left;             /* devices without a file yet */
    struct sink *sink;
    bool *tried_bad;      /* per device: a file before its winner had a file-level problem */
};

/* While scanning, only file-level problems (line 0: cannot read, ...) are
 * passed on: they leave the file's match unknown. A chosen file is loaded
 * again with every problem reported, once. */
static void pass_file_level(void *ctx, const char *file, int line, const char *msg)
{
    struct sink *s = ctx;
    if (line == 0)
        say(s, file, 0, "%s", msg);
}

static int scan_file(void *arg, const char *path, const char *name)
{
    struct scan *sc = arg;
    struct gg_policy q;
    int before = sc->sink->problems;
    if (strcmp(name, "default.ini") == 0)
        return 0;
    gg_policy_load(path, &q, pass_file_level, sc->sink);
    bool bad = sc->sink->problems != before;
    if (!bad && gg_policy_check_member(path, &q, sc->sink->report, sc->sink->ctx)) {
        sc->sink->problems++;
        bad = true;
    }
    bool loaded = false;
    for (int i = 0; i < sc->n; i++) {
        if (sc->chosen[i])
            continue;
        if (bad) {
            sc->tried_bad[i] = true;
            continue;
        }
        if (!gg_globs_match(q.s.match, sc->names[i]))
            continue;
        if (!loaded) {
            /* Its problems once, for every device that gets it. */
            sc->sink->problems += gg_policy_load(path, &q, sc->sink->report, sc->sink->ctx);
            loaded = true;
        }
        sc->out[i] = q;
        sc->chosen[i] = true;
        sc->left--;
    }
    return sc->left == 0;
}

static int select_in_dir(const char *dir, const char *const *names, int n, struct gg_policy *out,
                         struct sink *sink)
{
    bool chosen[n], tried_bad[n];
    memset(chosen, 0, sizeof chosen);
    memset(tried_bad, 0, sizeof tried_bad);
    struct scan sc = {names, n, out, chosen, n, sink, tried_bad};
    int more = 0;
    if (gg_policy_dir_each(dir, scan_file, &sc, &more) < 0) {
        say(sink, dir, 0, "cannot read policy directory: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            gg_policy_defaults(&out[i]);
            out[i].broken = true;
        }
        return sink->problems;
    }
    if (more)
        say(sink, dir, 0, "more than %d policy files; the %d after the first %d were not read",
            GG_POLICY_DIR_MAX, more, GG_POLICY_DIR_MAX);
    if (sc.left) {
        /* default.ini of the directory, or the built-in defaults. */
        char path[GG_PATH_MAX];
        struct stat st;
        struct gg_policy d;
        if (join(path, sizeof path, dir, "default.ini") != 0 ||
            (lstat(path, &st) != 0 && errno == ENOENT))
            gg_policy_defaults(&d);
        else
            sink->problems += gg_policy_load(path, &d, sink->report, sink->ctx);
        for (int i = 0; i < n; i++)
            if (!chosen[i])
                out[i] = d;
    }
    for (int i = 0; i < n; i++)
        if (tried_bad[i])
            out[i].broken = true;
    return sink->problems;
}

int gg_policy_select(const char *where, const char *const *names, int n, struct gg_policy *out,
                     gg_report_fn report, void *ctx)
{
    struct sink sink = {report, ctx, 0};
    struct stat st;
    if (n <= 0)
        return 0;
    if (!where || !*where) {
        for (int i = 0; i < n; i++)
            gg_policy_defaults(&out[i]);
        return 0;
    }
    if (stat(where, &st) != 0) {
        say(&sink, where, 0, "cannot open policy file or directory: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            gg_policy_defaults(&out[i]);
            out[i].broken = true;
        }
        return sink.problems;
    }
    if (S_ISDIR(st.st_mode))
        return select_in_dir(where, names, n, out, &sink);
    sink.problems += gg_policy_load(where, &out[0], report, ctx);
    for (int i = 1; i < n; i++)
        out[i] = out[0];
    return sink.problems;
}

/* ---- environment and limits ---------------------------------------------------- */

/* An environment override that could not be read: kept (its variable is
 * the problem's file), then passed on. */
struct env_sink {
    struct gg_policy *p;
    gg_report_fn report;
    void *ctx;
};

static void env_problem(void *ctx, const char *file, int line, const char *msg)
{
    struct env_sink *e = ctx;
    for (int id = 0; id < GG_SET_COUNT; id++) {
        const struct gg_setting_info *i = &gg_setting_info[id];
        char value[GG_PATH_MAX];
        bool too_long;
        if (i->process || !i->env || strcmp(i->env, file) != 0)
            continue;
        if (!gg_env_copy(i->env, value, sizeof value, &too_long))
            snprintf(value, sizeof value, "%s", too_long ? "(too long)" : "");
        keep_invalid(e->p, (enum gg_setting_id)id, value);
        e->p->line[id] = 0;
    }
    if (e->report)
        e->report(e->ctx, file, line, msg);
}

int gg_policy_apply_env(struct gg_policy *p, gg_report_fn report, void *ctx)
{
    struct env_sink e = {p, report, ctx};
    int problems = gg_settings_from_env(&p->s, p->from_env, env_problem, &e);
    for (int id = 0; id < GG_SET_COUNT; id++)
        if (p->from_env[id]) {
            p->line[id] = 0;
            p->invalid[id][0] = '\0';
        }
    if (problems)
        p->broken = true;
    return problems;
}

static double gib(uint64_t bytes)
{
    return (double)bytes / (double)(1ULL << 30);
}

uint64_t gg_policy_limit(const struct gg_policy *p, uint64_t total, gg_report_fn report, void *ctx)
{
    struct sink sink = {report, ctx, 0};
    uint64_t headroom = gg_size_bytes(p->s.headroom, total);
    if (headroom <= total)
        return total - headroom;
    bool env = p->from_env[GG_SET_headroom];
    say(&sink, env ? gg_setting_info[GG_SET_headroom].env : p->file,
        env ? 0 : p->line[GG_SET_headroom],
        "headroom %.2f GiB (%" PRIu64 " bytes) is larger than the device "
        "(%.2f GiB, %" PRIu64 " bytes); the limit is the whole device",
        gib(headroom), headroom, gib(total), total);
    return total;
}

uint64_t gg_policy_near_miss(const struct gg_policy *p, uint64_t total)
{
    uint64_t margin = gg_size_bytes(p->s.near_miss, total);
    return margin < total ? margin : total;
}
