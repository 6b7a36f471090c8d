/* test_json.c - one journal line: commas, escapes, growth to the heap, and
 * any byte string turned into valid UTF-8 JSON. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "json.h"
#include "unit.h"
#include "../fuzz/json_check.h"

static void test_nesting_and_commas(void)
{
    char buf[256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_obj(&j);
    gg_json_ku64(&j, "a", 1);
    gg_json_key(&j, "b");
    gg_json_arr(&j);
    gg_json_i64(&j, -2);
    gg_json_obj(&j);
    gg_json_kbool(&j, "c", true);
    gg_json_obj_end(&j);
    gg_json_null(&j);
    gg_json_arr_end(&j);
    gg_json_kf64(&j, "d", 0.5);
    gg_json_kf64(&j, "e", NAN);
    gg_json_key(&j, "f");
    gg_json_hex(&j, 0xdeadbeef);
    gg_json_obj_end(&j);
    CHECK_STR(j.buf, "{\"a\":1,\"b\":[-2,{\"c\":true},null],\"d\":0.500000,\"e\":null,\"f\":\"0xdeadbeef\"}");
    CHECK(!j.heap);
    gg_json_free(&j);
}

static void test_escapes(void)
{
    char buf[256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_str(&j, "q\"b\\n\n\t\x01\x7f \xc3\xa9");
    CHECK_STR(j.buf, "\"q\\\"b\\\\n\\n\\t\\u0001\\u007f \xc3\xa9\"");
    gg_json_free(&j);
    gg_json_init(&j, buf, sizeof buf);
    gg_json_str(&j, NULL);
    CHECK_STR(j.buf, "null");
    gg_json_free(&j);
}

static void test_grows_to_heap(void)
{
    char buf[16];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_arr(&j);
    for (int i = 0; i < 1000; i++)
        gg_json_u64(&j, 1234567890);
    gg_json_arr_end(&j);
    CHECK(j.heap);
    CHECK(!j.failed);
    CHECK_EQ_U64(j.len, 2 + 1000 * 10 + 999);
    CHECK(j.buf[0] == '[' && j.buf[j.len - 1] == ']');
    gg_json_free(&j);
}

static void test_too_deep_fails_cleanly(void)
{
    char buf[256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    for (int i = 0; i < GG_JSON_DEPTH + 4; i++)
        gg_json_arr(&j);
    CHECK(j.failed);
    gg_json_free(&j);
}

/* The JSON string gg_json_strn makes of n bytes, in out (NUL-terminated). */
static void quote(const char *s, size_t n, char *out, size_t cap)
{
    char buf[64];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_strn(&j, s, n);
    snprintf(out, cap, "%s", j.failed ? "(failed)" : j.buf);
    gg_json_free(&j);
}

#define FFFD "\xef\xbf\xbd"

/* Each class of ill-formed UTF-8, and what becomes of it: one U+FFFD per
 * maximal subpart, as Python's bytes.decode("utf-8", "replace") does. */
