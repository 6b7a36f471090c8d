/* fatbin.c - what device code a library carries (see fatbin.h). */
#include "fatbin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "origin.h"

/* Byte layout, little-endian (measured on nvcc 12/13 output).
 * Fat binary header: u32 magic, u16 version (1), u16 header size (16),
 * u64 size of the entries that follow. Entry header: u16 kind, u16 version,
 * u32 header size (64, 80, 96 or 112), u64 payload size, u32 compressed
 * size, u32, u16 minor, u16 major (of the code format), u32 arch at 0x1c,
 * u32 name offset, u32 name length, u64 flags at 0x28, ... The next entry
 * starts after header and payload. */
#define FB_HEADER 16
#define ENTRY_MIN 0x30           /* through the flags: all that is read */
#define ENTRY_ARCH 0x1c
#define ENTRY_FLAGS 0x28
#define FLAG_ARCH_SPECIFIC 0x100000u
#define FLAG_FAMILY 0x200000u
#define WRAPPER_SIZE (8 + 2 * sizeof(void *))
#define WINDOW 4096
#define HEADER_FILL 256 /* one pread per header: they lie a payload apart */

static uint16_t le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* ---- where the bytes come from: memory or a file ------------------------ */

/* Reads are bounded by [lo, hi): the section, the mapping or the file. A
 * file is read through a window so that headers close together cost one
 * pread. */
struct src {
    struct gg_fatbin *fb;
    const uint8_t *mem; /* memory, or NULL for fd */
    int fd;
    uint64_t lo, hi;
    const uint64_t *stubs; /* offsets of fat binaries to skip (device-link stubs) */
    unsigned nstubs;
    size_t fill;           /* bytes a pread asks for: WINDOW for ELF headers */
    uint64_t win_off;
    size_t win_len;
    uint8_t win[WINDOW];
};

static int fail(struct gg_fatbin *fb, int err, uint64_t off)
{
    if (fb->err == GG_FATBIN_OK) {
        fb->err = err;
        fb->err_off = off;
    }
    return err;
}

/* len bytes at off into out; false (and the error noted) when they are not
 * all inside [lo, hi) or cannot be read. */
static bool src_read(struct src *s, uint64_t off, void *out, size_t len)
{
    if (off < s->lo || off > s->hi || len > s->hi - off) {
        fail(s->fb, GG_FATBIN_ETRUNC, off);
        return false;
    }
    if (len > WINDOW) { /* callers read headers, never more */
        fail(s->fb, GG_FATBIN_EHEADER, off);
        return false;
    }
    if (s->mem) {
        memcpy(out, s->mem + off, len);
        s->fb->bytes_read += len;
        return true;
    }
    if (off < s->win_off || off - s->win_off > s->win_len || len > s->win_len - (off - s->win_off)) {
        uint64_t fill = s->fill > len ? s->fill : len;
        uint64_t want = s->hi - off < fill ? s->hi - off : fill;
        ssize_t n;
        do
            n = pread(s->fd, s->win, (size_t)want, (off_t)off);
        while (n < 0 && errno == EINTR);
        s->win_off = off;
        s->win_len = n > 0 ? (size_t)n : 0;
        if (n > 0)
            s->fb->bytes_read += (uint64_t)n;
        if (n < 0) {
            fail(s->fb, GG_FATBIN_EOPEN, off);
            return false;
        }
        if ((size_t)n < len) { /* the file is shorter than its headers say */
            fail(s->fb, GG_FATBIN_ETRUNC, off);
            return false;
        }
    }
    memcpy(out, s->win + (off - s->win_off), len);
    return true;
}

/* ---- the summary ---------------------------------------------------------- */

void gg_fatbin_init(struct gg_fatbin *fb)
{
    memset(fb, 0, sizeof *fb);
}

