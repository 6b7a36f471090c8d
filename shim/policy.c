/* policy.c - per-GPU-model INI policies (DESIGN.md section 1, "Policy files").
 *
 * Parsing goes through inih's ini_parse_stream with our own line reader. The
 * reader counts lines (Debian's inih passes no line numbers to the handler,
 * which it calls synchronously for the line the reader has just returned),
 * strips leading white space (so inih's multi-line continuations never turn
 * an indented key into part of the previous value), refuses over-long lines
 * (inih would silently split them) and checks section headers itself, so a
 * section without keys or a header inih cannot parse is still reported. A
 * key line for which inih never calls the handler is a line it could not
 * parse.
 *
 * Shared by the shim and gpuguard-check: no global state, no printing, no
 * environment; every problem goes to the caller's callback.
 */
#include "policy.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <ini.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>

__extension__ typedef unsigned __int128 gg_u128;

#define GG_MSG_MAX 768
#define GG_SHOW "%.120s"        /* how much of a value a message quotes */
#define GG_INT_MAX_COUNT 1048576 /* batch sizes and accumulation steps */
#define GG_DEPTH_MAX 128

/* ------------------------------------------------------------------------ */
/* Reporting                                                                 */

/* Where problems go, and how many there were. */
struct gg_sink {
    gg_policy_report report;
    void *ctx;
    int problems;
};

__attribute__((format(printf, 4, 5)))
static void gg_problem(struct gg_sink *s, const char *file, int line, const char *fmt, ...)
{
    char msg[GG_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->problems++;
    if (s->report)
        s->report(s->ctx, file ? file : "", line, msg);
}

static const char *gg_errstr(int err, char *buf, size_t len)
{
    return strerror_r(err, buf, len);
}

/* ------------------------------------------------------------------------ */
/* Small string helpers                                                      */

static bool gg_is_blank(int c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

static const char *gg_skip_blank(const char *s)
{
    while (*s && gg_is_blank((unsigned char)*s))
        s++;
    return s;
}

/* Copy s[0..len) without surrounding white space into out (truncating). */
static void gg_copy_trimmed(char *out, size_t cap, const char *s, size_t len)
{
    while (len && gg_is_blank((unsigned char)*s)) {
        s++;
        len--;
    }
    while (len && gg_is_blank((unsigned char)s[len - 1]))
        len--;
    if (len >= cap)
        len = cap - 1;
    memcpy(out, s, len);
    out[len] = '\0';
}

static void gg_copy(char *out, size_t cap, const char *s)
{
    snprintf(out, cap, "%s", s);
}

/* inih's find_chars_or_comment: the first of `chars`, or an inline ';'
 * comment (one that follows white space), or the end. */
static const char *gg_find_sep(const char *s, const char *chars)
{
    bool was_space = false;

    while (*s && !(chars && strchr(chars, *s)) && !(was_space && *s == ';')) {
        was_space = isspace((unsigned char)*s) != 0;
        s++;
    }
    return s;
}

static const char *gg_basename(const char *path)
{
    const char *slash = strrchr(path, '/');

    return slash ? slash + 1 : path;
}

/* ------------------------------------------------------------------------ */
/* Names of values                                                           */

struct gg_name {
    const char *name;
    int value;
};

#define GG_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const struct gg_name gg_modes[] = {
    { "auto", GG_MODE_AUTO }, { "enforce", GG_MODE_ENFORCE }, { "observe", GG_MODE_OBSERVE },
    { "off", GG_MODE_OFF },
};
static const struct gg_name gg_enforces[] = {
    { "runtime", GG_ENFORCE_RUNTIME }, { "all", GG_ENFORCE_ALL },
};
static const struct gg_name gg_stackses[] = {
    { "all", GG_STACKS_ALL }, { "near_miss", GG_STACKS_NEAR_MISS }, { "off", GG_STACKS_OFF },
};
static const struct gg_name gg_bools[] = {
    { "yes", 1 }, { "no", 0 }, { "true", 1 }, { "false", 0 },
    { "1", 1 },   { "0", 0 },  { "on", 1 },   { "off", 0 },
};
/* Signals by name. Only `advice` ones may carry advice: a trainer that handles
 * one of the others (Python's KeyboardInterrupt for SIGINT, faulthandler for
 * SIGSEGV and SIGABRT, a framework's checkpoint-and-exit for SIGTERM) stops or
 * crashes on it, and SIGKILL and SIGSTOP cannot be handled at all. */
struct gg_signal {
    const char *name;
    int sig;
    bool advice;
};

static const struct gg_signal gg_signals[] = {
    { "SIGHUP", SIGHUP, true },       { "SIGINT", SIGINT, false },
    { "SIGQUIT", SIGQUIT, false },    { "SIGILL", SIGILL, false },
    { "SIGTRAP", SIGTRAP, false },    { "SIGABRT", SIGABRT, false },
    { "SIGBUS", SIGBUS, false },      { "SIGFPE", SIGFPE, false },
    { "SIGKILL", SIGKILL, false },    { "SIGUSR1", SIGUSR1, true },
    { "SIGSEGV", SIGSEGV, false },    { "SIGUSR2", SIGUSR2, true },
    { "SIGPIPE", SIGPIPE, false },    { "SIGALRM", SIGALRM, true },
    { "SIGTERM", SIGTERM, false },    { "SIGCHLD", SIGCHLD, true },
    { "SIGCONT", SIGCONT, true },     { "SIGSTOP", SIGSTOP, false },
    { "SIGTSTP", SIGTSTP, false },    { "SIGTTIN", SIGTTIN, false },
    { "SIGTTOU", SIGTTOU, false },    { "SIGURG", SIGURG, true },
    { "SIGXCPU", SIGXCPU, false },    { "SIGXFSZ", SIGXFSZ, false },
    { "SIGVTALRM", SIGVTALRM, true }, { "SIGPROF", SIGPROF, true },
    { "SIGWINCH", SIGWINCH, true },   { "SIGIO", SIGIO, true },
    { "SIGPWR", SIGPWR, true },       { "SIGSYS", SIGSYS, false },
};

static int gg_lookup(const struct gg_name *t, size_t n, const char *name, int *out)
{
    for (size_t i = 0; i < n; i++) {
        if (strcasecmp(t[i].name, name) == 0) {
            *out = t[i].value;
            return 0;
        }
    }
    return -1;
}

static const char *gg_name_of(const struct gg_name *t, size_t n, int value)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].value == value)
            return t[i].name;
    return "?";
}

