/* json.h - one journal line, built in memory and written with one write(2).
 *
 * The builder starts in a caller-supplied buffer (usually on the stack) and
 * moves to the heap only when a line outgrows it. Commas are placed for the
 * caller: open an object or array, add members, close it. On any failure
 * (out of memory, nesting too deep) the line is marked failed and is not
 * written; nothing aborts.
 */
#ifndef GG_JSON_H
#define GG_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GG_JSON_DEPTH 16

struct gg_json {
    char *buf;
    char *origin;               /* the caller's buffer (buf until the line outgrows it) */
    size_t len, cap;
    bool heap;                  /* buf came from malloc */
    bool failed;
    int depth;
    bool first[GG_JSON_DEPTH];  /* no member written yet at this depth */
    bool after_key;             /* the next value follows a key: no comma */
};

void gg_json_init(struct gg_json *j, char *buf, size_t cap);
void gg_json_free(struct gg_json *j);

void gg_json_obj(struct gg_json *j);                /* { */
void gg_json_obj_end(struct gg_json *j);            /* } */
void gg_json_arr(struct gg_json *j);                /* [ */
void gg_json_arr_end(struct gg_json *j);            /* ] */
void gg_json_key(struct gg_json *j, const char *k); /* "k": */

void gg_json_str(struct gg_json *j, const char *s); /* escaped; NULL -> null */
void gg_json_strn(struct gg_json *j, const char *s, size_t n);
void gg_json_u64(struct gg_json *j, uint64_t v);
void gg_json_i64(struct gg_json *j, int64_t v);
void gg_json_f64(struct gg_json *j, double v);      /* %.6f; non-finite -> null */
void gg_json_bool(struct gg_json *j, bool v);
void gg_json_null(struct gg_json *j);
void gg_json_hex(struct gg_json *j, uintptr_t v);   /* "0x7f..." as a string */
/* End the line: a newline after the closed top-level value. */
void gg_json_raw_newline(struct gg_json *j);

/* Shorthands for "key": value inside an object. */
void gg_json_kstr(struct gg_json *j, const char *k, const char *v);
void gg_json_ku64(struct gg_json *j, const char *k, uint64_t v);
void gg_json_ki64(struct gg_json *j, const char *k, int64_t v);
void gg_json_kf64(struct gg_json *j, const char *k, double v);
void gg_json_kbool(struct gg_json *j, const char *k, bool v);

#endif /* GG_JSON_H */
