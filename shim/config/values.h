/* values.h - layer 2: the values a setting can take, parsed one way.
 *
 * The same parsers read a policy file's values, the GPUGUARD_* environment
 * and the defaults of settings.def, so a value means one thing wherever it
 * is written. Each returns 0, or -1 with *why set to a message fit to follow
 * "FILE:LINE: [section] key = 'value': ". Pure functions: no state, no I/O.
 */
#ifndef GG_VALUES_H
#define GG_VALUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_MATCH_MAX 512

/* A size as written: bytes, or a share of the device's total memory. */
struct gg_size {
    uint64_t bytes;        /* when !is_percent */
    double percent;        /* when is_percent: 0..100 */
    bool is_percent;
};

/* "1.5 GiB", "512MB", "4096", "10%". */
int gg_value_size(const char *text, struct gg_size *out, const char **why);
/* The size in bytes on a device of `total` bytes (a share never exceeds it). */
uint64_t gg_size_bytes(struct gg_size s, uint64_t total);

/* A decimal integer in [min, max]; *why names the range. */
int gg_value_int(const char *text, long min, long max, int *out, char *why, size_t why_cap);

/* yes/no, true/false, 1/0, on/off, any case. */
int gg_value_bool(const char *text, bool *out, const char **why);

/* One word of a vocabulary, any case. */
struct gg_word { const char *name; int value; };
struct gg_vocab { const struct gg_word *words; size_t n; };
int gg_value_word(const char *text, const struct gg_vocab *v, int *out, char *why,
                  size_t why_cap);
/* The name of value in the vocabulary; "?" if none. */
const char *gg_value_word_name(const struct gg_vocab *v, int value);

/* The vocabularies. */
enum gg_mode { GG_MODE_OFF = 0, GG_MODE_OBSERVE = 1, GG_MODE_ENFORCE = 2, GG_MODE_AUTO = 3 };
enum gg_enforce { GG_ENFORCE_RUNTIME = 0, GG_ENFORCE_ALL = 1 };
enum gg_stacks { GG_STACKS_OFF = 0, GG_STACKS_NEAR_MISS = 1, GG_STACKS_ALL = 2 };
extern const struct gg_vocab gg_vocab_mode, gg_vocab_enforce, gg_vocab_stacks;
const char *gg_mode_name(enum gg_mode m);
#ifdef GG_TESTING
const char *gg_enforce_name(enum gg_enforce e);
const char *gg_stacks_name(enum gg_stacks s);
#endif

/* A signal fit for advice: "SIGUSR2", "USR2", a number, a real-time signal,
 * or "none" (0). Signals a trainer stops or crashes on are refused. */
int gg_value_signal(const char *text, int *out, const char **why);
/* "SIGUSR2" for a known signal, "none" for 0, NULL for a bare number. */
const char *gg_signal_name(int sig);

/* Comma-separated globs, none empty, shorter than GG_MATCH_MAX. */
int gg_value_globs(const char *text, const char **why);
/* Does name match any of the comma-separated globs? */
bool gg_globs_match(const char *globs, const char *name);

/* A plain decimal in [0, max] (RANK): no sign, no spaces, no junk. */
int gg_value_rank(const char *text, long max, long *out, const char **why);

/* Copy s[0..len) without surrounding white space into out (truncating). */
void gg_copy_trimmed(char *out, size_t cap, const char *s, size_t len);

#endif /* GG_VALUES_H */