const char *gg_mode_name(enum gg_mode m)
{
    return gg_name_of(gg_modes, GG_COUNT(gg_modes), (int)m);
}

const char *gg_enforce_name(enum gg_enforce e)
{
    return gg_name_of(gg_enforces, GG_COUNT(gg_enforces), (int)e);
}

const char *gg_stacks_name(enum gg_stacks s)
{
    return gg_name_of(gg_stackses, GG_COUNT(gg_stackses), (int)s);
}

static const struct gg_signal *gg_signal_by_number(int sig)
{
    for (size_t i = 0; i < GG_COUNT(gg_signals); i++)
        if (gg_signals[i].sig == sig)
            return &gg_signals[i];
    return NULL;
}

/* "SIGUSR2" or "USR2", any case. */
static const struct gg_signal *gg_signal_by_name(const char *name)
{
    for (size_t i = 0; i < GG_COUNT(gg_signals); i++)
        if (strcasecmp(gg_signals[i].name, name) == 0 ||
            strcasecmp(gg_signals[i].name + 3, name) == 0)
            return &gg_signals[i];
    return NULL;
}

const char *gg_signal_name(int sig)
{
    const struct gg_signal *s = gg_signal_by_number(sig);

    if (sig == 0)
        return "none";
    return s ? s->name : NULL;
}

/* ------------------------------------------------------------------------ */
/* Values                                                                    */

/* A decimal number as written: mant / 10^scale. */
struct gg_decimal {
    uint64_t mant;
    unsigned scale;
};

static const uint64_t gg_pow10[] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
    100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
    10000000000000ULL, 100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
    100000000000000000ULL, 1000000000000000000ULL, 10000000000000000000ULL,
};

/* Digits, optionally '.' and more digits. Returns the end, or NULL. */
static const char *gg_parse_decimal(const char *s, struct gg_decimal *d, const char **why)
{
    bool any = false, point = false;

    d->mant = 0;
    d->scale = 0;
    for (;; s++) {
        if (*s == '.' && !point && any) {
            point = true;
            if (!isdigit((unsigned char)s[1])) {
                *why = "malformed size: expected digits after '.'";
                return NULL;
            }
            continue;
        }
        if (!isdigit((unsigned char)*s))
            break;
        if (d->mant > (UINT64_MAX - (uint64_t)(*s - '0')) / 10 ||
            (point && d->scale + 1 >= GG_COUNT(gg_pow10))) {
            *why = "malformed size: too many digits";
            return NULL;
        }
        d->mant = d->mant * 10 + (uint64_t)(*s - '0');
        d->scale += point;
        any = true;
    }
    if (!any) {
        *why = "malformed size: expected a number such as 1.5 GiB, 512MB, 4096 or 10%";
        return NULL;
    }
    return s;
}

struct gg_unit {
    const char *name;
    uint64_t mult;
};

static const struct gg_unit gg_units[] = {
    { "B", 1ULL },
    { "KiB", 1ULL << 10 }, { "MiB", 1ULL << 20 }, { "GiB", 1ULL << 30 }, { "TiB", 1ULL << 40 },
    { "kB", 1000ULL }, { "KB", 1000ULL }, { "MB", 1000000ULL }, { "GB", 1000000000ULL },
    { "TB", 1000000000000ULL },
};

#define GG_UNIT_WHY \
    "malformed size: unknown unit (use B, KiB, MiB, GiB, TiB, kB, KB, MB, GB, TB or %)"

static int gg_unit_mult(const char *unit, uint64_t *mult)
{
    if (!*unit) {
        *mult = 1;
        return 0;
    }
    for (size_t i = 0; i < GG_COUNT(gg_units); i++) {
        if (strcmp(gg_units[i].name, unit) == 0) {
            *mult = gg_units[i].mult;
            return 0;
        }
    }
    return -1;
}

static int gg_size_percent(struct gg_decimal d, struct gg_size *out, const char **why)
{
    if ((gg_u128)d.mant > (gg_u128)100 * gg_pow10[d.scale]) {
        *why = "percentage over 100";
        return -1;
    }
    out->is_percent = true;
    out->bytes = 0;
    out->percent = (double)d.mant / (double)gg_pow10[d.scale];
    return 0;
}

