/* test_fatbin.c - the fat-binary reader and the rule (shim/base/fatbin.h), on
 * libraries built here by the real nvcc (tests/arch/arch.mk, in
 * $GG_BUILD/arch) and on hand-made, corrupt and truncated input. */
#include "fatbin.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "unit.h"

/* ---- building input by hand --------------------------------------------- */

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    put16(p, (uint16_t)v);
    put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

struct ent {
    uint16_t kind;
    uint32_t arch;
    uint64_t flags;
    uint32_t hsize; /* 0: 64 */
    uint64_t psize;
};

#define SASS(a) {2, a, 0x11, 0, 1000}
#define PTX(a) {1, a, 0x8011, 80, 24}

/* One fat binary at buf, as nvcc lays it out; returns its size. */
static size_t put_fatbin(uint8_t *buf, const struct ent *e, int n)
{
    size_t off = 16;
    for (int i = 0; i < n; i++) {
        uint32_t hs = e[i].hsize ? e[i].hsize : 64;
        memset(buf + off, 0, hs);
        put16(buf + off, e[i].kind);
        put16(buf + off + 2, 0x0101);
        put32(buf + off + 4, hs);
        put64(buf + off + 8, e[i].psize);
        put32(buf + off + 0x1c, e[i].arch);
        put64(buf + off + 0x28, e[i].flags);
        memset(buf + off + hs, 0xAB, e[i].psize); /* the payload: never read */
        off += hs + e[i].psize;
    }
    put32(buf, GG_FATBIN_MAGIC);
    put16(buf + 4, 1);
    put16(buf + 6, 16);
    put64(buf + 8, off - 16);
    return off;
}

static bool has(const struct gg_fatbin *fb, int kind, int arch, int variant)
{
    for (unsigned i = 0; i < fb->ncode; i++)
        if (fb->code[i].kind == kind && fb->code[i].arch == arch &&
            fb->code[i].variant == variant)
            return true;
    return false;
}

static const char *describe(const struct gg_fatbin *fb)
{
    static char buf[512];
    gg_fatbin_describe(fb, buf, sizeof buf);
    return buf;
}

struct sec {
    const char *name;
    uint32_t type; /* 1 PROGBITS, 8 NOBITS */
    uint64_t addr;
    const void *data;
    size_t size;
};

/* A minimal 64-bit LE ELF file: header, section contents, names, section
 * headers (null, the sections, .shstrtab). Returns its size. */
static size_t put_elf(uint8_t *buf, const struct sec *s, int n)
{
    size_t off = 64, name_off[16], data_off[16];
    memset(buf, 0, 64);
    memcpy(buf, "\177ELF\2\1\1", 7);
    for (int i = 0; i < n; i++) {
        off = (off + 7) & ~(size_t)7;
        data_off[i] = off;
        memcpy(buf + off, s[i].data, s[i].size);
        off += s[i].size;
    }
    size_t strtab = off, slen = 1;
    buf[off] = 0;
    for (int i = 0; i < n; i++) {
        name_off[i] = slen;
        memcpy(buf + strtab + slen, s[i].name, strlen(s[i].name) + 1);
        slen += strlen(s[i].name) + 1;
    }
    memcpy(buf + strtab + slen, ".shstrtab", 10);
    size_t strtab_name = slen;
    slen += 10;
    off = (strtab + slen + 7) & ~(size_t)7;
    size_t shoff = off;
    memset(buf + shoff, 0, 64 * (size_t)(n + 2));
    for (int i = 0; i < n; i++) {
        uint8_t *h = buf + shoff + 64 * (size_t)(i + 1);
        put32(h, (uint32_t)name_off[i]);
        put32(h + 4, s[i].type);
        put64(h + 0x10, s[i].addr);
        put64(h + 0x18, data_off[i]);
        put64(h + 0x20, s[i].size);
    }
    uint8_t *h = buf + shoff + 64 * (size_t)(n + 1);
    put32(h, (uint32_t)strtab_name);
    put32(h + 4, 3);
    put64(h + 0x18, strtab);
    put64(h + 0x20, slen);
    put64(buf + 0x28, shoff);
    put16(buf + 0x3a, 64);
    put16(buf + 0x3c, (uint16_t)(n + 2));
    put16(buf + 0x3e, (uint16_t)(n + 1));
    return shoff + 64 * (size_t)(n + 2);
}

