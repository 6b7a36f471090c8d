/* json.c - one journal line, built in memory (see json.h). */
#include "json.h"

#include <math.h>
#include <stdarg.h>
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

static void quoted(struct gg_json *j, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    putc1(j, '"');
    size_t run = 0; /* bytes copied as they are, flushed in one put */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[6];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        default:
            if (c < 0x20 || c == 0x7f) {
                u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
                u[4] = hex[c >> 4]; u[5] = hex[c & 15];
                put(j, s + i - run, run);
                run = 0;
                put(j, u, 6);
                continue;
            }
            run++;
            continue;
        }
        put(j, s + i - run, run);
        run = 0;
        put(j, esc, strlen(esc));
    }
    put(j, s + n - run, run);
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
    /* Invalid UTF-8 stays as it is: readers get the bytes the program gave. */
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
    if (n > 0)
        put(j, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
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
    number(j, "%.6f", v);
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
