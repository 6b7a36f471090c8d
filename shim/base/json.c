/* json.c - one journal line, built in memory (see json.h). */
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gg_json_init(struct gg_json *j, char *buf, size_t cap)
{
    memset(j, 0, sizeof *j);
    j->buf = j->origin = buf;
    j->cap = buf ? cap : 0;
    j->first[0] = true;
}

void gg_json_free(struct gg_json *j)
{
    if (j->heap)
        free(j->buf);
    j->buf = NULL;
    j->heap = false;
    j->cap = j->len = 0;
}

/* Make room for n more bytes (and a terminating NUL). */
static bool reserve(struct gg_json *j, size_t n)
{
    if (j->failed)
        return false;
    if (j->len + n + 1 <= j->cap)
        return true;
    if (n > SIZE_MAX / 4 - j->len) { /* the doubling below would wrap */
        j->failed = true;
        return false;
    }
    size_t cap = j->cap ? j->cap : 256;
    while (cap < j->len + n + 1)
        cap *= 2;
    char *p = j->heap ? realloc(j->buf, cap) : malloc(cap);
    if (!p) {
        j->failed = true;
        return false;
    }
    if (!j->heap && j->len)
        memcpy(p, j->buf, j->len);
    j->buf = p;
    j->cap = cap;
    j->heap = true;
    return true;
}

static void put(struct gg_json *j, const char *s, size_t n)
{
    if (!reserve(j, n))
        return;
    memcpy(j->buf + j->len, s, n);
    j->len += n;
    j->buf[j->len] = '\0';
}

static void putc1(struct gg_json *j, char c)
{
    put(j, &c, 1);
}

/* Before any value or key: the comma, unless first at this depth or after a key. */
static void sep(struct gg_json *j)
{
    if (j->after_key) {
        j->after_key = false;
        return;
    }
    if (!j->first[j->depth])
        putc1(j, ',');
    j->first[j->depth] = false;
}

static void open(struct gg_json *j, char c)
{
    sep(j);
    putc1(j, c);
    if (j->depth + 1 >= GG_JSON_DEPTH) {
        j->failed = true;
        return;
    }
    j->first[++j->depth] = true;
}

static void close_(struct gg_json *j, char c)
{
    if (j->depth > 0)
        j->depth--;
    putc1(j, c);
}

void gg_json_obj(struct gg_json *j) { open(j, '{'); }
void gg_json_obj_end(struct gg_json *j) { close_(j, '}'); }
void gg_json_arr(struct gg_json *j) { open(j, '['); }
void gg_json_arr_end(struct gg_json *j) { close_(j, ']'); }

/* The well-formed UTF-8 sequence starting at s[0] (of the n bytes left):
 * its length (2 to 4), or 0 when there is none, with *bad set to the length
 * of its maximal subpart (the longest prefix of some well-formed sequence,
 * at least 1 byte), which one U+FFFD replaces. That is the Unicode
 * standard's recommended practice (chapter 3, "U+FFFD Substitution of
 * Maximal Subparts") and exactly what Python's decode(errors="replace")
 * does. The ranges are the standard's table 3-7: the second byte's range
 * excludes overlong forms (E0, F0), surrogates (ED) and code points past
 * U+10FFFF (F4); C0, C1 and F5-FF never start a sequence. Reads nothing
 * past s[n - 1]. */
static size_t utf8_seq(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xBF; /* the second byte's range */
    size_t len;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    for (size_t k = 1; k < len; k++, lo = 0x80, hi = 0xBF) {
        if (k >= n || s[k] < lo || s[k] > hi) {
            *bad = k;
            return 0;
        }
    }
    return len;
}

/* A JSON string of the bytes s[0..n), whatever they are: valid UTF-8 is
 * kept, '"', '\\' and control characters are escaped, and each invalid
 * sequence becomes U+FFFD. The bytes come from outside (paths, environment
 * values, process, thread and symbol names, the trainer's notes) and a
 * journal line must stay valid JSON for every reader. U+FFFD rather than
 * "\u00XX" of the raw byte: the latter would read back as the code point
 * U+00XX, indistinguishable from a real one (a Latin-1 letter), so the
 * journal would lie; U+FFFD says plainly that a byte was not text. */