static int code_index(struct gg_fatbin *fb, struct gg_fatbin_code c)
{
    for (unsigned i = 0; i < fb->ncode; i++)
        if (fb->code[i].kind == c.kind && fb->code[i].arch == c.arch &&
            fb->code[i].variant == c.variant)
            return (int)i;
    if (fb->ncode == GG_FATBIN_CODES)
        return -1;
    fb->code[fb->ncode] = c;
    return (int)fb->ncode++;
}

/* ---- fat binaries ------------------------------------------------------- */

/* The entries in [off, end): one fat binary's. */
static int parse_entries(struct src *s, uint64_t off, uint64_t end)
{
    struct gg_fatbin *fb = s->fb;
    uint64_t entries = 0;
    while (off < end) {
        uint8_t h[ENTRY_MIN];
        if (end - off < ENTRY_MIN)
            return fail(fb, GG_FATBIN_ETRUNC, off);
        if (!src_read(s, off, h, sizeof h))
            return fb->err;
        uint16_t kind = le16(h);
        uint32_t hsize = le32(h + 4);
        uint64_t psize = le64(h + 8);
        uint32_t arch = le32(h + ENTRY_ARCH);
        uint64_t flags = le64(h + ENTRY_FLAGS);
        if (hsize < ENTRY_MIN)
            return fail(fb, GG_FATBIN_EHEADER, off);
        if (hsize > end - off || psize > end - off - hsize)
            return fail(fb, GG_FATBIN_ETRUNC, off);
        entries++;
        fb->entries++;
        if (kind == GG_FATBIN_PTX || kind == GG_FATBIN_SASS) {
            if (arch < 10 || arch > 999)
                return fail(fb, GG_FATBIN_EHEADER, off);
            struct gg_fatbin_code c = {
                .kind = (uint8_t)kind,
                .variant = flags & FLAG_ARCH_SPECIFIC ? GG_FATBIN_ARCH_SPECIFIC
                           : flags & FLAG_FAMILY      ? GG_FATBIN_FAMILY
                                                      : GG_FATBIN_PLAIN,
                .arch = (uint16_t)arch,
            };
            if (code_index(fb, c) < 0)
                fb->unknown++;
        } else {
            fb->unknown++;
        }
        off += hsize + psize;
    }
    if (entries)
        fb->fatbins++;
    return GG_FATBIN_OK;
}

/* One fat binary at off, inside [s->lo, s->hi); *next: where the next may start. */
static int parse_fatbin(struct src *s, uint64_t off, uint64_t *next)
{
    uint8_t h[FB_HEADER];
    if (!src_read(s, off, h, sizeof h))
        return s->fb->err;
    if (le32(h) != GG_FATBIN_MAGIC)
        return fail(s->fb, GG_FATBIN_EMAGIC, off);
    uint16_t version = le16(h + 4), hsize = le16(h + 6);
    uint64_t size = le64(h + 8);
    if (version != 1 || hsize < FB_HEADER)
        return fail(s->fb, GG_FATBIN_EHEADER, off);
    if (hsize > s->hi - off || size > s->hi - off - hsize)
        return fail(s->fb, GG_FATBIN_ETRUNC, off);
    *next = off + hsize + size;
    for (unsigned i = 0; i < s->nstubs; i++)
        if (s->stubs[i] == off) {
            s->fb->stubs++;
            return GG_FATBIN_OK;
        }
    s->fb->size += hsize + size;
    return parse_entries(s, off + hsize, off + hsize + size);
}

/* Fat binaries back to back in [s->lo, s->hi), zero padding between them. */
static int parse_region(struct src *s)
{
    uint64_t off = s->lo;
    while (off < s->hi && s->fb->err == GG_FATBIN_OK) {
        uint8_t word[8] = {0};
        size_t n = s->hi - off < 8 ? (size_t)(s->hi - off) : 8;
        if (!src_read(s, off, word, n))
            break;
        if (!memcmp(word, "\0\0\0\0\0\0\0\0", 8)) { /* alignment padding */
            off += n;
            continue;
        }
        if (n >= 4 && le32(word) != GG_FATBIN_MAGIC) {
            fail(s->fb, GG_FATBIN_EMAGIC, off);
            break;
        }
        if (parse_fatbin(s, off, &off) != GG_FATBIN_OK)
            break;
    }
    return s->fb->err;
}

