/* json_check.h - strict checkers of what the journal's JSON writer makes:
 * the oracle of the fuzz harnesses (tests/fuzz) and of tests/unit/test_json.c.
 *
 * Written from the specifications (RFC 3629 for UTF-8, RFC 8259 for JSON),
 * not from shim/base/json.c, so the writer cannot share a mistake with them.
 */
#ifndef GG_JSON_CHECK_H
#define GG_JSON_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Well-formed UTF-8, by code point arithmetic: each sequence's length comes
 * from its lead byte's bit pattern, its value needs exactly that length, is
 * no surrogate and is at most U+10FFFF. */
static inline bool gg_check_utf8(const unsigned char *s, size_t n)
{
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                   : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!len || len > n - i)
            return false;
        uint32_t cp = len == 1 ? c : c & (0x7fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < least[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

/* A recursive-descent reader of RFC 8259 JSON that only says yes or no. */
struct gg_jcheck {
    const char *s;
    size_t n, i;
    long strings; /* string values and keys read */
};

#define GG_JCHECK_DEPTH 64

static inline bool gg_jcheck_lit(struct gg_jcheck *c, const char *w)
{
    size_t len = strlen(w);
    if (c->n - c->i < len || memcmp(c->s + c->i, w, len) != 0)
        return false;
    c->i += len;
    return true;
}

static inline bool gg_jcheck_digits(struct gg_jcheck *c)
{
    size_t from = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')
        c->i++;
    return c->i > from;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static inline bool gg_jcheck_number(struct gg_jcheck *c)
{
    if (c->i < c->n && c->s[c->i] == '-')
        c->i++;
    if (c->i < c->n && c->s[c->i] == '0')
        c->i++;
    else if (!(c->i < c->n && c->s[c->i] >= '1' && c->s[c->i] <= '9') || !gg_jcheck_digits(c))
        return false;
    if (c->i < c->n && c->s[c->i] == '.') {
        c->i++;
        if (!gg_jcheck_digits(c))
            return false;
    }
    if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
        c->i++;
        if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-'))
            c->i++;
        if (!gg_jcheck_digits(c))
            return false;
    }
    return true;
}

/* "..." with no raw control character and only the defined escapes. */
static inline bool gg_jcheck_string(struct gg_jcheck *c)
{
    if (c->i >= c->n || c->s[c->i] != '"')
        return false;
    for (c->i++; c->i < c->n; c->i++) {
        unsigned char ch = (unsigned char)c->s[c->i];
        if (ch == '"') {
            c->i++;
            c->strings++;
            return true;
        }
        if (ch < 0x20)
            return false;
        if (ch != '\\')
            continue;
        if (++c->i >= c->n)
            return false;
        char e = c->s[c->i];
        if (e == 'u') {
            for (int k = 1; k <= 4; k++)
                if (c->i + k >= c->n || !strchr("0123456789abcdefABCDEF", c->s[c->i + k]) ||
                    !c->s[c->i + k])
                    return false;
            c->i += 4;
        } else if (!e || !strchr("\"\\/bfnrt", e)) {
            return false;
        }
    }
    return false;
}

static inline bool gg_jcheck_value(struct gg_jcheck *c, int depth);

/* Members or elements up to the closing bracket; the opening one is read. */
static inline bool gg_jcheck_container(struct gg_jcheck *c, int depth, char close, bool keys)
{
    if (depth >= GG_JCHECK_DEPTH)
        return false;
    if (c->i < c->n && c->s[c->i] == close) {
        c->i++;
        return true;
    }
    for (;;) {
        if (keys && !(gg_jcheck_string(c) && gg_jcheck_lit(c, ":")))
            return false;
        if (!gg_jcheck_value(c, depth + 1))
            return false;
        if (c->i < c->n && c->s[c->i] == ',') {
            c->i++;
            continue;
        }
        return gg_jcheck_lit(c, close == '}' ? "}" : "]");
    }
}

/* One value; the writer puts no white space between tokens, so none is
 * taken here either. */
static inline bool gg_jcheck_value(struct gg_jcheck *c, int depth)
{
    if (c->i >= c->n)
        return false;
    switch (c->s[c->i]) {
    case '{':
        c->i++;
        return gg_jcheck_container(c, depth, '}', true);
    case '[':
        c->i++;
        return gg_jcheck_container(c, depth, ']', false);
    case '"':
        return gg_jcheck_string(c);
    case 't':
        return gg_jcheck_lit(c, "true");
    case 'f':
        return gg_jcheck_lit(c, "false");
    case 'n':
        return gg_jcheck_lit(c, "null");
    default:
        return gg_jcheck_number(c);
    }
}

/* A journal line: one JSON value in well-formed UTF-8, then '\n', then
 * nothing. Returns the number of strings in it (keys included), or -1. */
static inline long gg_check_json_line(const char *s, size_t n)
{
    struct gg_jcheck c = {s, n, 0, 0};
    if (!gg_check_utf8((const unsigned char *)s, n))
        return -1;
    if (!gg_jcheck_value(&c, 0) || c.i + 1 != n || s[c.i] != '\n')
        return -1;
    return c.strings;
}

#endif /* GG_JSON_CHECK_H */