/* A registration wrapper {magic, version, data, 0} at buf. */
static void put_wrapper(uint8_t *buf, uint32_t version, uint64_t data)
{
    memset(buf, 0, 24);
    put32(buf, GG_FATBIN_WRAPPER_MAGIC);
    put32(buf + 4, version);
    put64(buf + 8, data);
}

static char tmp_path[64];

static int read_bytes_as_file(const uint8_t *buf, size_t len, struct gg_fatbin *fb)
{
    strcpy(tmp_path, "/tmp/gg-test-fatbin-XXXXXX");
    int fd = mkstemp(tmp_path);
    CHECK(fd >= 0);
    CHECK(write(fd, buf, len) == (ssize_t)len);
    close(fd);
    gg_fatbin_init(fb);
    int r = gg_fatbin_read_file(fb, tmp_path);
    unlink(tmp_path);
    return r;
}

/* ---- the rule -------------------------------------------------------------- */

static struct gg_fatbin_code code(int kind, int arch, int variant)
{
    return (struct gg_fatbin_code){.kind = (uint8_t)kind, .variant = (uint8_t)variant,
                                   .arch = (uint16_t)arch};
}

static void test_rule(void)
{
    static const int ccs[][2] = {{7, 5}, {8, 0}, {8, 6}, {8, 7}, {8, 9}, {9, 0},
                                 {10, 0}, {10, 3}, {11, 0}, {12, 0}, {12, 1}};
    static const struct {
        int kind, arch, variant;
        const char *runs; /* one letter per cc above: y runs, n does not */
    } cases[] = {
        {GG_FATBIN_SASS, 75, 0, "ynnnnnnnnnn"},  {GG_FATBIN_SASS, 80, 0, "nyyyynnnnnn"},
        {GG_FATBIN_SASS, 86, 0, "nnyyynnnnnn"},  {GG_FATBIN_SASS, 89, 0, "nnnnynnnnnn"},
        {GG_FATBIN_SASS, 90, 0, "nnnnnynnnnn"},  {GG_FATBIN_SASS, 100, 0, "nnnnnnyynnn"},
        {GG_FATBIN_SASS, 120, 0, "nnnnnnnnnyy"}, {GG_FATBIN_SASS, 121, 0, "nnnnnnnnnny"},
        {GG_FATBIN_PTX, 75, 0, "yyyyyyyyyyy"},   {GG_FATBIN_PTX, 80, 0, "nyyyyyyyyyy"},
        {GG_FATBIN_PTX, 90, 0, "nnnnnyyyyyy"},   {GG_FATBIN_PTX, 120, 0, "nnnnnnnnnyy"},
        /* arch-specific: that arch only, SASS or PTX */
        {GG_FATBIN_SASS, 90, 1, "nnnnnynnnnn"},  {GG_FATBIN_PTX, 90, 1, "nnnnnynnnnn"},
        {GG_FATBIN_SASS, 120, 1, "nnnnnnnnnyn"}, {GG_FATBIN_SASS, 100, 1, "nnnnnnynnnn"},
        /* family-specific: same major, minor <= the GPU's, SASS or PTX */
        {GG_FATBIN_SASS, 100, 2, "nnnnnnyynnn"}, {GG_FATBIN_PTX, 100, 2, "nnnnnnyynnn"},
        {GG_FATBIN_SASS, 103, 2, "nnnnnnnynnn"}, {GG_FATBIN_PTX, 120, 2, "nnnnnnnnnyy"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t k = 0; k < sizeof ccs / sizeof ccs[0]; k++) {
            bool want = cases[c].runs[k] == 'y';
            bool got = gg_fatbin_runs(code(cases[c].kind, cases[c].arch, cases[c].variant),
                                      ccs[k][0], ccs[k][1]);
            if (want != got)
                printf("  kind %d arch %d variant %d on %d.%d: want %d\n", cases[c].kind,
                       cases[c].arch, cases[c].variant, ccs[k][0], ccs[k][1], want);
            CHECK(want == got);
        }
    CHECK(!gg_fatbin_runs(code(GG_FATBIN_SASS, 80, 0), 8, 10)); /* no such minor */
    CHECK(!gg_fatbin_runs(code(3, 80, 0), 8, 0));                /* not SASS or PTX */
}

static void test_judge_picks_what_the_driver_picks(void)
{
    struct gg_fatbin fb;
    struct gg_fatbin_verdict v;
    char name[32];
    gg_fatbin_init(&fb);
    fb.code[fb.ncode++] = code(GG_FATBIN_SASS, 75, 0);
    fb.code[fb.ncode++] = code(GG_FATBIN_SASS, 86, 0);
    fb.code[fb.ncode++] = code(GG_FATBIN_SASS, 80, 0);
    fb.code[fb.ncode++] = code(GG_FATBIN_PTX, 86, 0);
    gg_fatbin_judge(&fb, 8, 9, &v); /* newest SASS that runs */
    CHECK(v.ok && v.any_code);
    gg_fatbin_code_name(v.used, name, sizeof name);
    CHECK_STR(name, "sm_86");
    gg_fatbin_judge(&fb, 8, 0, &v);
    gg_fatbin_code_name(v.used, name, sizeof name);
    CHECK_STR(name, "sm_80");
    gg_fatbin_judge(&fb, 12, 0, &v); /* no SASS: the PTX, by JIT */
    CHECK(v.ok);
    gg_fatbin_code_name(v.used, name, sizeof name);
    CHECK_STR(name, "compute_86");
    fb.ncode = 3; /* without the PTX */
    gg_fatbin_judge(&fb, 12, 0, &v);
    CHECK(!v.ok && v.any_code && v.used.kind == 0);
    gg_fatbin_judge(&fb, 7, 5, &v);
    CHECK(v.ok);
    gg_fatbin_init(&fb);
    gg_fatbin_judge(&fb, 8, 6, &v);
    CHECK(!v.ok && !v.any_code);
}

static void test_names_and_description(void)
{
    char name[32];
    gg_fatbin_code_name(code(GG_FATBIN_SASS, 90, GG_FATBIN_ARCH_SPECIFIC), name, sizeof name);
    CHECK_STR(name, "sm_90a");
    gg_fatbin_code_name(code(GG_FATBIN_PTX, 100, GG_FATBIN_FAMILY), name, sizeof name);
    CHECK_STR(name, "compute_100f");
    struct gg_fatbin fb;
    gg_fatbin_init(&fb);
    CHECK_STR(describe(&fb), "no device code");
    fb.code[fb.ncode++] = code(GG_FATBIN_PTX, 80, 0);
    CHECK_STR(describe(&fb), "PTX compute_80, no SASS");
    fb.code[fb.ncode++] = code(GG_FATBIN_SASS, 90, 0);
    fb.code[fb.ncode++] = code(GG_FATBIN_SASS, 75, 0);
    CHECK_STR(describe(&fb), "SASS sm_75 sm_90, PTX compute_80");
    fb.ncode = 0;
    fb.code[fb.ncode++] = code(GG_FATBIN_SASS, 80, 0);
    CHECK_STR(describe(&fb), "SASS sm_80, no PTX");
    char small[8];
    gg_fatbin_describe(&fb, small, sizeof small); /* cut, terminated */
    CHECK_STR(small, "SASS sm");
    CHECK(strstr(gg_fatbin_torch_fix(12, 0), "2.7") && strstr(gg_fatbin_torch_fix(12, 0), "12.8"));
    CHECK(strstr(gg_fatbin_torch_fix(6, 1), "cu126") != NULL);
}

/* ---- fat binaries in memory -------------------------------------------------- */

static void test_parse_hand_made(void)
{
    static uint8_t buf[16384];
    struct ent a[] = {SASS(75), SASS(86), {2, 90, 0x100011, 64, 40} /* sm_90a */, PTX(86),
                      {1, 100, 0x208011, 112, 16} /* compute_100f */, {4, 80, 0, 64, 8}};
    struct ent b[] = {{2, 120, 0x1000011, 96, 30} /* sm_120, 96-byte header */, SASS(86)};
    size_t n = put_fatbin(buf, a, 6);
    memset(buf + n, 0, 8); /* alignment padding between fat binaries */
    n += 8;
    uint8_t *empty = buf + n;
    n += put_fatbin(empty, NULL, 0); /* an empty one, as nvcc writes for PTX-only code */
    n += put_fatbin(buf + n, b, 2);
    struct gg_fatbin fb;
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_parse(&fb, buf, n), GG_FATBIN_OK);
    CHECK_EQ_U64(fb.fatbins, 2);  /* the empty one carries nothing */
    CHECK_EQ_U64(fb.entries, 8);
    CHECK_EQ_U64(fb.unknown, 1);  /* kind 4 */
    CHECK_EQ_U64(fb.ncode, 6);    /* sm_86 twice is one code */
    CHECK(has(&fb, GG_FATBIN_SASS, 75, 0) && has(&fb, GG_FATBIN_SASS, 86, 0));
    CHECK(has(&fb, GG_FATBIN_SASS, 90, GG_FATBIN_ARCH_SPECIFIC));
    CHECK(has(&fb, GG_FATBIN_PTX, 86, 0) && has(&fb, GG_FATBIN_PTX, 100, GG_FATBIN_FAMILY));
    CHECK(has(&fb, GG_FATBIN_SASS, 120, 0));
    CHECK_STR(describe(&fb), "SASS sm_75 sm_86 sm_90a sm_120, PTX compute_86 compute_100f");
    CHECK(fb.bytes_read < n / 4); /* headers only, never payloads */
}