#ifdef GG_TESTING
int gg_fatbin_parse(struct gg_fatbin *fb, const void *data, size_t size)
{
    struct src s = {.fb = fb, .mem = data, .lo = 0, .hi = size};
    if (!data)
        return fail(fb, GG_FATBIN_ETRUNC, 0);
    return parse_region(&s);
}
#endif

int gg_fatbin_wrapper_data(const void *wrapper, size_t wrapper_avail, const void **data)
{
    const uint8_t *w = wrapper;
    *data = NULL;
    if (!w || wrapper_avail < WRAPPER_SIZE)
        return GG_FATBIN_ETRUNC;
    uint32_t magic = le32(w), version = le32(w + 4);
    /* version 1: data and an offline file name; 2: data and prelinked fat
     * binaries (-rdc). Either way data is a fat binary. */
    if (magic != GG_FATBIN_WRAPPER_MAGIC || (version != 1 && version != 2))
        return GG_FATBIN_EWRAPPER;
    memcpy(data, w + 8, sizeof *data);
    return *data ? GG_FATBIN_OK : GG_FATBIN_EWRAPPER;
}

int gg_fatbin_parse_one(struct gg_fatbin *fb, const void *data, size_t data_avail)
{
    struct src s = {.fb = fb, .mem = data, .lo = 0, .hi = data_avail};
    uint64_t next;
    if (!data)
        return fail(fb, GG_FATBIN_ETRUNC, 0);
    return parse_fatbin(&s, 0, &next);
}

/* ---- wrappers in memory --------------------------------------------------- */

static const struct gg_fatbin_range *range_of(const struct gg_fatbin_range *r, unsigned n,
                                              uintptr_t p, size_t len)
{
    for (unsigned i = 0; i < n; i++)
        if (p >= r[i].lo && p < r[i].hi && len <= r[i].hi - p)
            return &r[i];
    return NULL;
}

/* The wrapper at p, if it is one whose fat binary lies in a range. */
static bool wrapper_at(uintptr_t p, const struct gg_fatbin_range *r, unsigned n, int *version,
                       const void **data, size_t *avail)
{
    const struct gg_fatbin_range *in = range_of(r, n, p, WRAPPER_SIZE);
    uint8_t w[8];
    if (!in)
        return false;
    memcpy(w, (const void *)p, sizeof w);
    if (le32(w) != GG_FATBIN_WRAPPER_MAGIC ||
        gg_fatbin_wrapper_data((const void *)p, in->hi - p, data) != GG_FATBIN_OK)
        return false;
    *version = (int)le32(w + 4);
    const struct gg_fatbin_range *d = range_of(r, n, (uintptr_t)*data, FB_HEADER);
    if (!d)
        return false;
    *avail = d->hi - (uintptr_t)*data;
    return true;
}

int gg_fatbin_parse_wrappers(struct gg_fatbin *fb, const void *first, const void *last,
                             const struct gg_fatbin_range *ranges, unsigned nranges)
{
    uintptr_t lo = (uintptr_t)first, hi = (uintptr_t)last;
    int version;
    const void *data;
    size_t avail;
    if (!first || hi < lo || (lo & 7))
        return fail(fb, GG_FATBIN_EWRAPPER, 0);
    for (uintptr_t p = lo; p <= hi; p += 8)
        if (wrapper_at(p, ranges, nranges, &version, &data, &avail) &&
            gg_fatbin_parse_one(fb, data, avail) != GG_FATBIN_OK)
            break;
    return fb->err;
}