static void test_invalid_utf8_replaced(void)
{
    static const struct {
        const char *in, *want;
    } cases[] = {
        /* well-formed: kept, including the edges of each range */
        {"\xc2\x80 \xdf\xbf", "\"\xc2\x80 \xdf\xbf\""},
        {"\xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 \xef\xbf\xbf",
         "\"\xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 \xef\xbf\xbf\""},
        {"\xf0\x90\x80\x80 \xf4\x8f\xbf\xbf", "\"\xf0\x90\x80\x80 \xf4\x8f\xbf\xbf\""},
        /* lone continuation bytes: one each */
        {"a\x80" "b\xbf\xbf", "\"a" FFFD "b" FFFD FFFD "\""},
        /* overlong encodings: C0/C1 never start one, E0 80-9F and F0 80-8F
         * are not prefixes, so every byte is its own subpart */
        {"\xc0\xaf", "\"" FFFD FFFD "\""},
        {"\xc1\xbf", "\"" FFFD FFFD "\""},
        {"\xe0\x80\xaf", "\"" FFFD FFFD FFFD "\""},
        {"\xf0\x80\x80\xaf", "\"" FFFD FFFD FFFD FFFD "\""},
        /* surrogates encoded in UTF-8 (CESU): ED A0-BF is not a prefix */
        {"\xed\xa0\x80", "\"" FFFD FFFD FFFD "\""},
        {"\xed\xbf\xbf", "\"" FFFD FFFD FFFD "\""},
        /* past U+10FFFF: F4 90-BF, and F5-FF */
        {"\xf4\x90\x80\x80", "\"" FFFD FFFD FFFD FFFD "\""},
        {"\xf5\x80", "\"" FFFD FFFD "\""},
        {"\xf8\xfc\xfe\xff", "\"" FFFD FFFD FFFD FFFD "\""},
        /* truncated sequences: the prefix is one subpart, then what follows */
        {"\xc3", "\"" FFFD "\""},
        {"\xe2\x82", "\"" FFFD "\""},
        {"\xf0\x9f\x98", "\"" FFFD "\""},
        {"\xf0\x9f\x98" "A", "\"" FFFD "A\""},
        {"\xe2\x82\"", "\"" FFFD "\\\"\""},
        {"\xf1\x80\x80\xc3\xa9", "\"" FFFD "\xc3\xa9\""},
        {"\xe1\x80\xe1\x80\x80", "\"" FFFD "\xe1\x80\x80\""},
    };
    char out[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        quote(cases[i].in, strlen(cases[i].in), out, sizeof out);
        CHECK_STR(out, cases[i].want);
    }
}

/* A NUL inside the given length is a character; nothing past the length is
 * read (the bytes after it would be a valid continuation). */
static void test_length_is_the_end(void)
{
    char out[64];
    quote("a\0b", 3, out, sizeof out);
    CHECK_STR(out, "\"a\\u0000b\"");
    quote("\xc3\xa9", 1, out, sizeof out);
    CHECK_STR(out, "\"" FFFD "\"");
    quote("\xf0\x9f\x98\x80", 3, out, sizeof out);
    CHECK_STR(out, "\"" FFFD "\"");
    /* exactly n bytes of a heap block: ASan sees any read past it */
    char *tail = malloc(2);
    memcpy(tail, "x\xe2", 2);
    quote(tail, 2, out, sizeof out);
    CHECK_STR(out, "\"x" FFFD "\"");
    free(tail);
}

/* Keys go through the same writer. */
static void test_keys_escaped(void)
{
    char buf[64];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_obj(&j);
    gg_json_kstr(&j, "k\xff\"", "v\x80");
    gg_json_obj_end(&j);
    CHECK_STR(j.buf, "{\"k" FFFD "\\\"\":\"v" FFFD "\"}");
    gg_json_free(&j);
}

static void test_large_numbers_whole(void)
{
    char buf[64];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_arr(&j);
    gg_json_f64(&j, 1e300);
    gg_json_f64(&j, -1.5e15);
    gg_json_f64(&j, 123456.25);
    gg_json_u64(&j, UINT64_MAX);
    gg_json_i64(&j, INT64_MIN);
    gg_json_arr_end(&j);
    CHECK(!j.failed);
    CHECK_STR(j.buf, "[1.0000000000000001e+300,-1500000000000000,123456.250000,"
                     "18446744073709551615,-9223372036854775808]");
    CHECK(strtod(j.buf + 1, NULL) == 1e300);
    gg_json_free(&j);
}

/* ---- the property: any bytes, valid JSON in valid UTF-8 ------------------- */

/* The lead byte's sequence length by its bit pattern (0: not a lead). */
static size_t lead_len(unsigned c)
{
    return c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
         : (c & 0xf8) == 0xf0 ? 4 : 0;
}

/* Python's bytes.decode("utf-8", "replace"), written independently of the
 * writer: at each ill-formed spot the longest prefix that some completion
 * could still turn into a scalar value of the lead's length (the values
 * reachable from a prefix form an interval; it must meet the length's range
 * outside the surrogates) is one U+FFFD. Returns the bytes made. */