static int gg_size_scaled(struct gg_decimal d, uint64_t mult, struct gg_size *out, const char **why)
{
    gg_u128 prod = (gg_u128)d.mant * mult;
    gg_u128 bytes = prod / gg_pow10[d.scale];

    if (prod % gg_pow10[d.scale] != 0 && mult == 1) {
        *why = "malformed size: a size in bytes must be a whole number";
        return -1;
    }
    if (bytes > UINT64_MAX) {
        *why = "size too large";
        return -1;
    }
    out->is_percent = false;
    out->percent = 0;
    out->bytes = (uint64_t)bytes;
    return 0;
}

int gg_size_parse(const char *text, struct gg_size *out, const char **why)
{
    struct gg_decimal d;
    char unit[16];
    const char *s, *end;
    const char *dummy;
    uint64_t mult;

    if (!why)
        why = &dummy;
    if (!text || !*gg_skip_blank(text)) {
        *why = "malformed size: empty";
        return -1;
    }
    s = gg_skip_blank(text);
    if (*s == '-' && (isdigit((unsigned char)s[1]) || s[1] == '.')) {
        *why = "negative size";
        return -1;
    }
    end = gg_parse_decimal(s, &d, why);
    if (!end)
        return -1;
    end = gg_skip_blank(end);
    if (strlen(end) >= sizeof unit) {
        *why = GG_UNIT_WHY;
        return -1;
    }
    gg_copy_trimmed(unit, sizeof unit, end, strlen(end));
    if (strcmp(unit, "%") == 0)
        return gg_size_percent(d, out, why);
    if (gg_unit_mult(unit, &mult) != 0) {
        *why = GG_UNIT_WHY;
        return -1;
    }
    return gg_size_scaled(d, mult, out, why);
}

uint64_t gg_size_bytes(struct gg_size s, uint64_t total)
{
    long double share;

    if (!s.is_percent)
        return s.bytes;
    share = (long double)total * (long double)s.percent / 100.0L;
    if (share <= 0)
        return 0;
    if (share >= (long double)total)
        return total;
    return (uint64_t)share;
}

enum gg_int_result { GG_INT_OK, GG_INT_MALFORMED, GG_INT_RANGE };

static enum gg_int_result gg_parse_int(const char *v, long min, long max, int *out)
{
    char *end;
    long n;

    v = gg_skip_blank(v);
    if (!isdigit((unsigned char)*v) && !(*v == '-' && isdigit((unsigned char)v[1])))
        return GG_INT_MALFORMED;
    errno = 0;
    n = strtol(v, &end, 10);
    if (*gg_skip_blank(end))
        return GG_INT_MALFORMED;
    if (errno == ERANGE || n < min || n > max)
        return GG_INT_RANGE;
    *out = (int)n;
    return GG_INT_OK;
}

enum gg_signal_result { GG_SIGNAL_OK, GG_SIGNAL_UNKNOWN, GG_SIGNAL_UNSUITABLE };

/* "SIGUSR2", "USR2", "12" or "none" ("0" too). A number must be a named
 * signal fit for advice or a real-time one. */
static enum gg_signal_result gg_parse_signal(const char *v, int *out)
{
    const struct gg_signal *s;
    int sig;

    if (strcasecmp(v, "none") == 0) {
        *out = 0;
        return GG_SIGNAL_OK;
    }
    if (isdigit((unsigned char)*v)) {
        if (gg_parse_int(v, 0, SIGRTMAX, &sig) != GG_INT_OK)
            return GG_SIGNAL_UNKNOWN;
        s = gg_signal_by_number(sig);
        if (sig != 0 && !(s && s->advice) && !(sig >= SIGRTMIN && sig <= SIGRTMAX))
            return s ? GG_SIGNAL_UNSUITABLE : GG_SIGNAL_UNKNOWN;
        *out = sig;
        return GG_SIGNAL_OK;
    }
    s = gg_signal_by_name(v);
    if (!s)
        return GG_SIGNAL_UNKNOWN;
    if (!s->advice)
        return GG_SIGNAL_UNSUITABLE;
    *out = s->sig;
    return GG_SIGNAL_OK;
}

/* Why a signal value was refused. */
static const char *gg_signal_why(enum gg_signal_result r)
{
    if (r == GG_SIGNAL_UNSUITABLE)
        return "not a signal for advice: a trainer that handles it stops or crashes, and "
               "SIGKILL and SIGSTOP cannot be handled (use SIGUSR2, SIGUSR1, a real-time "
               "signal, or none)";
    return "bad value (expected a signal name such as SIGUSR2 or USR2, a signal number, "
           "or none)";
}

/* Are all comma-separated globs of a match non-empty? */
static bool gg_match_well_formed(const char *match)
{
    const char *s = match;

    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char glob[GG_MATCH_MAX];

        gg_copy_trimmed(glob, sizeof glob, s, len);
        if (!*glob)
            return false;
        if (!comma)
            return true;
        s = comma + 1;
    }
}

bool gg_policy_matches(const char *match, const char *name)
{
    const char *s = match;

    if (!match || !name)
        return false;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char glob[GG_MATCH_MAX];

        gg_copy_trimmed(glob, sizeof glob, s, len);
        if (*glob && fnmatch(glob, name, 0) == 0)
            return true;
        if (!comma)
            return false;
        s = comma + 1;
    }
}

/* ------------------------------------------------------------------------ */
/* Defaults                                                                  */