/* ---- ELF files ------------------------------------------------------------ */

#define EHDR_SIZE 64
#define SHDR_SIZE 64
#define SHT_NOBITS_ 8
#define MAX_STUBS 16
static const char fatbin_section[] = ".nv_fatbin";
static const char wrapper_section[] = ".nvFatBinSegment";

struct shdr {
    uint32_t name, type;
    uint64_t addr, offset, size;
    uint32_t link;
};

static bool read_shdr(struct src *s, uint64_t shoff, uint64_t entsize, uint64_t i, struct shdr *out)
{
    uint8_t h[SHDR_SIZE];
    if (!src_read(s, shoff + i * entsize, h, sizeof h))
        return false;
    out->name = le32(h);
    out->type = le32(h + 4);
    out->addr = le64(h + 0x10);
    out->offset = le64(h + 0x18);
    out->size = le64(h + 0x20);
    out->link = le32(h + 0x28);
    return true;
}

/* The wrappers of .nvFatBinSegment (pointers as the linker wrote them: GNU
 * ld stores the link-time address even where a relocation will rebase it).
 * Fills the offsets in .nv_fatbin of version-2 targets when they are stubs:
 * version-1 wrappers point into .nv_fatbin (whole-program code) and none
 * elsewhere (into __nv_relfatbin: -rdc code, whose linked form a version-2
 * target is, as in NCCL's mix of both; a pointer the linker left 0 counts as
 * elsewhere). False when there is no wrapper at all. */
static bool read_wrappers(struct src *s, const struct shdr *seg, const struct shdr *fatbin,
                          uint64_t *stubs, unsigned *nstubs)
{
    uint64_t v2[MAX_STUBS];
    unsigned n2 = 0, wrappers = 0;
    bool whole_program = false, rdc = false;
    *nstubs = 0;
    for (uint64_t off = 0; seg->size >= WRAPPER_SIZE && off <= seg->size - WRAPPER_SIZE;
         off += 8) {
        uint8_t w[WRAPPER_SIZE];
        if (!src_read(s, seg->offset + off, w, sizeof w))
            return wrappers > 0;
        uint32_t version = le32(w + 4);
        uint64_t data = le64(w + 8);
        if (le32(w) != GG_FATBIN_WRAPPER_MAGIC || (version != 1 && version != 2))
            continue;
        wrappers++;
        off += WRAPPER_SIZE - 8;
        bool inside = data >= fatbin->addr && data - fatbin->addr < fatbin->size;
        if (version == 1 && inside)
            whole_program = true;
        else if (version == 1)
            rdc = true;
        else if (inside && n2 < MAX_STUBS)
            v2[n2++] = fatbin->offset + (data - fatbin->addr);
    }
    if (whole_program && !rdc) {
        memcpy(stubs, v2, n2 * sizeof *v2);
        *nstubs = n2;
    }
    return wrappers > 0;
}

