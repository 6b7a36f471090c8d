/* fuzz_json.c - libFuzzer harness of the journal's JSON writer (shim/base/json.c).
 *
 * The input is cut into a line built the way events.c builds its events:
 * arbitrary bytes in every string field (names, paths, symbols, Python
 * frames, the trainer's note, with and without a length, and in keys),
 * numbers from raw bits (NaN, infinities, extremes), nested arrays of
 * objects, and a start buffer of any size (so lines move to the heap at any
 * point). Every line must be one JSON value in well-formed UTF-8 ending in
 * one newline, with exactly as many strings as were written (a quote that
 * escaped its escaping would split one), and the builder must never fail.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "json_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct input {
    const uint8_t *p;
    size_t n;
};

static uint64_t take_u64(struct input *in, size_t bytes)
{
    uint64_t v = 0;
    for (size_t k = 0; k < bytes && in->n; k++, in->p++, in->n--)
        v = v << 8 | *in->p;
    return v;
}

/* A string of the next bytes: its length from one byte (0-255 bytes). */
static const char *take_str(struct input *in, size_t *len)
{
    size_t want = (size_t)take_u64(in, 1);
    *len = want < in->n ? want : in->n;
    const char *s = (const char *)in->p;
    in->p += *len;
    in->n -= *len;
    return s;
}

/* The same, NUL-terminated (what gg_json_str and keys take): a copy in buf,
 * cut at its first NUL. */
static const char *take_cstr(struct input *in, char *buf, size_t cap)
{
    size_t len;
    const char *s = take_str(in, &len);
    if (len >= cap)
        len = cap - 1;
    memcpy(buf, s, len);
    buf[len] = '\0';
    return buf;
}

static double take_f64(struct input *in)
{
    uint64_t bits = take_u64(in, 8);
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    char a[256], b[256], c[256];
    size_t len;
    long strings = 0;

    /* The start buffer: 0 to 255 bytes of a 256-byte one, or none. */
    size_t cap = (size_t)take_u64(&in, 1);
    char start[256];
    struct gg_json j;
    gg_json_init(&j, cap ? start : NULL, cap);

    gg_json_obj(&j);
    gg_json_kf64(&j, "t", take_f64(&in));
    gg_json_kstr(&j, "ev", take_cstr(&in, a, sizeof a));
    gg_json_ki64(&j, "pid", (int64_t)take_u64(&in, 8));
    gg_json_kstr(&j, "comm", take_cstr(&in, b, sizeof b));
    gg_json_key(&j, "rank");
    if (take_u64(&in, 1) & 1)
        gg_json_null(&j);
    else
        gg_json_i64(&j, (int64_t)take_u64(&in, 8));
    strings += 7; /* 5 keys, 2 values */

    /* devices: [{dev, name, total, cc, policy, limit, over}] */
    int ndev = (int)(take_u64(&in, 1) % 4);
    gg_json_key(&j, "devices");
    gg_json_arr(&j);
    strings++;
    for (int d = 0; d < ndev; d++) {
        gg_json_obj(&j);
        gg_json_ki64(&j, "dev", d);
        gg_json_kstr(&j, "name", take_cstr(&in, a, sizeof a));
        gg_json_ku64(&j, "total", take_u64(&in, 8));
        gg_json_kstr(&j, "cc", take_cstr(&in, b, sizeof b));
        gg_json_kstr(&j, "policy", take_cstr(&in, c, sizeof c));
        gg_json_kf64(&j, "rate", take_f64(&in));
        gg_json_kbool(&j, "over", take_u64(&in, 1) & 1);
        gg_json_obj_end(&j);
        strings += 7 + 3;
    }
    gg_json_arr_end(&j);

    /* stack: [{ip, module, sym, off}], pystack: [{file, line, func}] */
    int frames = (int)(take_u64(&in, 1) % 6);
    gg_json_key(&j, "stack");
    gg_json_arr(&j);
    strings++;
    for (int f = 0; f < frames; f++) {
        gg_json_obj(&j);
        gg_json_key(&j, "ip");
        gg_json_hex(&j, (uintptr_t)take_u64(&in, 8));
        gg_json_kstr(&j, "module", take_cstr(&in, a, sizeof a));
        gg_json_key(&j, "sym");
        const char *sym = take_str(&in, &len);
        if (len)
            gg_json_strn(&j, sym, len);
        else
            gg_json_str(&j, NULL); /* unnamed: null */
        gg_json_key(&j, "off");
        gg_json_u64(&j, take_u64(&in, 2));
        gg_json_obj_end(&j);
        strings += 4 + 2 + (len ? 1 : 0);
    }
    gg_json_arr_end(&j);
    gg_json_key(&j, "pystack");
    gg_json_arr(&j);
    strings++;
    for (int f = 0; f < frames; f++) {
        gg_json_obj(&j);
        gg_json_kstr(&j, "file", take_cstr(&in, a, sizeof a));
        gg_json_ki64(&j, "line", (int64_t)take_u64(&in, 4));
        gg_json_kstr(&j, "func", take_cstr(&in, b, sizeof b));
        gg_json_obj_end(&j);
        strings += 5;
    }
    gg_json_arr_end(&j);

    /* A key of any bytes, and the trainer's note: the rest of the input,
     * NULs and all, with its length. */
    gg_json_key(&j, take_cstr(&in, a, sizeof a));
    gg_json_strn(&j, (const char *)in.p, in.n);
    strings += 2;
    gg_json_obj_end(&j);
    gg_json_raw_newline(&j);

    if (j.failed) {
        fprintf(stderr, "fuzz_json: the builder failed on a line of depth 3\n");
        abort();
    }
    long got = gg_check_json_line(j.buf, j.len);
    if (got != strings) {
        fprintf(stderr, "fuzz_json: %s (%ld strings, %ld written):\n%.*s",
                got < 0 ? "not one valid JSON line in UTF-8" : "strings merged or split", got,
                strings, (int)j.len, j.buf);
        abort();
    }
    gg_json_free(&j);
    return 0;
}