void gg_policy_defaults(struct gg_policy *p)
{
    memset(p, 0, sizeof *p);
    p->headroom.bytes = 0;
    p->near_miss.is_percent = true;
    p->near_miss.percent = 5.0;
    p->mode = GG_MODE_AUTO;
    p->enforce = GG_ENFORCE_RUNTIME;
    p->virtualize_meminfo = true;
    p->signal = SIGUSR2;
    p->batch_size = 0;
    p->grad_accum = 0;
    p->min_batch_size = 1;
    gg_copy(p->journal_dir, sizeof p->journal_dir, ".");
    p->stacks = GG_STACKS_NEAR_MISS;
    p->depth = 32;
}

/* ------------------------------------------------------------------------ */
/* The schema                                                                */

enum gg_section {
    GG_SEC_NONE,     /* before the first header */
    GG_SEC_GPU,
    GG_SEC_MEMORY,
    GG_SEC_TRAINER,
    GG_SEC_JOURNAL,
    GG_SEC_IGNORED,  /* an unknown or malformed header: already reported */
};

static const char *const gg_section_names[] = {
    [GG_SEC_GPU] = "gpu", [GG_SEC_MEMORY] = "memory",
    [GG_SEC_TRAINER] = "trainer", [GG_SEC_JOURNAL] = "journal",
};

enum gg_key_id {
    GG_K_MATCH,
    GG_K_HEADROOM, GG_K_NEAR_MISS, GG_K_MODE, GG_K_ENFORCE, GG_K_VIRTUALIZE,
    GG_K_SIGNAL, GG_K_BATCH, GG_K_ACCUM, GG_K_MIN_BATCH,
    GG_K_DIR, GG_K_STACKS, GG_K_DEPTH,
    GG_K_COUNT
};

enum gg_line_kind { GG_LINE_OTHER, GG_LINE_KEY };

/* One file being parsed. */
struct gg_load {
    struct gg_policy *p;
    const char *path;
    struct gg_sink sink;
    FILE *f;
    char *buf;                 /* getline's buffer */
    size_t cap;
    int line;                  /* the physical line inih is working on */
    const char *text;          /* that line, trimmed */
    enum gg_line_kind kind;
    bool handled;              /* inih called the handler for it */
    enum gg_section section;
    char section_name[64];
    int key_line[GG_K_COUNT];  /* where each key was set, 0 = not */
    const struct gg_key *key;  /* the key being set */
};

struct gg_key {
    enum gg_section section;
    const char *name;
    enum gg_key_id id;
    void (*set)(struct gg_load *ld, const char *value);
};

/* "[memory] headroom = '1 gib': <why>" at the current line. */
__attribute__((format(printf, 3, 4)))
static void gg_bad_value(struct gg_load *ld, const char *value, const char *fmt, ...)
{
    char why[GG_MSG_MAX / 2];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    gg_problem(&ld->sink, ld->path, ld->line, "[%s] %s = '" GG_SHOW "': %s",
               gg_section_names[ld->key->section], ld->key->name, value, why);
}

/* One of the names of t; reported when it is none of them. 0 on success. */
static int gg_set_enum(struct gg_load *ld, const char *value, const struct gg_name *t,
                       size_t n, int *out)
{
    char expected[160] = "";
    size_t len = 0;

    if (gg_lookup(t, n, value, out) == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int w = snprintf(expected + len, sizeof expected - len, "%s%s", sep, t[i].name);
        if (w < 0 || (size_t)w >= sizeof expected - len)
            break;
        len += (size_t)w;
    }
    gg_bad_value(ld, value, "bad value (expected %s)", expected);
    return -1;
}

static void gg_set_int(struct gg_load *ld, const char *value, long min, long max, int *out)
{
    switch (gg_parse_int(value, min, max, out)) {
    case GG_INT_OK:
        return;
    case GG_INT_MALFORMED:
        gg_bad_value(ld, value, "not an integer (expected %ld..%ld)", min, max);
        return;
    case GG_INT_RANGE:
        gg_bad_value(ld, value, "out of range (%ld..%ld)", min, max);
        return;
    }
}

static void gg_set_size(struct gg_load *ld, const char *value, struct gg_size *out)
{
    const char *why = "";
    struct gg_size s;

    if (gg_size_parse(value, &s, &why) == 0)
        *out = s;
    else
        gg_bad_value(ld, value, "%s", why);
}

static void gg_set_match(struct gg_load *ld, const char *value)
{
    if (strlen(value) >= sizeof ld->p->match)
        gg_bad_value(ld, value, "too long (at most %zu characters)", sizeof ld->p->match - 1);
    else if (!gg_match_well_formed(value))
        gg_bad_value(ld, value, "empty glob (expected comma-separated globs on the CUDA "
                                "device name, such as NVIDIA GeForce RTX 3090*)");
    else
        gg_copy(ld->p->match, sizeof ld->p->match, value);
}

static void gg_set_headroom(struct gg_load *ld, const char *value)
{
    gg_set_size(ld, value, &ld->p->headroom);
}

static void gg_set_near_miss(struct gg_load *ld, const char *value)
{
    gg_set_size(ld, value, &ld->p->near_miss);
}

static void gg_set_mode(struct gg_load *ld, const char *value)
{
    int v;

    if (gg_set_enum(ld, value, gg_modes, GG_COUNT(gg_modes), &v) == 0)
        ld->p->mode = (enum gg_mode)v;
}

static void gg_set_enforce(struct gg_load *ld, const char *value)
{
    int v;

    if (gg_set_enum(ld, value, gg_enforces, GG_COUNT(gg_enforces), &v) == 0)
        ld->p->enforce = (enum gg_enforce)v;
}