int gg_fatbin_read_fd(struct gg_fatbin *fb, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return fail(fb, GG_FATBIN_EOPEN, 0);
    struct src s = {.fb = fb, .fd = fd, .lo = 0, .hi = (uint64_t)st.st_size, .fill = WINDOW};
    uint8_t e[EHDR_SIZE];
    if (s.hi < EHDR_SIZE)
        return fail(fb, GG_FATBIN_ENOTELF, 0);
    if (!src_read(&s, 0, e, sizeof e))
        return fb->err;
    if (memcmp(e, "\177ELF", 4) != 0 || e[4] != 2 /* 64-bit */ || e[5] != 1 /* LE */)
        return fail(fb, GG_FATBIN_ENOTELF, 0);
    uint64_t shoff = le64(e + 0x28), shnum = le16(e + 0x3c), shstrndx = le16(e + 0x3e);
    uint64_t entsize = le16(e + 0x3a);
    if (!shoff)
        return fail(fb, GG_FATBIN_NONE, 0); /* no section headers at all */
    if (entsize < SHDR_SIZE || shoff > s.hi - SHDR_SIZE)
        return fail(fb, GG_FATBIN_EELF, 0x28);
    struct shdr sh0;
    if ((shnum == 0 || shstrndx == 0xffff) && !read_shdr(&s, shoff, entsize, 0, &sh0))
        return fb->err;
    if (shnum == 0) /* extended numbering: the count is in section 0 */
        shnum = sh0.size;
    if (shstrndx == 0xffff)
        shstrndx = sh0.link;
    if (shnum > (s.hi - shoff) / entsize || shstrndx >= shnum)
        return fail(fb, GG_FATBIN_EELF, shoff);
    struct shdr strtab;
    if (!read_shdr(&s, shoff, entsize, shstrndx, &strtab))
        return fb->err;
    if (strtab.type == SHT_NOBITS_ || strtab.offset > s.hi || strtab.size > s.hi - strtab.offset)
        return fail(fb, GG_FATBIN_EELF, shoff + shstrndx * entsize);

    /* Section names: a small string table is read once, a large one name by name. */
    uint8_t names[WINDOW];
    bool names_held = strtab.size <= sizeof names;
    if (names_held && !src_read(&s, strtab.offset, names, (size_t)strtab.size))
        return fb->err;
    struct shdr fatbin = {0}, seg = {0};
    bool have_fatbin = false, have_seg = false;
    for (uint64_t i = 1; i < shnum; i++) {
        struct shdr sh;
        char name[sizeof wrapper_section];
        if (!read_shdr(&s, shoff, entsize, i, &sh))
            return fb->err;
        if (sh.name >= strtab.size)
            continue;
        size_t n = strtab.size - sh.name < sizeof name ? (size_t)(strtab.size - sh.name)
                                                      : sizeof name;
        if (names_held)
            memcpy(name, names + sh.name, n);
        else if (!src_read(&s, strtab.offset + sh.name, name, n))
            return fb->err;
        bool is_fatbin = n >= sizeof fatbin_section && !memcmp(name, fatbin_section,
                                                              sizeof fatbin_section);
        bool is_seg = n >= sizeof wrapper_section && !memcmp(name, wrapper_section,
                                                            sizeof wrapper_section);
        if (!is_fatbin && !is_seg)
            continue;
        if (sh.type == SHT_NOBITS_ || sh.offset > s.hi || sh.size > s.hi - sh.offset)
            return fail(fb, GG_FATBIN_EELF, shoff + i * entsize);
        if (is_fatbin && !have_fatbin) {
            fatbin = sh;
            have_fatbin = true;
        } else if (is_seg && !have_seg) {
            seg = sh;
            have_seg = true;
        }
    }
    if (!have_fatbin)
        return fail(fb, GG_FATBIN_NONE, 0);
    uint64_t stubs[MAX_STUBS];
    if (!have_seg || !read_wrappers(&s, &seg, &fatbin, stubs, &s.nstubs)) {
        if (fb->err == GG_FATBIN_OK)
            fail(fb, GG_FATBIN_UNREGISTERED, fatbin.offset);
        return fb->err;
    }
    s.stubs = stubs;
    s.fill = HEADER_FILL;
    s.lo = fatbin.offset; /* the same reader (and window), bounded by the section */
    s.hi = fatbin.offset + fatbin.size;
    return parse_region(&s);
}

int gg_fatbin_read_file(struct gg_fatbin *fb, const char *path)
{
    int fd;
    do
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return fail(fb, GG_FATBIN_EOPEN, 0);
    int r = gg_fatbin_read_fd(fb, fd);
    close(fd);
    return r;
}