static void quoted(struct gg_json *j, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t from = 0; /* where the bytes copied as they are begin */
    putc1(j, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = u[i];
        const char *esc;
        size_t esc_len = 2, skip = 1;
        char ctl[6];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
            i++; /* the common case: printable ASCII, as it is */
            continue;
        }
        if (c >= 0x80) {
            size_t bad = 0, len = utf8_seq(u + i, n - i, &bad);
            if (len) {
                i += len;
                continue;
            }
            esc = "\xef\xbf\xbd"; /* U+FFFD */
            esc_len = 3;
            skip = bad;
        } else if (c == '"') {
            esc = "\\\"";
        } else if (c == '\\') {
            esc = "\\\\";
        } else if (c == '\n') {
            esc = "\\n";
        } else if (c == '\r') {
            esc = "\\r";
        } else if (c == '\t') {
            esc = "\\t";
        } else { /* the other controls, and DEL */
            ctl[0] = '\\'; ctl[1] = 'u'; ctl[2] = '0'; ctl[3] = '0';
            ctl[4] = hex[c >> 4]; ctl[5] = hex[c & 15];
            esc = ctl;
            esc_len = 6;
        }
        put(j, s + from, i - from);
        put(j, esc, esc_len);
        i += skip;
        from = i;
    }
    put(j, s + from, n - from);
    putc1(j, '"');
}

void gg_json_key(struct gg_json *j, const char *k)
{
    sep(j);
    quoted(j, k, strlen(k));
    putc1(j, ':');
    j->after_key = true;
}

void gg_json_strn(struct gg_json *j, const char *s, size_t n)
{
    sep(j);
    if (!s) {
        put(j, "null", 4);
        return;
    }
    quoted(j, s, n);
}

void gg_json_str(struct gg_json *j, const char *s)
{
    gg_json_strn(j, s, s ? strlen(s) : 0);
}

static void number(struct gg_json *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void number(struct gg_json *j, const char *fmt, ...)
{
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    sep(j);
    if (n <= 0 || (size_t)n >= sizeof tmp)
        j->failed = true; /* a cut number would be a wrong one */
    else
        put(j, tmp, (size_t)n);
}

void gg_json_u64(struct gg_json *j, uint64_t v) { number(j, "%llu", (unsigned long long)v); }
void gg_json_i64(struct gg_json *j, int64_t v) { number(j, "%lld", (long long)v); }
void gg_json_hex(struct gg_json *j, uintptr_t v) { number(j, "\"0x%llx\"", (unsigned long long)v); }

void gg_json_f64(struct gg_json *j, double v)
{
    if (!isfinite(v)) {
        gg_json_null(j);
        return;
    }
    /* %.6f of a large value is hundreds of digits, more than number()
     * keeps; from 1e15 on, where %.6f's decimals stop meaning anything,
     * 17 significant digits, which read back exactly. */
    if (fabs(v) < 1e15)
        number(j, "%.6f", v);
    else
        number(j, "%.17g", v);
}

void gg_json_bool(struct gg_json *j, bool v)
{
    sep(j);
    put(j, v ? "true" : "false", v ? 4 : 5);
}

void gg_json_raw_newline(struct gg_json *j)
{
    putc1(j, '\n');
}

void gg_json_null(struct gg_json *j)
{
    sep(j);
    put(j, "null", 4);
}

void gg_json_kstr(struct gg_json *j, const char *k, const char *v) { gg_json_key(j, k); gg_json_str(j, v); }
void gg_json_ku64(struct gg_json *j, const char *k, uint64_t v) { gg_json_key(j, k); gg_json_u64(j, v); }
void gg_json_ki64(struct gg_json *j, const char *k, int64_t v) { gg_json_key(j, k); gg_json_i64(j, v); }
void gg_json_kf64(struct gg_json *j, const char *k, double v) { gg_json_key(j, k); gg_json_f64(j, v); }
void gg_json_kbool(struct gg_json *j, const char *k, bool v) { gg_json_key(j, k); gg_json_bool(j, v); }