static void gg_set_virtualize(struct gg_load *ld, const char *value)
{
    int v;

    if (gg_set_enum(ld, value, gg_bools, GG_COUNT(gg_bools), &v) == 0)
        ld->p->virtualize_meminfo = v != 0;
}

static void gg_set_signal(struct gg_load *ld, const char *value)
{
    enum gg_signal_result r;
    int sig;

    r = gg_parse_signal(value, &sig);
    if (r == GG_SIGNAL_OK)
        ld->p->signal = sig;
    else
        gg_bad_value(ld, value, "%s", gg_signal_why(r));
}

static void gg_set_batch(struct gg_load *ld, const char *value)
{
    gg_set_int(ld, value, 1, GG_INT_MAX_COUNT, &ld->p->batch_size);
}

static void gg_set_accum(struct gg_load *ld, const char *value)
{
    gg_set_int(ld, value, 1, GG_INT_MAX_COUNT, &ld->p->grad_accum);
}

static void gg_set_min_batch(struct gg_load *ld, const char *value)
{
    gg_set_int(ld, value, 1, GG_INT_MAX_COUNT, &ld->p->min_batch_size);
}

static void gg_set_dir(struct gg_load *ld, const char *value)
{
    if (!*value)
        gg_bad_value(ld, value, "empty (expected a directory)");
    else if (strlen(value) >= sizeof ld->p->journal_dir)
        gg_bad_value(ld, value, "too long (at most %zu characters)",
                     sizeof ld->p->journal_dir - 1);
    else
        gg_copy(ld->p->journal_dir, sizeof ld->p->journal_dir, value);
}

static void gg_set_stacks(struct gg_load *ld, const char *value)
{
    int v;

    if (gg_set_enum(ld, value, gg_stackses, GG_COUNT(gg_stackses), &v) == 0)
        ld->p->stacks = (enum gg_stacks)v;
}

static void gg_set_depth(struct gg_load *ld, const char *value)
{
    gg_set_int(ld, value, 1, GG_DEPTH_MAX, &ld->p->depth);
}

static const struct gg_key gg_keys[] = {
    { GG_SEC_GPU, "match", GG_K_MATCH, gg_set_match },
    { GG_SEC_MEMORY, "headroom", GG_K_HEADROOM, gg_set_headroom },
    { GG_SEC_MEMORY, "near_miss", GG_K_NEAR_MISS, gg_set_near_miss },
    { GG_SEC_MEMORY, "mode", GG_K_MODE, gg_set_mode },
    { GG_SEC_MEMORY, "enforce", GG_K_ENFORCE, gg_set_enforce },
    { GG_SEC_MEMORY, "virtualize_meminfo", GG_K_VIRTUALIZE, gg_set_virtualize },
    { GG_SEC_TRAINER, "signal", GG_K_SIGNAL, gg_set_signal },
    { GG_SEC_TRAINER, "batch_size", GG_K_BATCH, gg_set_batch },
    { GG_SEC_TRAINER, "grad_accum", GG_K_ACCUM, gg_set_accum },
    { GG_SEC_TRAINER, "min_batch_size", GG_K_MIN_BATCH, gg_set_min_batch },
    { GG_SEC_JOURNAL, "dir", GG_K_DIR, gg_set_dir },
    { GG_SEC_JOURNAL, "stacks", GG_K_STACKS, gg_set_stacks },
    { GG_SEC_JOURNAL, "depth", GG_K_DEPTH, gg_set_depth },
};

static const struct gg_key *gg_find_key(enum gg_section sec, const char *name)
{
    for (size_t i = 0; i < GG_COUNT(gg_keys); i++)
        if (gg_keys[i].section == sec && strcasecmp(gg_keys[i].name, name) == 0)
            return &gg_keys[i];
    return NULL;
}

/* "headroom, near_miss, ..." for a section. */
static void gg_keys_of(enum gg_section sec, char *out, size_t cap)
{
    size_t len = 0;

    out[0] = '\0';
    for (size_t i = 0; i < GG_COUNT(gg_keys); i++) {
        int w;

        if (gg_keys[i].section != sec)
            continue;
        w = snprintf(out + len, cap - len, "%s%s", len ? ", " : "", gg_keys[i].name);
        if (w < 0 || (size_t)w >= cap - len)
            return;
        len += (size_t)w;
    }
}

static enum gg_section gg_find_section(const char *name)
{
    for (int s = GG_SEC_GPU; s <= GG_SEC_JOURNAL; s++)
        if (strcasecmp(gg_section_names[s], name) == 0)
            return (enum gg_section)s;
    return GG_SEC_IGNORED;
}

/* ------------------------------------------------------------------------ */
/* Lines                                                                     */

/* A "[section]" line: checked here, since inih says nothing about a header
 * it cannot parse or a section without keys. */
static void gg_enter_section(struct gg_load *ld, const char *text)
{
    const char *end = gg_find_sep(text + 1, "]");
    const char *rest;

    if (*end != ']') {
        gg_problem(&ld->sink, ld->path, ld->line,
                   "malformed section header '" GG_SHOW "' (expected [name])", text);
        ld->section = GG_SEC_IGNORED;
        return;
    }
    gg_copy_trimmed(ld->section_name, sizeof ld->section_name, text + 1,
                    (size_t)(end - text - 1));
    ld->section = gg_find_section(ld->section_name);
    if (ld->section == GG_SEC_IGNORED)
        gg_problem(&ld->sink, ld->path, ld->line,
                   "unknown section [%s] (expected [gpu], [memory], [trainer] or [journal])",
                   ld->section_name);
    rest = gg_skip_blank(end + 1);
    if (*rest && *rest != ';' && *rest != '#')
        gg_problem(&ld->sink, ld->path, ld->line,
                   "unexpected text after [%s]: '" GG_SHOW "'", ld->section_name, rest);
}

