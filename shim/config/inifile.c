/* inifile.c - layer 2: the inih adapter (see inifile.h). */
#include "inifile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <fcntl.h>
#include <ini.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prim.h"
#include "values.h"

#define SHOW "%.120s" /* how much of a line a message quotes */

struct parse {
    const struct gg_inifile_handler *h;
    const char *buf, *end;   /* the file, and where the next line starts */
    const char *pos;
    int line;                /* the physical line inih is working on */
    const char *text;        /* that line, trimmed (in the reader's buffer) */
    bool key_line;           /* it should reach the handler */
    bool handled;            /* inih called the handler for it */
    int problems;
};

static bool is_blank(int c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

__attribute__((format(printf, 3, 4))) static void problem(struct parse *p, int line,
                                                           const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->problems++;
    if (p->h->problem)
        p->h->problem(p->h->ctx, line, msg);
}

/* inih's find_chars_or_comment: the first of `chars`, or an inline ';'
 * comment (one that follows white space), or the end. */
static const char *find_sep(const char *s, const char *chars)
{
    bool was_space = false;
    while (*s && !(chars && strchr(chars, *s)) && !(was_space && *s == ';')) {
        was_space = is_blank((unsigned char)*s);
        s++;
    }
    return s;
}

/* A "[section]" line, checked here: inih says nothing about a header it
 * cannot parse, and calls nothing for a section without keys. */
static void header(struct parse *p, const char *text)
{
    const char *end = find_sep(text + 1, "]");
    char name[64];
    if (*end != ']') {
        problem(p, p->line, "malformed section header '" SHOW "' (expected [name])", text);
        if (p->h->section)
            p->h->section(p->h->ctx, p->line, NULL);
        return;
    }
    gg_copy_trimmed(name, sizeof name, text + 1, (size_t)(end - text - 1));
    if (p->h->section)
        p->h->section(p->h->ctx, p->line, name);
    const char *rest = end + 1;
    while (*rest && is_blank((unsigned char)*rest))
        rest++;
    if (*rest && *rest != ';' && *rest != '#')
        problem(p, p->line, "unexpected text after [%s]: '" SHOW "'", name, rest);
}

/* A key line for which inih never called the handler could not be parsed. */
static void line_done(struct parse *p)
{
    if (p->key_line && !p->handled)
        problem(p, p->line,
                "cannot parse '" SHOW "' (expected key = value, [section] or a ; comment)",
                p->text);
    p->key_line = false;
}

/* inih's reader: one physical line per call, counted and cleaned. */
static char *reader(char *str, int num, void *stream)
{
    struct parse *p = stream;
    line_done(p);
    if (num < 2 || p->pos >= p->end)
        return NULL;
    const char *nl = memchr(p->pos, '\n', (size_t)(p->end - p->pos));
    const char *stop = nl ? nl : p->end;
    size_t n = (size_t)(stop - p->pos);
    const char *s = p->pos;
    p->pos = nl ? nl + 1 : p->end;
    p->line++;
    str[0] = '\0';
    if (memchr(s, '\0', n)) {
        problem(p, p->line, "line contains a NUL byte");
        return str;
    }
    if (p->line == 1 && n >= 3 && (unsigned char)s[0] == 0xEF && (unsigned char)s[1] == 0xBB &&
        (unsigned char)s[2] == 0xBF) {
        s += 3;
        n -= 3;
    }
    while (n && is_blank((unsigned char)*s)) {
        s++;
        n--;
    }
    while (n && is_blank((unsigned char)s[n - 1]))
        n--;
    if (n >= (size_t)num) {
        problem(p, p->line, "line too long (%zu characters, at most %d)", n, num - 1);
        return str;
    }
    memcpy(str, s, n);
    str[n] = '\0';
    p->text = str;
    p->handled = false;
    if (!n || *str == ';' || *str == '#')
        return str;
    if (*str == '[') {
        header(p, str);
        /* inih parses the header too; a malformed one it reports as an
         * error line, which this reader has already said. */
        return str;
    }
    p->key_line = true;
    return str;
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    struct parse *p = user;
    (void)section; /* ours, from header(), is the one that counts */
    p->handled = true;
    if (p->h->pair)
        p->h->pair(p->h->ctx, p->line, name, value);
    return 1;
}

/* The whole file, if it is a regular file of at most GG_INIFILE_MAX_BYTES. */
static char *slurp(const char *path, size_t *len, size_t *mapped, char *why, size_t cap)
{
    /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    if (fd < 0) {
        snprintf(why, cap, "cannot open policy file: %s", strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0) {
        snprintf(why, cap, "cannot read policy file: %s", strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        snprintf(why, cap, "is a directory, not a policy file");
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, cap, "not a regular file (a FIFO, socket or device); not read");
    } else if ((uint64_t)st.st_size > GG_INIFILE_MAX_BYTES) {
        snprintf(why, cap, "%lld bytes, larger than a policy file may be (%u); not read",
                 (long long)st.st_size, GG_INIFILE_MAX_BYTES);
    } else {
        *mapped = (size_t)st.st_size + 1;
        buf = gg_pages(*mapped);
        if (!buf)
            snprintf(why, cap, "out of memory reading the file");
    }
    size_t got = 0;
    while (buf && got < *mapped - 1) {
        ssize_t n = read(fd, buf + got, *mapped - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, cap, "read error: %s", strerror(errno));
            gg_pages_free(buf, *mapped);
            buf = NULL;
            break;
        }
        if (n == 0)
            break; /* shrank while read: parse what is there */
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return buf;
}

int gg_inifile_parse(const char *path, const struct gg_inifile_handler *h, char *why, size_t cap)
{
    size_t len = 0, mapped = 0;
    char *buf = slurp(path, &len, &mapped, why, cap);
    if (!buf)
        return -1;
    struct parse p = {.h = h, .buf = buf, .end = buf + len, .pos = buf};
    int rc = ini_parse_stream(reader, &p, handler, &p);
    line_done(&p);
    if (rc == -2)
        problem(&p, 0, "out of memory while parsing");
    else if (rc > 0 && p.problems == 0)
        problem(&p, rc, "cannot parse line");
    gg_pages_free(buf, mapped);
    return 0;
}