static size_t reference_decode(const unsigned char *s, size_t n, unsigned char *out)
{
    static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = lead_len(s[i]);
        if (len && len <= n - i && gg_check_utf8(s + i, len)) {
            memcpy(out + o, s + i, len);
            o += len, i += len;
            continue;
        }
        size_t k = 1; /* the maximal subpart */
        for (size_t m = 2; len > 1 && m < len && m <= n - i; m++) {
            if ((s[i + m - 1] & 0xc0) != 0x80)
                break;
            uint32_t cp = s[i] & (0x7f >> len);
            for (size_t q = 1; q < m; q++)
                cp = cp << 6 | (s[i + q] & 0x3f);
            unsigned spare = 6 * (unsigned)(len - m);
            uint32_t lo = cp << spare, hi = lo | ((1u << spare) - 1);
            lo = lo > least[len] ? lo : least[len];
            hi = hi < 0x10ffff ? hi : 0x10ffff;
            if (lo > hi || (lo >= 0xd800 && hi <= 0xdfff))
                break;
            k = m;
        }
        memcpy(out + o, FFFD, 3);
        o += 3, i += k;
    }
    return o;
}

/* One JSON string (RFC 8259) at s[0..n) and nothing after (quotes, no raw
 * control character, only the defined escapes), decoded into out. The
 * writer escapes only ASCII, so \u escapes above U+007F are refused too.
 * Returns the decoded length, or -1 when s is not such a string. */
static long json_unquote(const char *s, size_t n, unsigned char *out)
{
    size_t o = 0;
    if (n < 2 || s[0] != '"' || s[n - 1] != '"')
        return -1;
    for (size_t i = 1; i < n - 1; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == '"')
            return -1;
        if (c != '\\') {
            out[o++] = c;
            continue;
        }
        if (++i >= n - 1)
            return -1;
        const char *simple = strchr("\"\\/bfnrt", s[i]);
        if (s[i] && simple) {
            out[o++] = (unsigned char)"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            continue;
        }
        if (s[i] != 'u' || i + 4 >= n - 1)
            return -1;
        char hex[5] = {s[i + 1], s[i + 2], s[i + 3], s[i + 4], 0}, *end;
        unsigned long v = strtoul(hex, &end, 16);
        if (*end || strspn(hex, "0123456789abcdefABCDEF") != 4 || v > 0x7f)
            return -1;
        out[o++] = (unsigned char)v;
        i += 4;
    }
    return (long)o;
}

/* Up to cap bytes of valid UTF-8: random scalar values, often at the edges
 * of the encoding's ranges. Returns its length. */
static size_t random_text(uint64_t *x, unsigned char *out, size_t cap)
{
    static const uint32_t edge[] = {0x00, 0x22, 0x5c, 0x7f, 0x80, 0x7ff, 0x800, 0xd7ff,
                                    0xe000, 0xfffd, 0xffff, 0x10000, 0x10ffff};
    size_t n = 0;
    for (;;) {
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        uint32_t cp = (*x >> 8) & 1 ? edge[(*x >> 16) % (sizeof edge / sizeof edge[0])]
                                    : (uint32_t)(*x >> 24) % 0x110000;
        if (cp >= 0xd800 && cp <= 0xdfff)
            continue;
        size_t len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (n + len > cap)
            return n;
        static const unsigned char mark[] = {0, 0, 0xc0, 0xe0, 0xf0};
        for (size_t k = len - 1; k > 0; k--, cp >>= 6)
            out[n + k] = 0x80 | (cp & 0x3f);
        out[n] = (unsigned char)(len == 1 ? cp : mark[len] | cp);
        n += len;
    }
}

/* 100 000 random byte strings, biased toward the bytes that matter (UTF-8
 * lead and continuation bytes at the range edges, controls, quotes,
 * backslashes): the output is always one JSON string in valid UTF-8, and it
 * reads back as exactly what Python's decode(errors="replace") makes of the
 * input (so valid text, a quarter of the strings, passes unchanged). */