static void test_parse_corrupt(void)
{
    static uint8_t buf[4096];
    struct ent a[] = {SASS(80), PTX(80)};
    struct gg_fatbin fb;
    size_t n = put_fatbin(buf, a, 2);
    static uint8_t bad[4096];

#define PARSE_AS(err_)                                      \
    do {                                                    \
        gg_fatbin_init(&fb);                                \
        CHECK_EQ_U64(gg_fatbin_parse(&fb, bad, n), err_);   \
    } while (0)

    memcpy(bad, buf, n);
    put32(bad, 0x12345678);
    PARSE_AS(GG_FATBIN_EMAGIC);
    CHECK_EQ_U64(fb.err_off, 0);
    memcpy(bad, buf, n);
    put16(bad + 4, 2); /* a version this reader does not know */
    PARSE_AS(GG_FATBIN_EHEADER);
    memcpy(bad, buf, n);
    put16(bad + 6, 8); /* header smaller than a header */
    PARSE_AS(GG_FATBIN_EHEADER);
    memcpy(bad, buf, n);
    put64(bad + 8, n); /* says more than there is */
    PARSE_AS(GG_FATBIN_ETRUNC);
    memcpy(bad, buf, n);
    put64(bad + 8, UINT64_MAX - 4); /* and overflows */
    PARSE_AS(GG_FATBIN_ETRUNC);
    memcpy(bad, buf, n);
    put32(bad + 16 + 4, 16); /* entry header smaller than its fields */
    PARSE_AS(GG_FATBIN_EHEADER);
    CHECK_EQ_U64(fb.err_off, 16);
    memcpy(bad, buf, n);
    put32(bad + 16 + 4, 0xFFFFFFF0u); /* entry header past the end */
    PARSE_AS(GG_FATBIN_ETRUNC);
    memcpy(bad, buf, n);
    put64(bad + 16 + 8, UINT64_MAX); /* payload past the end, overflowing */
    PARSE_AS(GG_FATBIN_ETRUNC);
    memcpy(bad, buf, n);
    put32(bad + 16 + 0x1c, 0); /* sm_0 */
    PARSE_AS(GG_FATBIN_EHEADER);
    memcpy(bad, buf, n);
    bad[n - 1] = 0;
    memset(bad + n, 0x55, 8); /* garbage after the last fat binary */
    n += 8;
    PARSE_AS(GG_FATBIN_EMAGIC);
    CHECK_EQ_U64(fb.ncode, 2); /* what came before is kept */
    n -= 8;
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_parse(&fb, NULL, 10), GG_FATBIN_ETRUNC);
#undef PARSE_AS
}