/* A key line for which inih never called the handler could not be parsed. */
static void gg_line_done(struct gg_load *ld)
{
    if (ld->kind == GG_LINE_KEY && !ld->handled)
        gg_problem(&ld->sink, ld->path, ld->line,
                   "cannot parse '" GG_SHOW "' (expected key = value, [section] or a ; comment)",
                   ld->text);
    ld->kind = GG_LINE_OTHER;
}

/* The line as inih should see it: no BOM, no surrounding white space, no
 * over-long line, no NUL byte. Returns NULL for a line to hide (reported). */
static char *gg_clean_line(struct gg_load *ld, char *buf, size_t n, size_t room)
{
    char *s = buf;
    size_t len;

    if (strlen(buf) != n) {
        gg_problem(&ld->sink, ld->path, ld->line, "line contains a NUL byte");
        return NULL;
    }
    if (ld->line == 1 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB &&
        (unsigned char)s[2] == 0xBF)
        s += 3;
    s = (char *)gg_skip_blank(s);
    len = strlen(s);
    while (len && gg_is_blank((unsigned char)s[len - 1]))
        s[--len] = '\0';
    if (len >= room) {
        gg_problem(&ld->sink, ld->path, ld->line, "line too long (%zu characters, at most %zu)",
                   len, room - 1);
        return NULL;
    }
    return s;
}

static void gg_classify(struct gg_load *ld, const char *text)
{
    ld->text = text;
    ld->handled = false;
    if (!*text || *text == ';' || *text == '#')
        ld->kind = GG_LINE_OTHER;
    else if (*text == '[') {
        ld->kind = GG_LINE_OTHER;
        gg_enter_section(ld, text);
    } else
        ld->kind = GG_LINE_KEY;
}

/* inih's reader: one physical line per call, counted. */
static char *gg_reader(char *str, int num, void *stream)
{
    struct gg_load *ld = stream;
    ssize_t n;
    char *text;

    gg_line_done(ld);
    if (num < 2)
        return NULL;
    n = getline(&ld->buf, &ld->cap, ld->f);
    if (n < 0)
        return NULL;
    ld->line++;
    text = gg_clean_line(ld, ld->buf, (size_t)n, (size_t)num);
    if (!text) {
        ld->text = "";
        ld->kind = GG_LINE_OTHER;
        str[0] = '\0';
        return str;
    }
    gg_classify(ld, text);
    memcpy(str, text, strlen(text) + 1);
    return str;
}

static void gg_apply_key(struct gg_load *ld, const char *name, const char *value)
{
    const struct gg_key *k;
    char known[256];

    if (!*name) {
        gg_problem(&ld->sink, ld->path, ld->line, "missing key name before '='");
        return;
    }
    k = gg_find_key(ld->section, name);
    if (!k) {
        gg_keys_of(ld->section, known, sizeof known);
        gg_problem(&ld->sink, ld->path, ld->line, "unknown key '" GG_SHOW "' in [%s] (known: %s)",
                   name, gg_section_names[ld->section], known);
        return;
    }
    if (ld->key_line[k->id]) {
        gg_problem(&ld->sink, ld->path, ld->line, "[%s] %s is given twice (first on line %d)",
                   gg_section_names[k->section], k->name, ld->key_line[k->id]);
        return;
    }
    ld->key_line[k->id] = ld->line;
    ld->key = k;
    k->set(ld, value);
}

