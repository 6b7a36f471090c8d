/* test_inifile.c - an INI file through inih with exact lines (inifile.c):
 * pairs, headers and problems in line order; only small regular files. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inifile.h"
#include "unit.h"

static char seen[4096];

static void add(const char *fmt, int line, const char *a, const char *b)
{
    size_t n = strlen(seen);
    snprintf(seen + n, sizeof seen - n, fmt, line, a, b);
}

static void on_section(void *ctx, int line, const char *name)
{
    (void)ctx;
    add("%d[%s]%s;", line, name ? name : "?", "");
}

static void on_pair(void *ctx, int line, const char *key, const char *value)
{
    (void)ctx;
    add("%d:%s=%s;", line, key, value);
}

static void on_problem(void *ctx, int line, const char *msg)
{
    (void)ctx;
    add("%d!%s%s;", line, msg, "");
}

static const struct gg_inifile_handler handler = {on_section, on_pair, on_problem, NULL};

static int parse_bytes(const char *text, size_t len, char *why)
{
    char path[] = "/tmp/gg_ini_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, text, len) != (ssize_t)len)
        return -2;
    close(fd);
    seen[0] = '\0';
    int rc = gg_inifile_parse(path, &handler, why, 256);
    unlink(path);
    return rc;
}

static int parse_text(const char *text, char *why)
{
    return parse_bytes(text, strlen(text), why);
}

static void test_lines(void)
{
    char why[256];
    CHECK(parse_text("\xEF\xBB\xBF; c\n[gpu]\n  match = A*  ; inline\n\n[memory]\nx=1\n", why) ==
          0);
    CHECK_STR(seen, "2[gpu];3:match=A*;5[memory];6:x=1;");
    CHECK(parse_text("[memory\nnoequals\n[a] junk\n", why) == 0);
    CHECK(strstr(seen, "1!malformed section header '[memory' (expected [name])") != NULL);
    CHECK(strstr(seen, "2!cannot parse 'noequals'") != NULL);
    CHECK(strstr(seen, "3!unexpected text after [a]: 'junk'") != NULL);
    char longline[400];
    memset(longline, 'k', sizeof longline);
    memcpy(longline + sizeof longline - 4, "=1\n", 4);
    CHECK(parse_text(longline, why) == 0);
    if (!strstr(seen, "1!line too long (398 characters, at most 199)"))
        printf("  seen: %s\n", seen);
    CHECK(strstr(seen, "1!line too long (398 characters, at most 199)") != NULL);
    static const char nul[] = "[gpu]\nmatch = A\0B\nx = 1\n";
    CHECK(parse_bytes(nul, sizeof nul - 1, why) == 0);
    CHECK(strstr(seen, "2!line contains a NUL byte") != NULL);
    CHECK(strstr(seen, "3:x=1") != NULL);
}

static void test_not_a_small_regular_file(void)
{
    char why[256];
    CHECK(gg_inifile_parse("/nonexistent/policy.ini", &handler, why, sizeof why) == -1);
    CHECK(strstr(why, "cannot open policy file") != NULL);
    CHECK(gg_inifile_parse("/tmp", &handler, why, sizeof why) == -1);
    CHECK_STR(why, "is a directory, not a policy file");
    /* /dev/zero would be read without end, a FIFO would block the first
     * cudaMalloc forever: neither is read */
    CHECK(gg_inifile_parse("/dev/zero", &handler, why, sizeof why) == -1);
    CHECK(strstr(why, "not a regular file") != NULL);
    char fifo[] = "/tmp/gg_ini_fifo_XXXXXX";
    int fd = mkstemp(fifo);
    close(fd);
    unlink(fifo);
    CHECK(mkfifo(fifo, 0600) == 0);
    CHECK(gg_inifile_parse(fifo, &handler, why, sizeof why) == -1);
    CHECK(strstr(why, "not a regular file") != NULL);
    unlink(fifo);
    /* too big */
    char big[] = "/tmp/gg_ini_big_XXXXXX";
    fd = mkstemp(big);
    CHECK(ftruncate(fd, GG_INIFILE_MAX_BYTES + 1) == 0);
    close(fd);
    CHECK(gg_inifile_parse(big, &handler, why, sizeof why) == -1);
    CHECK(strstr(why, "larger than a policy file may be") != NULL);
    unlink(big);
}

int main(void)
{
    RUN(test_lines);
    RUN(test_not_a_small_regular_file);
    return unit_done();
}