/* Every length of a section cut short: an error or a clean stop, never a
 * read past the cut (ASan would say so), never a code that is not there. */
static void every_truncation(const uint8_t *sec, size_t size, const struct gg_fatbin *full)
{
    for (size_t len = 0; len < size; len++) {
        uint8_t *exact = malloc(len ? len : 1); /* exactly len bytes: ASan guards the end */
        memcpy(exact, sec, len);
        struct gg_fatbin fb;
        gg_fatbin_init(&fb);
        int r = gg_fatbin_parse(&fb, exact, len);
        CHECK(r == GG_FATBIN_OK || r == GG_FATBIN_ETRUNC);
        for (unsigned i = 0; i < fb.ncode; i++)
            CHECK(has(full, fb.code[i].kind, fb.code[i].arch, fb.code[i].variant));
        free(exact);
    }
}

/* Random bytes flipped: any verdict, no crash, sane codes. */
static void byte_flips(const uint8_t *sec, size_t size, unsigned rounds)
{
    uint8_t *copy = malloc(size);
    unsigned seed = 12345;
    for (unsigned k = 0; k < rounds; k++) {
        memcpy(copy, sec, size);
        for (int f = 0; f < 1 + (int)(k % 4); f++) {
            seed = seed * 1103515245u + 12345u;
            copy[(seed >> 8) % size] ^= (uint8_t)(1u << ((seed >> 4) & 7));
        }
        struct gg_fatbin fb;
        gg_fatbin_init(&fb);
        gg_fatbin_parse(&fb, copy, size);
        for (unsigned i = 0; i < fb.ncode; i++)
            CHECK(fb.code[i].arch >= 10 && fb.code[i].arch <= 999);
    }
    free(copy);
}

