/* size.h - the test programs' one size syntax: "1G", "1.5G", "512M",
 * "4096", "2KiB" (binary multiples; a plain number is itself). C and C++
 * (nvccprog.cu includes it through rtcmds.h). */
#ifndef GG_TEST_SIZE_H
#define GG_TEST_SIZE_H

#include <stddef.h>
#include <stdlib.h>

/* 0 and *out set, or -1 for anything else. */
static int prog_parse_size(const char *str, size_t *out)
{
    char *end;
    if (*str < '0' || *str > '9')
        return -1;
    unsigned long long ip = strtoull(str, &end, 10);
    long double frac = 0;
    if (*end == '.') {
        long double scale = 0.1L;
        for (end++; *end >= '0' && *end <= '9'; end++, scale /= 10)
            frac += (*end - '0') * scale;
    }
    unsigned long long mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1ULL << 10; end++; break;
    case 'm': case 'M': mult = 1ULL << 20; end++; break;
    case 'g': case 'G': mult = 1ULL << 30; end++; break;
    case 't': case 'T': mult = 1ULL << 40; end++; break;
    default: break;
    }
    if (mult > 1 && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end)
        return -1;
    *out = (size_t)(ip * mult + (unsigned long long)(frac * mult + 0.5L));
    return 0;
}

#endif /* GG_TEST_SIZE_H */