const char *gg_fatbin_strerror(int err)
{
    switch (err) {
    case GG_FATBIN_OK: return "ok";
    case GG_FATBIN_NONE: return "no device code (no .nv_fatbin section)";
    case GG_FATBIN_UNREGISTERED:
        return "device code the CUDA runtime never registers (a .nv_fatbin section but no "
               ".nvFatBinSegment wrappers): not checked";
    case GG_FATBIN_EOPEN: return "cannot read the file";
    case GG_FATBIN_ENOTELF: return "not a 64-bit little-endian ELF file";
    case GG_FATBIN_EELF: return "corrupt ELF section headers";
    case GG_FATBIN_ETRUNC: return "truncated: a header runs past the end of its section";
    case GG_FATBIN_EMAGIC: return "corrupt device code: no fat-binary magic where one must start";
    case GG_FATBIN_EHEADER: return "corrupt device code: a header with impossible sizes";
    case GG_FATBIN_EWRAPPER: return "not a fat-binary registration (wrong magic or version)";
    }
    return "unknown error";
}

/* ---- the rule --------------------------------------------------------------- */

bool gg_fatbin_runs(struct gg_fatbin_code c, int major, int minor)
{
    int dev = major * 10 + minor;
    if (major < 0 || minor < 0 || minor > 9)
        return false;
    if (c.variant == GG_FATBIN_ARCH_SPECIFIC)
        return c.arch == dev;
    if (c.variant == GG_FATBIN_FAMILY || c.kind == GG_FATBIN_SASS)
        return c.arch / 10 == major && c.arch % 10 <= minor;
    if (c.kind == GG_FATBIN_PTX)
        return c.arch <= dev;
    return false;
}

/* Which of the driver's choices is better: SASS over PTX, then newer. */
static bool better(struct gg_fatbin_code a, struct gg_fatbin_code b)
{
    if (a.kind != b.kind)
        return a.kind == GG_FATBIN_SASS;
    return a.arch > b.arch;
}

void gg_fatbin_judge(const struct gg_fatbin *fb, int major, int minor,
                     struct gg_fatbin_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->any_code = fb->ncode > 0;
    for (unsigned i = 0; i < fb->ncode; i++)
        if (gg_fatbin_runs(fb->code[i], major, minor) &&
            (!v->used.kind || better(fb->code[i], v->used)))
            v->used = fb->code[i];
    v->ok = v->used.kind != 0;
}

void gg_fatbin_code_name(struct gg_fatbin_code c, char *out, size_t cap)
{
    const char *suffix = c.variant == GG_FATBIN_ARCH_SPECIFIC ? "a"
                         : c.variant == GG_FATBIN_FAMILY      ? "f"
                                                              : "";
    snprintf(out, cap, "%s_%u%s", c.kind == GG_FATBIN_SASS ? "sm" : "compute", c.arch, suffix);
}

/* Append to out[*len] within cap, always terminated. */
static void append(char *out, size_t cap, size_t *len, const char *s)
{
    size_t n = strlen(s);
    if (*len + 1 >= cap)
        return;
    if (n > cap - 1 - *len)
        n = cap - 1 - *len;
    memcpy(out + *len, s, n);
    *len += n;
    out[*len] = '\0';
}

/* The codes of one kind, oldest arch first, after `label`; false if none. */
static bool describe_kind(const struct gg_fatbin *fb, int kind, const char *label, char *out,
                          size_t cap, size_t *len)
{
    bool done[GG_FATBIN_CODES] = {false};
    bool any = false;
    for (;;) {
        int pick = -1;
        for (unsigned i = 0; i < fb->ncode; i++)
            if (!done[i] && fb->code[i].kind == kind &&
                (pick < 0 || fb->code[i].arch < fb->code[pick].arch ||
                 (fb->code[i].arch == fb->code[pick].arch &&
                  fb->code[i].variant < fb->code[pick].variant)))
                pick = (int)i;
        if (pick < 0)
            return any;
        done[pick] = true;
        char name[32];
        gg_fatbin_code_name(fb->code[pick], name, sizeof name);
        append(out, cap, len, any ? " " : label);
        append(out, cap, len, name);
        any = true;
    }
}