static void test_truncated_and_flipped_hand_made(void)
{
    static uint8_t buf[8192];
    struct ent a[] = {SASS(80), PTX(80), {2, 120, 0x1000011, 112, 24}};
    size_t n = put_fatbin(buf, a, 3);
    n += put_fatbin(buf + n, a, 2);
    struct gg_fatbin full;
    gg_fatbin_init(&full);
    CHECK_EQ_U64(gg_fatbin_parse(&full, buf, n), GG_FATBIN_OK);
    every_truncation(buf, n, &full);
    byte_flips(buf, n, 2000);
}

static void test_wrappers(void)
{
    static uint8_t mem[8192] __attribute__((aligned(8)));
    struct ent a[] = {SASS(80)}, b[] = {PTX(90)}, c[] = {SASS(75)};
    size_t fa = 512, fb_ = 2048, fc = 4096;
    put_fatbin(mem + fa, a, 1);
    put_fatbin(mem + fb_, b, 1);
    put_fatbin(mem + fc, c, 1);
    put_wrapper(mem + 0, 1, (uintptr_t)(mem + fa));
    put_wrapper(mem + 24, 2, (uintptr_t)(mem + fb_));
    put_wrapper(mem + 48, 1, (uintptr_t)mem + (1u << 22)); /* points outside: skipped */
    put_wrapper(mem + 72, 1, (uintptr_t)(mem + fc));
    const void *data;
    CHECK_EQ_U64(gg_fatbin_wrapper_data(mem, 24, &data), GG_FATBIN_OK);
    CHECK(data == mem + fa);
    CHECK_EQ_U64(gg_fatbin_wrapper_data(mem, 23, &data), GG_FATBIN_ETRUNC);
    CHECK_EQ_U64(gg_fatbin_wrapper_data(mem + fa, 24, &data), GG_FATBIN_EWRAPPER);

    struct gg_fatbin fb;
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_parse_one(&fb, mem + fa, 1500), GG_FATBIN_OK);
    CHECK(has(&fb, GG_FATBIN_SASS, 80, 0));
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_parse_one(&fb, mem + fa, 60), GG_FATBIN_ETRUNC); /* mapping ends */

    struct gg_fatbin_range r = {(uintptr_t)mem, (uintptr_t)mem + sizeof mem};
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_parse_wrappers(&fb, mem, mem + 72, &r, 1), GG_FATBIN_OK);
    CHECK_EQ_U64(fb.fatbins, 3); /* the one pointing outside is not read */
    CHECK(has(&fb, GG_FATBIN_SASS, 80, 0) && has(&fb, GG_FATBIN_PTX, 90, 0) &&
          has(&fb, GG_FATBIN_SASS, 75, 0));
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_parse_wrappers(&fb, mem + 1, mem + 72, &r, 1), GG_FATBIN_EWRAPPER);
    /* A range that ends inside the last fat binary: it is cut short. */
    r.hi = (uintptr_t)mem + fc + 40;
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_parse_wrappers(&fb, mem, mem + 72, &r, 1), GG_FATBIN_ETRUNC);
}

/* ---- ELF files ------------------------------------------------------------------ */