static int gg_handler(void *user, const char *section, const char *name, const char *value)
{
    struct gg_load *ld = user;

    (void)section; /* ours, from gg_enter_section, is the one that counts */
    ld->handled = true;
    if (ld->section == GG_SEC_NONE)
        gg_problem(&ld->sink, ld->path, ld->line,
                   "key '" GG_SHOW "' is outside a section (expected it under [gpu], [memory], "
                   "[trainer] or [journal])", name);
    else if (ld->section != GG_SEC_IGNORED)
        gg_apply_key(ld, name, value);
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Files                                                                     */

static FILE *gg_open_policy(struct gg_load *ld)
{
    char err[128];
    struct stat st;
    FILE *f = fopen(ld->path, "re");

    if (!f) {
        gg_problem(&ld->sink, ld->path, 0, "cannot open policy file: %s",
                   gg_errstr(errno, err, sizeof err));
        return NULL;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        gg_problem(&ld->sink, ld->path, 0, "is a directory, not a policy file");
        fclose(f);
        return NULL;
    }
    return f;
}

/* What no single key can say: relations between keys. */
static void gg_check_whole(struct gg_load *ld)
{
    const struct gg_policy *p = ld->p;

    if (p->batch_size && p->min_batch_size > p->batch_size)
        gg_problem(&ld->sink, ld->path,
                   ld->key_line[GG_K_MIN_BATCH] ? ld->key_line[GG_K_MIN_BATCH]
                                                : ld->key_line[GG_K_BATCH],
                   "[trainer] min_batch_size = %d is larger than batch_size = %d",
                   p->min_batch_size, p->batch_size);
}

static void gg_parse_open(struct gg_load *ld)
{
    char err[128];
    int rc = ini_parse_stream(gg_reader, ld, gg_handler, ld);

    gg_line_done(ld);
    if (ferror(ld->f))
        gg_problem(&ld->sink, ld->path, ld->line ? ld->line + 1 : 0, "read error: %s",
                   gg_errstr(errno, err, sizeof err));
    else if (rc == -2)
        gg_problem(&ld->sink, ld->path, 0, "out of memory while parsing");
    else if (rc > 0 && ld->sink.problems == 0)
        gg_problem(&ld->sink, ld->path, rc, "cannot parse line");
}

static int gg_load_into(const char *path, struct gg_policy *p, struct gg_sink *sink)
{
    struct gg_load ld;

    memset(&ld, 0, sizeof ld);
    ld.p = p;
    ld.path = path;
    ld.sink = *sink;
    ld.sink.problems = 0;
    gg_policy_defaults(p);
    if (!path || !*path) {
        gg_problem(&ld.sink, "", 0, "no policy file given");
        p->broken = true;
        return ld.sink.problems;
    }
    gg_copy(p->file, sizeof p->file, path);
    if (strlen(path) >= sizeof p->file)
        gg_problem(&ld.sink, path, 0, "path too long (at most %zu characters)",
                   sizeof p->file - 1);
    ld.f = gg_open_policy(&ld);
    if (ld.f) {
        gg_parse_open(&ld);
        gg_check_whole(&ld);
        fclose(ld.f);
    }
    free(ld.buf);
    p->headroom_line = ld.key_line[GG_K_HEADROOM];
    p->broken = ld.sink.problems > 0;
    return ld.sink.problems;
}

int gg_policy_load(const char *path, struct gg_policy *p, gg_policy_report report, void *ctx)
{
    struct gg_sink sink = { report, ctx, 0 };

    return gg_load_into(path, p, &sink);
}

int gg_policy_check_member(const char *path, const struct gg_policy *p,
                           gg_policy_report report, void *ctx)
{
    struct gg_sink sink = { report, ctx, 0 };

    if (!path || strcmp(gg_basename(path), "default.ini") == 0 || p->match[0])
        return 0;
    gg_problem(&sink, path, 0,
               "no [gpu] match: a policy file in a directory must name the GPUs it is for "
               "(only default.ini may leave it out)");
    return sink.problems;
}

/* ------------------------------------------------------------------------ */
/* Directories                                                               */

static int gg_is_policy_name(const struct dirent *d)
{
    size_t len = strlen(d->d_name);

    return d->d_name[0] != '.' && len > 4 && strcmp(d->d_name + len - 4, ".ini") == 0;
}

static int gg_name_order(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int gg_join(char *out, size_t cap, const char *dir, const char *name)
{
    size_t len = strlen(dir);
    const char *sep = len && dir[len - 1] == '/' ? "" : "/";
    int w = snprintf(out, cap, "%s%s%s", dir, sep, name);

    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

static bool gg_is_dir(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int gg_policy_dir_each(const char *dir, gg_policy_each_fn fn, void *arg)
{
    struct dirent **names;
    char path[GG_PATH_MAX];
    int n = scandir(dir, &names, gg_is_policy_name, gg_name_order);
    int rc = 0, err = 0;

    if (n < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        if (rc == 0 && err == 0) {
            if (gg_join(path, sizeof path, dir, names[i]->d_name) != 0)
                err = ENAMETOOLONG;
            else if (!gg_is_dir(path))
                rc = fn(arg, path, names[i]->d_name);
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

/* ------------------------------------------------------------------------ */
/* Selection                                                                 */

/* A scan of a directory for the first file that matches a device. */
struct gg_scan {
    const char *device;
    struct gg_sink *sink;
    char chosen[GG_PATH_MAX];
};

/* While scanning, only file-level problems (line 0: cannot open, ...) are
 * passed on: they leave the file's match unknown. The chosen file is loaded
 * again with every problem reported; the others are gpuguard-check's. */
static void gg_pass_file_level(void *ctx, const char *file, int line, const char *msg)
{
    struct gg_sink *sink = ctx;

    if (line == 0)
        gg_problem(sink, file, 0, "%s", msg);
}

static int gg_scan_file(void *arg, const char *path, const char *name)
{
    struct gg_scan *scan = arg;
    struct gg_policy q;
    int before = scan->sink->problems;

    if (strcmp(name, "default.ini") == 0)
        return 0;
    gg_policy_load(path, &q, gg_pass_file_level, scan->sink);
    if (scan->sink->problems != before)
        return 0;
    if (gg_policy_check_member(path, &q, scan->sink->report, scan->sink->ctx))
        scan->sink->problems++;
    if (!gg_policy_matches(q.match, scan->device))
        return 0;
    gg_copy(scan->chosen, sizeof scan->chosen, path);
    return 1;
}

/* default.ini of a directory, or the built-in defaults when there is none. */
static void gg_load_default(const char *dir, struct gg_policy *p, struct gg_sink *sink)
{
    char path[GG_PATH_MAX];
    struct stat st;

    if (gg_join(path, sizeof path, dir, "default.ini") != 0 ||
        (lstat(path, &st) != 0 && errno == ENOENT)) {
        gg_policy_defaults(p);
        return;
    }
    sink->problems += gg_policy_load(path, p, sink->report, sink->ctx);
}

static void gg_select_in_dir(const char *dir, const char *device, struct gg_policy *p,
                             struct gg_sink *sink)
{
    struct gg_scan scan;
    char err[128];
    int scan_problems;

    memset(&scan, 0, sizeof scan);
    scan.device = device;
    scan.sink = sink;
    if (gg_policy_dir_each(dir, gg_scan_file, &scan) < 0) {
        gg_problem(sink, dir, 0, "cannot read policy directory: %s",
                   gg_errstr(errno, err, sizeof err));
        gg_policy_defaults(p);
        p->broken = true;
        return;
    }
    scan_problems = sink->problems;
    if (scan.chosen[0])
        sink->problems += gg_policy_load(scan.chosen, p, sink->report, sink->ctx);
    else
        gg_load_default(dir, p, sink);
    if (scan_problems)
        p->broken = true;
}

/* What a device is told about a directory: that it cannot be read; each file
 * tried before the winner that cannot be opened or has no [gpu] match (it
 * might have been meant for this device); and every problem of the file it
 * gets. Problems of files it never needed are left to gpuguard-check --lint. */
int gg_policy_select(const char *where, const char *device_name, struct gg_policy *p,
                     gg_policy_report report, void *ctx)
{
    struct gg_sink sink = { report, ctx, 0 };
    char err[128];
    struct stat st;

    if (!where || !*where) {
        gg_policy_defaults(p);
        return 0;
    }
    if (stat(where, &st) != 0) {
        gg_problem(&sink, where, 0, "cannot open policy file or directory: %s",
                   gg_errstr(errno, err, sizeof err));
        gg_policy_defaults(p);
        p->broken = true;
        return sink.problems;
    }
    if (!S_ISDIR(st.st_mode))
        return gg_policy_load(where, p, report, ctx);
    gg_select_in_dir(where, device_name, p, &sink);
    return sink.problems;
}

/* ------------------------------------------------------------------------ */
/* Environment                                                               */

static bool gg_env_set(const char *v)
{
    return v && *v;
}

static void gg_env_mode(struct gg_policy *p, const char *v, struct gg_sink *sink)
{
    char word[32];
    int mode;

    gg_copy_trimmed(word, sizeof word, v, strlen(v));
    if (gg_lookup(gg_modes, GG_COUNT(gg_modes), word, &mode) == 0)
        p->mode = (enum gg_mode)mode;
    else
        gg_problem(sink, "GPUGUARD_MODE", 0,
                   "bad value '" GG_SHOW "' (expected auto, enforce, observe or off)", v);
}

static void gg_env_headroom(struct gg_policy *p, const char *v, struct gg_sink *sink)
{
    const char *why = "";
    struct gg_size s;

    if (gg_size_parse(v, &s, &why) != 0) {
        gg_problem(sink, "GPUGUARD_HEADROOM", 0, "'" GG_SHOW "': %s", v, why);
        return;
    }
    p->headroom = s;
    p->headroom_from_env = true;
    p->headroom_line = 0;
}

static void gg_env_journal_dir(struct gg_policy *p, const char *v, struct gg_sink *sink)
{
    if (strlen(v) >= sizeof p->journal_dir)
        gg_problem(sink, "GPUGUARD_JOURNAL_DIR", 0, "too long (at most %zu characters)",
                   sizeof p->journal_dir - 1);
    else
        gg_copy(p->journal_dir, sizeof p->journal_dir, v);
}

static void gg_env_signal(struct gg_policy *p, const char *v, struct gg_sink *sink)
{
    enum gg_signal_result r;
    char word[32];
    int sig;

    gg_copy_trimmed(word, sizeof word, v, strlen(v));
    r = gg_parse_signal(word, &sig);
    if (r == GG_SIGNAL_OK)
        p->signal = sig;
    else
        gg_problem(sink, "GPUGUARD_SIGNAL", 0, "'" GG_SHOW "': %s", v, gg_signal_why(r));
}

int gg_policy_apply_env(struct gg_policy *p, const struct gg_policy_env *env,
                        gg_policy_report report, void *ctx)
{
    struct gg_sink sink = { report, ctx, 0 };

    if (!env)
        return 0;
    if (gg_env_set(env->mode))
        gg_env_mode(p, env->mode, &sink);
    if (gg_env_set(env->headroom))
        gg_env_headroom(p, env->headroom, &sink);
    if (gg_env_set(env->journal_dir))
        gg_env_journal_dir(p, env->journal_dir, &sink);
    if (gg_env_set(env->signal))
        gg_env_signal(p, env->signal, &sink);
    if (sink.problems)
        p->broken = true;
    return sink.problems;
}

/* ------------------------------------------------------------------------ */
/* Limits                                                                    */

static double gg_gib(uint64_t bytes)
{
    return (double)bytes / (double)(1ULL << 30);
}

uint64_t gg_policy_limit(const struct gg_policy *p, uint64_t total,
                         gg_policy_report report, void *ctx)
{
    struct gg_sink sink = { report, ctx, 0 };
    uint64_t headroom = gg_size_bytes(p->headroom, total);

    if (headroom <= total)
        return total - headroom;
    gg_problem(&sink, p->headroom_from_env ? "GPUGUARD_HEADROOM" : p->file,
               p->headroom_from_env ? 0 : p->headroom_line,
               "headroom %.2f GiB (%" PRIu64 " bytes) is larger than the device "
               "(%.2f GiB, %" PRIu64 " bytes); the limit is the whole device",
               gg_gib(headroom), headroom, gg_gib(total), total);
    return total;
}

uint64_t gg_policy_near_miss(const struct gg_policy *p, uint64_t total)
{
    uint64_t margin = gg_size_bytes(p->near_miss, total);

    return margin < total ? margin : total;
}