void gg_fatbin_describe(const struct gg_fatbin *fb, char *out, size_t cap)
{
    size_t len = 0;
    if (!cap)
        return;
    out[0] = '\0';
    if (!fb->ncode) {
        append(out, cap, &len, "no device code");
        return;
    }
    if (describe_kind(fb, GG_FATBIN_SASS, "SASS ", out, cap, &len)) {
        append(out, cap, &len, ", ");
        if (!describe_kind(fb, GG_FATBIN_PTX, "PTX ", out, cap, &len))
            append(out, cap, &len, "no PTX");
    } else {
        describe_kind(fb, GG_FATBIN_PTX, "PTX ", out, cap, &len);
        append(out, cap, &len, ", no SASS");
    }
}

const char *gg_fatbin_first_cuda(int major, int minor)
{
    static const struct {
        int cc;
        const char *cuda;
    } first[] = {{70, "9.0"},   {75, "10.0"},  {80, "11.0"},  {86, "11.1"},  {87, "11.4"},
                 {89, "11.8"},  {90, "11.8"},  {100, "12.8"}, {101, "12.8"}, {120, "12.8"},
                 {103, "12.9"}, {121, "12.9"}, {110, "13.0"}};
    int cc = major * 10 + minor;
    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++)
        if (first[i].cc == cc)
            return first[i].cuda;
    return NULL;
}

const char *gg_fatbin_torch_fix(int major, int minor)
{
    int cc = major * 10 + minor;
    if (major == 10 || major == 12)
        return "install PyTorch 2.7 or newer built with CUDA 12.8 or newer, whose wheels carry "
               "sm_100 and sm_120 (pip install torch --index-url "
               "https://download.pytorch.org/whl/cu128)";
    if (cc >= 75 && cc <= 90)
        return "install an official PyTorch CUDA wheel (2.6 and later carry SASS for sm_75, "
               "sm_80, sm_86 and sm_90; 8.9 runs the sm_86 code)";
    if (cc >= 50 && cc < 75)
        return "install a PyTorch wheel built with CUDA 12.6 (pip install torch --index-url "
               "https://download.pytorch.org/whl/cu126), which still carries sm_50 to sm_90";
    return "install a PyTorch build whose TORCH_CUDA_ARCH_LIST names this GPU's compute "
           "capability";
}

void gg_fatbin_fix(const struct gg_origin *lib, bool torch_here, int major, int minor, char *out,
                   size_t cap)
{
    int cc = major * 10 + minor;
    const char *cuda = gg_fatbin_first_cuda(major, minor);
    char with[48] = "";
    if (cuda)
        snprintf(with, sizeof with, " with CUDA %s or newer", cuda);
    if (lib && (lib->torch || (lib->what[0] && torch_here))) {
        const char *wheel = lib->torch ? NULL : gg_origin_torch_wheel(lib);
        if (wheel)
            snprintf(out, cap, "%s; that PyTorch brings its own %s (the %s wheel)",
                     gg_fatbin_torch_fix(major, minor), lib->what, wheel);
        else
            snprintf(out, cap, "%s", gg_fatbin_torch_fix(major, minor));
    } else if (lib && lib->from != GG_ORIGIN_UNKNOWN) {
        snprintf(out, cap,
                 "install a build of %s made for sm_%d%s, or rebuild it (nvcc -gencode "
                 "arch=compute_%d,code=sm_%d) or with PTX for compute_%d or older, which the "
                 "driver compiles at load",
                 lib->package, cc, with, cc, cc, cc);
    } else {
        snprintf(out, cap,
                 "rebuild it for this GPU%s (nvcc -gencode arch=compute_%d,code=sm_%d) or with PTX "
                 "for compute_%d or older, which the driver compiles at load",
                 with, cc, cc, cc);
    }
}