static void test_elf_sections_and_stubs(void)
{
    static uint8_t fat[4096], seg[96], file[16384];
    struct ent code80[] = {SASS(80)}, stub75[] = {SASS(75)};
    size_t a = put_fatbin(fat, code80, 1);
    size_t b = put_fatbin(fat + a, stub75, 1);
    uint64_t addr = 0x10000;
    struct gg_fatbin fb;
    struct sec s[] = {
        {".text", 1, 0x1000, "\x90\x90", 2},
        {".nv_fatbin", 1, addr, fat, a + b},
        {".nvFatBinSegment", 1, 0x20000, seg, 48},
    };
    /* whole-program code (version 1) and nvcc's device-link stub (version 2) */
    put_wrapper(seg, 2, addr + a);
    put_wrapper(seg + 24, 1, addr);
    CHECK_EQ_U64(read_bytes_as_file(file, put_elf(file, s, 3), &fb), GG_FATBIN_OK);
    CHECK_STR(describe(&fb), "SASS sm_80, no PTX");
    CHECK_EQ_U64(fb.stubs, 1);
    /* -rdc code too (a version-1 wrapper into __nv_relfatbin): the version-2
     * target is linked code, not a stub */
    put_wrapper(seg + 48, 1, 0x30000);
    s[2].size = 72;
    CHECK_EQ_U64(read_bytes_as_file(file, put_elf(file, s, 3), &fb), GG_FATBIN_OK);
    CHECK_STR(describe(&fb), "SASS sm_75 sm_80, no PTX");
    CHECK_EQ_U64(fb.stubs, 0);
    /* a pointer the linker left 0 proves nothing: nothing is skipped */
    put_wrapper(seg + 48, 1, 0);
    CHECK_EQ_U64(read_bytes_as_file(file, put_elf(file, s, 3), &fb), GG_FATBIN_OK);
    CHECK_EQ_U64(fb.stubs, 0);
    /* no wrappers at all: the runtime registers none of it (cuFFT) */
    CHECK_EQ_U64(read_bytes_as_file(file, put_elf(file, s, 2), &fb), GG_FATBIN_UNREGISTERED);
    CHECK_EQ_U64(fb.ncode, 0);
    /* no .nv_fatbin */
    CHECK_EQ_U64(read_bytes_as_file(file, put_elf(file, s, 1), &fb), GG_FATBIN_NONE);
}

static void test_elf_corrupt(void)
{
    static uint8_t fat[2048], seg[24], file[8192], bad[8192];
    struct ent code80[] = {SASS(80)};
    size_t a = put_fatbin(fat, code80, 1);
    put_wrapper(seg, 1, 0x10000);
    struct sec s[] = {{".nv_fatbin", 1, 0x10000, fat, a}, {".nvFatBinSegment", 1, 0x20000, seg, 24}};
    size_t n = put_elf(file, s, 2);
    struct gg_fatbin fb;
    uint64_t shoff = 0;
    for (int i = 0; i < 8; i++)
        shoff |= (uint64_t)file[0x28 + i] << (8 * i);
    CHECK_EQ_U64(read_bytes_as_file(file, n, &fb), GG_FATBIN_OK);

#define READ_AS(err_)                                              \
    do {                                                           \
        CHECK_EQ_U64(read_bytes_as_file(bad, n, &fb), err_);       \
    } while (0)

    memcpy(bad, file, n);
    bad[4] = 1; /* 32-bit */
    READ_AS(GG_FATBIN_ENOTELF);
    memcpy(bad, file, n);
    bad[5] = 2; /* big-endian */
    READ_AS(GG_FATBIN_ENOTELF);
    CHECK_EQ_U64(read_bytes_as_file((const uint8_t *)"#!/bin/sh\necho hi\n", 18, &fb),
                 GG_FATBIN_ENOTELF);
    memcpy(bad, file, n);
    put64(bad + 0x28, 0); /* no section headers */
    READ_AS(GG_FATBIN_NONE);
    memcpy(bad, file, n);
    put64(bad + 0x28, n + 100); /* past the end */
    READ_AS(GG_FATBIN_EELF);
    memcpy(bad, file, n);
    put16(bad + 0x3a, 32); /* entries smaller than a section header */
    READ_AS(GG_FATBIN_EELF);
    memcpy(bad, file, n);
    put16(bad + 0x3c, 0xFFF0); /* more sections than the file holds */
    READ_AS(GG_FATBIN_EELF);
    memcpy(bad, file, n);
    put16(bad + 0x3e, 9); /* names in a section that does not exist */
    READ_AS(GG_FATBIN_EELF);
    memcpy(bad, file, n);
    put64(bad + shoff + 64 + 0x18, n - 8); /* .nv_fatbin runs past the end */
    READ_AS(GG_FATBIN_EELF);
    memcpy(bad, file, n);
    put32(bad + shoff + 64 + 4, 8); /* .nv_fatbin without contents (NOBITS) */
    READ_AS(GG_FATBIN_EELF);
    memcpy(bad, file, n);
    put64(bad + shoff + 3 * 64 + 0x20, 1u << 20); /* names past the end */
    READ_AS(GG_FATBIN_EELF);
    memcpy(bad, file, n);
    put32(bad + shoff + 64, 0xFFFFFF); /* a name offset past the names: not ours */
    READ_AS(GG_FATBIN_NONE);
    /* extended numbering: the count in section 0, the names' index in its link */
    memcpy(bad, file, n);
    put16(bad + 0x3c, 0);
    put16(bad + 0x3e, 0xffff);
    put64(bad + shoff + 0x20, 4);
    put32(bad + shoff + 0x28, 3);
    READ_AS(GG_FATBIN_OK);
    CHECK_STR(describe(&fb), "SASS sm_80, no PTX");
#undef READ_AS

    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_read_file(&fb, "/nonexistent/libnothing.so"), GG_FATBIN_EOPEN);
    gg_fatbin_init(&fb);
    CHECK_EQ_U64(gg_fatbin_read_file(&fb, "/tmp"), GG_FATBIN_EOPEN);
    CHECK(strstr(gg_fatbin_strerror(GG_FATBIN_ETRUNC), "truncated") != NULL);
}

