/* values.c - layer 2: parsing setting values (see values.h). */
#include "values.h"

#include <ctype.h>
#include <errno.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "prim.h"

__extension__ typedef unsigned __int128 u128;

static bool is_blank(int c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

static const char *skip_blank(const char *s)
{
    while (*s && is_blank((unsigned char)*s))
        s++;
    return s;
}

void gg_copy_trimmed(char *out, size_t cap, const char *s, size_t len)
{
    while (len && is_blank((unsigned char)*s)) {
        s++;
        len--;
    }
    while (len && is_blank((unsigned char)s[len - 1]))
        len--;
    if (len >= cap)
        len = cap - 1;
    memcpy(out, s, len);
    out[len] = '\0';
}

/* ---- sizes ---------------------------------------------------------------- */

/* A decimal number as written: mant / 10^scale. */
struct decimal {
    uint64_t mant;
    unsigned scale;
};

static const uint64_t pow10_[] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
    100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
    10000000000000ULL, 100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
    100000000000000000ULL, 1000000000000000000ULL, 10000000000000000000ULL,
};

/* Digits, optionally '.' and more digits. Returns the end, or NULL. */
static const char *parse_decimal(const char *s, struct decimal *d, const char **why)
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
            (point && d->scale + 1 >= GG_COUNT(pow10_))) {
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

static const struct {
    const char *name;
    uint64_t mult;
} units[] = {
    {"B", 1ULL},
    {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20}, {"GiB", 1ULL << 30}, {"TiB", 1ULL << 40},
    {"kB", 1000ULL}, {"KB", 1000ULL}, {"MB", 1000000ULL}, {"GB", 1000000000ULL},
    {"TB", 1000000000000ULL},
};

#define UNIT_WHY "malformed size: unknown unit (use B, KiB, MiB, GiB, TiB, kB, KB, MB, GB, TB or %)"

static int unit_mult(const char *unit, uint64_t *mult)
{
    if (!*unit) {
        *mult = 1;
        return 0;
    }
    for (size_t i = 0; i < GG_COUNT(units); i++) {
        if (strcmp(units[i].name, unit) == 0) {
            *mult = units[i].mult;
            return 0;
        }
    }
    return -1;
}

static int size_percent(struct decimal d, struct gg_size *out, const char **why)
{
    if ((u128)d.mant > (u128)100 * pow10_[d.scale]) {
        *why = "percentage over 100";
        return -1;
    }
    out->is_percent = true;
    out->bytes = 0;
    out->percent = (double)d.mant / (double)pow10_[d.scale];
    return 0;
}

static int size_scaled(struct decimal d, uint64_t mult, struct gg_size *out, const char **why)
{
    u128 prod = (u128)d.mant * mult;
    u128 bytes = prod / pow10_[d.scale];
    if (prod % pow10_[d.scale] != 0 && mult == 1) {
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

int gg_value_size(const char *text, struct gg_size *out, const char **why)
{
    struct decimal d;
    char unit[16];
    const char *s, *end, *dummy;
    uint64_t mult;
    if (!why)
        why = &dummy;
    if (!text || !*skip_blank(text)) {
        *why = "malformed size: empty";
        return -1;
    }
    s = skip_blank(text);
    if (*s == '-' && (isdigit((unsigned char)s[1]) || s[1] == '.')) {
        *why = "negative size";
        return -1;
    }
    end = parse_decimal(s, &d, why);
    if (!end)
        return -1;
    end = skip_blank(end);
    if (strlen(end) >= sizeof unit) {
        *why = UNIT_WHY;
        return -1;
    }
    gg_copy_trimmed(unit, sizeof unit, end, strlen(end));
    if (strcmp(unit, "%") == 0)
        return size_percent(d, out, why);
    if (unit_mult(unit, &mult) != 0) {
        *why = UNIT_WHY;
        return -1;
    }
    return size_scaled(d, mult, out, why);
}

uint64_t gg_size_bytes(struct gg_size s, uint64_t total)
{
    if (!s.is_percent)
        return s.bytes;
    long double share = (long double)total * (long double)s.percent / 100.0L;
    if (share <= 0)
        return 0;
    if (share >= (long double)total)
        return total;
    return (uint64_t)share;
}

/* ---- integers, booleans, words ---------------------------------------------- */

int gg_value_int(const char *text, long min, long max, int *out, char *why, size_t why_cap)
{
    const char *v = skip_blank(text);
    char *end;
    if (!isdigit((unsigned char)*v) && !(*v == '-' && isdigit((unsigned char)v[1]))) {
        snprintf(why, why_cap, "not an integer (expected %ld..%ld)", min, max);
        return -1;
    }
    errno = 0;
    long n = strtol(v, &end, 10);
    if (*skip_blank(end)) {
        snprintf(why, why_cap, "not an integer (expected %ld..%ld)", min, max);
        return -1;
    }
    if (errno == ERANGE || n < min || n > max) {
        snprintf(why, why_cap, "out of range (%ld..%ld)", min, max);
        return -1;
    }
    *out = (int)n;
    return 0;
}

static const struct gg_word bool_words[] = {
    {"yes", 1}, {"no", 0}, {"true", 1}, {"false", 0}, {"1", 1}, {"0", 0}, {"on", 1}, {"off", 0},
};
static const struct gg_vocab vocab_bool = {bool_words, GG_COUNT(bool_words)};

int gg_value_bool(const char *text, bool *out, const char **why)
{
    char msg[160];
    int v;
    if (gg_value_word(text, &vocab_bool, &v, msg, sizeof msg) != 0) {
        *why = "bad value (expected yes, no, true, false, 1, 0, on or off)";
        return -1;
    }
    *out = v != 0;
    return 0;
}

int gg_value_word(const char *text, const struct gg_vocab *v, int *out, char *why, size_t cap)
{
    char word[64];
    gg_copy_trimmed(word, sizeof word, text, strlen(text));
    for (size_t i = 0; i < v->n; i++) {
        if (strcasecmp(v->words[i].name, word) == 0) {
            *out = v->words[i].value;
            return 0;
        }
    }
    size_t len = (size_t)snprintf(why, cap, "bad value (expected ");
    for (size_t i = 0; i < v->n && len < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == v->n ? " or " : ", ";
        len += (size_t)snprintf(why + len, cap - len, "%s%s", sep, v->words[i].name);
    }
    if (len < cap)
        snprintf(why + len, cap - len, ")");
    return -1;
}

const char *gg_value_word_name(const struct gg_vocab *v, int value)
{
    for (size_t i = 0; i < v->n; i++)
        if (v->words[i].value == value)
            return v->words[i].name;
    return "?";
}

static const struct gg_word mode_words[] = {
    {"auto", GG_MODE_AUTO}, {"enforce", GG_MODE_ENFORCE}, {"observe", GG_MODE_OBSERVE},
    {"off", GG_MODE_OFF},
};
static const struct gg_word enforce_words[] = {
    {"runtime", GG_ENFORCE_RUNTIME}, {"all", GG_ENFORCE_ALL},
};
static const struct gg_word stacks_words[] = {
    {"all", GG_STACKS_ALL}, {"near_miss", GG_STACKS_NEAR_MISS}, {"off", GG_STACKS_OFF},
};
const struct gg_vocab gg_vocab_mode = {mode_words, GG_COUNT(mode_words)};
const struct gg_vocab gg_vocab_enforce = {enforce_words, GG_COUNT(enforce_words)};
const struct gg_vocab gg_vocab_stacks = {stacks_words, GG_COUNT(stacks_words)};

const char *gg_mode_name(enum gg_mode m)
{
    return gg_value_word_name(&gg_vocab_mode, (int)m);
}

#ifdef GG_TESTING
const char *gg_enforce_name(enum gg_enforce e)
{
    return gg_value_word_name(&gg_vocab_enforce, (int)e);
}

const char *gg_stacks_name(enum gg_stacks s)
{
    return gg_value_word_name(&gg_vocab_stacks, (int)s);
}
#endif

/* ---- signals ------------------------------------------------------------------ */

/* Signals by name. Only `advice` ones may carry advice: a trainer that handles
 * one of the others (Python's KeyboardInterrupt for SIGINT, faulthandler for
 * SIGSEGV and SIGABRT, a framework's checkpoint-and-exit for SIGTERM) stops or
 * crashes on it, and SIGKILL and SIGSTOP cannot be handled at all. */
static const struct {
    const char *name;
    int sig;
    bool advice;
} signals_[] = {
    {"SIGHUP", SIGHUP, true},       {"SIGINT", SIGINT, false},
    {"SIGQUIT", SIGQUIT, false},    {"SIGILL", SIGILL, false},
    {"SIGTRAP", SIGTRAP, false},    {"SIGABRT", SIGABRT, false},
    {"SIGBUS", SIGBUS, false},      {"SIGFPE", SIGFPE, false},
    {"SIGKILL", SIGKILL, false},    {"SIGUSR1", SIGUSR1, true},
    {"SIGSEGV", SIGSEGV, false},    {"SIGUSR2", SIGUSR2, true},
    {"SIGPIPE", SIGPIPE, false},    {"SIGALRM", SIGALRM, true},
    {"SIGTERM", SIGTERM, false},    {"SIGCHLD", SIGCHLD, true},
    {"SIGCONT", SIGCONT, true},     {"SIGSTOP", SIGSTOP, false},
    {"SIGTSTP", SIGTSTP, false},    {"SIGTTIN", SIGTTIN, false},
    {"SIGTTOU", SIGTTOU, false},    {"SIGURG", SIGURG, true},
    {"SIGXCPU", SIGXCPU, false},    {"SIGXFSZ", SIGXFSZ, false},
    {"SIGVTALRM", SIGVTALRM, true}, {"SIGPROF", SIGPROF, true},
    {"SIGWINCH", SIGWINCH, true},   {"SIGIO", SIGIO, true},
    {"SIGPWR", SIGPWR, true},       {"SIGSYS", SIGSYS, false},
};

static int signal_index_by_number(int sig)
{
    for (size_t i = 0; i < GG_COUNT(signals_); i++)
        if (signals_[i].sig == sig)
            return (int)i;
    return -1;
}

/* "SIGUSR2" or "USR2", any case. */
static int signal_index_by_name(const char *name)
{
    for (size_t i = 0; i < GG_COUNT(signals_); i++)
        if (strcasecmp(signals_[i].name, name) == 0 ||
            strcasecmp(signals_[i].name + 3, name) == 0)
            return (int)i;
    return -1;
}

const char *gg_signal_name(int sig)
{
    if (sig == 0)
        return "none";
    int i = signal_index_by_number(sig);
    return i >= 0 ? signals_[i].name : NULL;
}

#define SIGNAL_UNSUITABLE                                                                   \
    "not a signal for advice: a trainer that handles it stops or crashes, and SIGKILL and " \
    "SIGSTOP cannot be handled (use SIGUSR2, SIGUSR1, a real-time signal, or none)"
#define SIGNAL_UNKNOWN \
    "bad value (expected a signal name such as SIGUSR2 or USR2, a signal number, or none)"

int gg_value_signal(const char *text, int *out, const char **why)
{
    char v[32];
    gg_copy_trimmed(v, sizeof v, text, strlen(text));
    if (strcasecmp(v, "none") == 0) {
        *out = 0;
        return 0;
    }
    if (isdigit((unsigned char)*v)) {
        char msg[96];
        int sig;
        if (gg_value_int(v, 0, SIGRTMAX, &sig, msg, sizeof msg) != 0) {
            *why = SIGNAL_UNKNOWN;
            return -1;
        }
        int i = signal_index_by_number(sig);
        if (sig != 0 && !(i >= 0 && signals_[i].advice) && !(sig >= SIGRTMIN && sig <= SIGRTMAX)) {
            *why = i >= 0 ? SIGNAL_UNSUITABLE : SIGNAL_UNKNOWN;
            return -1;
        }
        *out = sig;
        return 0;
    }
    int i = signal_index_by_name(v);
    if (i < 0) {
        *why = SIGNAL_UNKNOWN;
        return -1;
    }
    if (!signals_[i].advice) {
        *why = SIGNAL_UNSUITABLE;
        return -1;
    }
    *out = signals_[i].sig;
    return 0;
}

/* ---- globs and ranks ------------------------------------------------------------- */

int gg_value_globs(const char *text, const char **why)
{
    if (strlen(text) >= GG_MATCH_MAX) {
        *why = "too long (at most 511 characters)";
        return -1;
    }
    for (const char *s = text;;) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        char glob[GG_MATCH_MAX];
        gg_copy_trimmed(glob, sizeof glob, s, len);
        if (!*glob) {
            *why = "empty glob (expected comma-separated globs, such as NVIDIA GeForce RTX 3090* "
                   "for a device's name or libnccl* for a module's file name)";
            return -1;
        }
        if (!comma)
            return 0;
        s = comma + 1;
    }
}

bool gg_globs_match(const char *globs, const char *name)
{
    if (!globs || !name)
        return false;
    for (const char *s = globs;;) {
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

int gg_value_rank(const char *text, long max, long *out, const char **why)
{
    long n = 0;
    if (!*text) {
        *why = "empty";
        return -1;
    }
    for (const char *s = text; *s; s++) {
        if (!isdigit((unsigned char)*s)) {
            *why = "not a plain decimal number";
            return -1;
        }
        n = n * 10 + (*s - '0');
        if (n > max) {
            *why = "too large";
            return -1;
        }
    }
    *out = n;
    return 0;
}
