/* inifile.h - layer 2: an INI file, line by line, through inih, with exact
 * line numbers (inih's own API reports the line of the first error only).
 *
 * Only a regular file no larger than GG_INIFILE_MAX_BYTES is read (a FIFO, a
 * device such as /dev/zero or a directory is refused before any read that
 * could block or never end). The file is read into memory once and fed to
 * inih's ini_parse_stream by a reader that counts lines, strips leading
 * white space (so inih's multi-line continuation never turns an indented
 * key into part of the previous value), refuses over-long lines (inih would
 * split them silently) and NUL bytes, drops a UTF-8 BOM, and checks section
 * headers itself, so a malformed header or a line inih cannot parse is
 * reported with its line.
 *
 * inih has compile-time options for part of this (INI_HANDLER_LINENO hands
 * the handler its line, INI_CALL_HANDLER_ON_NEW_SECTION reports every
 * header, INI_ALLOW_MULTILINE 0 ends continuations), but they are options
 * of the library's build, not of its caller: the shared libinih a
 * distribution ships (Debian's libinih1 r55) is built with the defaults of
 * ini.h, and INI_HANDLER_LINENO changes the handler's type, so defining it
 * here would call the library with the wrong signature. What this adapter
 * adds is what those options would have done, and no more: the key and
 * value parsing, comments and inline comments stay inih's.
 */
#ifndef GG_INIFILE_H
#define GG_INIFILE_H

#include <stddef.h>

#define GG_INIFILE_MAX_BYTES (1u << 20)

struct gg_inifile_handler {
    /* A well-formed [section] header at `line`. */
    void (*section)(void *ctx, int line, const char *name);
    /* key = value at `line` (key may be empty: "= value"). */
    void (*pair)(void *ctx, int line, const char *key, const char *value);
    /* A line that is not a comment, a header or a pair, and why. */
    void (*problem)(void *ctx, int line, const char *msg);
    void *ctx;
};

/* Parse the file at path. 0 when it was read (its problems went to the
 * handler, in line order); -1 when it could not be read at all, with the
 * reason in why ("cannot open ...: No such file", "is a directory", ...). */
int gg_inifile_parse(const char *path, const struct gg_inifile_handler *h, char *why, size_t why_cap);

#endif /* GG_INIFILE_H */