/* ---- libraries built by nvcc --------------------------------------------------- */

static char arch_dir[512];

static bool nvcc_built(void)
{
    const char *b = getenv("GG_BUILD");
    snprintf(arch_dir, sizeof arch_dir, "%s/arch", b ? b : "build");
    char probe[600];
    snprintf(probe, sizeof probe, "%s/libarch_sass80.so", arch_dir);
    return access(probe, R_OK) == 0;
}

static int read_lib(const char *name, struct gg_fatbin *fb)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", arch_dir, name);
    gg_fatbin_init(fb);
    return gg_fatbin_read_file(fb, path);
}

static void test_nvcc_libraries(void)
{
    static const struct {
        const char *lib, *carries;
        unsigned stubs;
    } libs[] = {
        {"libarch_sass80.so", "SASS sm_80, no PTX", 1},
        {"libarch_sass80_shared.so", "SASS sm_80, no PTX", 1},
        {"libarch_ptx80.so", "PTX compute_80, no SASS", 1}, /* its stub is empty */
        {"libarch_ptx80_shared.so", "PTX compute_80, no SASS", 1},
        {"libarch_multi.so", "SASS sm_75 sm_86 sm_90, no PTX", 1}, /* compressed */
        {"libarch_multi_shared.so", "SASS sm_75 sm_86 sm_90, no PTX", 1},
        {"libarch_sm90a.so", "SASS sm_90a, no PTX", 1},
        {"libarch_sm90a_shared.so", "SASS sm_90a, no PTX", 1},
        {"libarch_sm120.so", "SASS sm_120, no PTX", 1},
        {"libarch_sm120_shared.so", "SASS sm_120, no PTX", 1},
        /* linked without arch flags: the stub is sm_75 and must not count */
        {"libarch_sass80_dlink.so", "SASS sm_80, no PTX", 1},
        /* -rdc: the device-link output is the code */
        {"libarch_rdc80.so", "SASS sm_80, no PTX", 0},
    };
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        struct gg_fatbin fb;
        int r = read_lib(libs[i].lib, &fb);
        if (r != GG_FATBIN_OK || strcmp(describe(&fb), libs[i].carries) || fb.stubs != libs[i].stubs)
            printf("  %s: %s, %s, %llu stubs\n", libs[i].lib, gg_fatbin_strerror(r), describe(&fb),
                   (unsigned long long)fb.stubs);
        CHECK_EQ_U64(r, GG_FATBIN_OK);
        CHECK_STR(describe(&fb), libs[i].carries);
        CHECK_EQ_U64(fb.stubs, libs[i].stubs);
        CHECK(fb.bytes_read < 64 * 1024); /* the headers, not the megabyte of runtime */
    }
    struct gg_fatbin fb;
    read_lib("libarch_sm90a.so", &fb);
    CHECK(has(&fb, GG_FATBIN_SASS, 90, GG_FATBIN_ARCH_SPECIFIC));
    struct gg_fatbin_verdict v;
    gg_fatbin_judge(&fb, 9, 0, &v);
    CHECK(v.ok);
    gg_fatbin_judge(&fb, 10, 0, &v);
    CHECK(!v.ok);
}