static void test_any_bytes_make_valid_json(void)
{
    static const unsigned char pick[] = {0x00, 0x01, 0x1f, '"', '\\', 'a', 0x7f, 0x80, 0x8f,
                                         0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2, 0xdf, 0xe0,
                                         0xe1, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff};
    uint64_t x = 0x9e3779b97f4a7c15ULL; /* xorshift64: the same strings every run */
    unsigned char in[48], want[48 * 3], got[48 * 3];
    int invalid = 0, bad = 0;
    for (int t = 0; t < 100000; t++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = x % sizeof in;
        if (t % 4 == 0)
            n = random_text(&x, in, n);
        else
            for (size_t i = 0; i < n; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                in[i] = (x >> 8) & 1 ? pick[(x >> 16) % sizeof pick] : (unsigned char)(x >> 24);
            }
        char buf[32];
        struct gg_json j;
        gg_json_init(&j, buf, sizeof buf);
        gg_json_strn(&j, (const char *)in, n);
        long got_n = j.failed ? -1 : json_unquote(j.buf, j.len, got);
        size_t want_n = reference_decode(in, n, want);
        bool ok = got_n >= 0 && j.len == strlen(j.buf) &&
                  gg_check_utf8((const unsigned char *)j.buf, j.len) && (size_t)got_n == want_n &&
                  memcmp(got, want, want_n) == 0;
        if (!ok && bad++ < 5) {
            printf("  bad output for");
            for (size_t i = 0; i < n; i++)
                printf(" %02x", in[i]);
            printf(": %s\n", j.failed ? "(failed)" : j.buf);
        }
        invalid += !gg_check_utf8(in, n);
        gg_json_free(&j);
    }
    CHECK_EQ_U64(bad, 0);
    CHECK(invalid > 50000 && invalid < 90000); /* both kinds, in numbers */
}

/* The oracle the fuzz harnesses trust: it must refuse what is not JSON or
 * not UTF-8, and take what is. */
static void test_checker_refuses_bad_lines(void)
{
    static const char *const bad[] = {
        "{\"a\":1}",           /* no newline */
        "{\"a\":1}\n\n",       /* more after it */
        "{\"a\":1,}\n",        /* trailing comma */
        "{\"a\" 1}\n",         /* no colon */
        "{\"a\":01}\n",        /* leading zero */
        "[1.]\n", "[1e]\n", "[-]\n", "[.5]\n",
        "[\"\x01\"]\n",        /* raw control character */
        "[\"\\x\"]\n",         /* unknown escape */
        "[\"\\u12\"]\n",       /* short \u */
        "[\"\xff\"]\n",        /* not UTF-8 */
        "[\"\xed\xa0\x80\"]\n", /* a surrogate */
        "[\"\xc0\xaf\"]\n",    /* overlong */
        "[\"a\"\n",            /* unbalanced */
        "[\"a\"]]\n", "{\"a\":tru}\n", "\"a\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(gg_check_json_line(bad[i], strlen(bad[i])) == -1);
    const char *good = "{\"a\":[1,-0.5,2e+10,true,false,null,\"\\u0001\\\"\xf4\x8f\xbf\xbf\"],\"b\":{}}\n";
    CHECK(gg_check_json_line(good, strlen(good)) == 3);
}

/* A line built the way events.c builds one, with hostile bytes in every
 * string: valid JSON, and each string still one string. */
static void test_event_line_with_hostile_strings(void)
{
    const char *hostile = "\xff\"}\\\n\x01\xed\xa0\x80\xc3";
    char buf[128];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_obj(&j);
    gg_json_kf64(&j, "t", 1.25);
    gg_json_kstr(&j, "ev", "start");
    gg_json_kstr(&j, "comm", hostile);
    gg_json_key(&j, "devices");
    gg_json_arr(&j);
    gg_json_obj(&j);
    gg_json_kstr(&j, "name", hostile);
    gg_json_kstr(&j, "policy", hostile);
    gg_json_obj_end(&j);
    gg_json_arr_end(&j);
    gg_json_key(&j, "text");
    gg_json_strn(&j, hostile, 4);
    gg_json_obj_end(&j);
    gg_json_raw_newline(&j);
    CHECK(!j.failed);
    CHECK(gg_check_json_line(j.buf, j.len) == 12); /* 7 keys, 5 string values */
    gg_json_free(&j);
}

int main(void)
{
    RUN(test_nesting_and_commas);
    RUN(test_escapes);
    RUN(test_grows_to_heap);
    RUN(test_too_deep_fails_cleanly);
    RUN(test_invalid_utf8_replaced);
    RUN(test_length_is_the_end);
    RUN(test_keys_escaped);
    RUN(test_large_numbers_whole);
    RUN(test_any_bytes_make_valid_json);
    RUN(test_checker_refuses_bad_lines);
    RUN(test_event_line_with_hostile_strings);
    return unit_done();
}