static uint64_t get(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The .nv_fatbin section of a real library, into memory. */
static uint8_t *real_section(const char *name, size_t *size)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", arch_dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *all = malloc((size_t)len), *sec = NULL;
    if (fread(all, 1, (size_t)len, f) == (size_t)len) {
        const uint8_t *sh = all + get(all + 0x28, 8);
        uint64_t shnum = get(all + 0x3c, 2), names = get(sh + 64 * get(all + 0x3e, 2) + 0x18, 8);
        for (uint64_t i = 0; i < shnum && !sec; i++) {
            const uint8_t *h = sh + 64 * i;
            if (strcmp((const char *)all + names + get(h, 4), ".nv_fatbin"))
                continue;
            *size = get(h + 0x20, 8);
            sec = malloc(*size);
            memcpy(sec, all + get(h + 0x18, 8), *size);
        }
    }
    free(all);
    fclose(f);
    return sec;
}

static void test_real_section_truncated_and_flipped(void)
{
    size_t size = 0;
    uint8_t *sec = real_section("libarch_multi.so", &size);
    CHECK(sec != NULL && size > 100);
    if (!sec)
        return;
    struct gg_fatbin full;
    gg_fatbin_init(&full);
    CHECK_EQ_U64(gg_fatbin_parse(&full, sec, size), GG_FATBIN_OK);
    CHECK_EQ_U64(full.fatbins, 2); /* the whole section: the stub is only skipped by files */
    every_truncation(sec, size, &full);
    byte_flips(sec, size, 3000);
    free(sec);
}

/* The file cut at every length, shortest last: ELF headers, section table,
 * names, wrappers and fat binaries all cut somewhere. */
static void test_real_file_truncated(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/libarch_sass80_shared.so", arch_dir);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *all = malloc((size_t)len);
    CHECK(fread(all, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    strcpy(tmp_path, "/tmp/gg-test-fatbin-XXXXXX");
    int fd = mkstemp(tmp_path);
    CHECK(fd >= 0 && write(fd, all, (size_t)len) == len);
    unsigned ok = 0, errors = 0;
    for (long cut = len; cut >= 0; cut--) {
        CHECK(ftruncate(fd, cut) == 0);
        struct gg_fatbin fb;
        gg_fatbin_init(&fb);
        int r = gg_fatbin_read_fd(&fb, fd);
        if (r == GG_FATBIN_OK) {
            ok++;
            CHECK_STR(describe(&fb), "SASS sm_80, no PTX");
        } else {
            errors++;
        }
    }
    CHECK(ok >= 1 && errors > 1000);
    /* and bytes flipped anywhere in the file */
    unsigned seed = 777;
    for (int k = 0; k < 1500; k++) {
        CHECK(pwrite(fd, all, (size_t)len, 0) == len);
        seed = seed * 1103515245u + 12345u;
        long at = (long)((seed >> 4) % (unsigned)len);
        uint8_t v = all[at] ^ (uint8_t)(1 + (seed & 0xfe));
        CHECK(pwrite(fd, &v, 1, at) == 1);
        struct gg_fatbin fb;
        gg_fatbin_init(&fb);
        gg_fatbin_read_fd(&fb, fd);
        for (unsigned i = 0; i < fb.ncode; i++)
            CHECK(fb.code[i].arch >= 10 && fb.code[i].arch <= 999);
    }
    close(fd);
    unlink(tmp_path);
    free(all);
}

int main(void)
{
    RUN(test_rule);
    RUN(test_judge_picks_what_the_driver_picks);
    RUN(test_names_and_description);
    RUN(test_parse_hand_made);
    RUN(test_parse_corrupt);
    RUN(test_truncated_and_flipped_hand_made);
    RUN(test_wrappers);
    RUN(test_elf_sections_and_stubs);
    RUN(test_elf_corrupt);
    if (nvcc_built()) {
        RUN(test_nvcc_libraries);
        RUN(test_real_section_truncated_and_flipped);
        RUN(test_real_file_truncated);
    } else {
        printf("skip: no nvcc-built libraries in %s (tests/arch/arch.mk builds them when "
               "nvcc is in CUDA_HOME)\n", arch_dir);
    }
    return unit_done();
}
