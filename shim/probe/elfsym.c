/* elfsym.c - names you can trust for native frames (see elfsym.h).
 *
 * A lookup finds the loaded module holding the address (dl_iterate_phdr,
 * which also gives the load bias and the image's program headers), then the
 * module's table: built on first use from the file (pread into mmap'd
 * buffers, never mapping the file itself, so a file truncated under us
 * cannot fault us), kept for the life of the process, keyed by bias, name
 * and a fingerprint of the program headers (a module unloaded and another
 * loaded at the same place gets its own table). Only functions (FUNC and
 * IFUNC symbols with a size, defined in an executable section, and lying
 * inside it) go in; aliases at the same address keep the global name.
 *
 * Locks: one spin lock (reset in a forked child: life.c's fork story),
 * never held across dl_iterate_phdr, dlsym or dlopen, so it cannot order itself against the loader's locks. No stdio;
 * the only malloc is inside __cxa_demangle. A lookup uses about 8 KiB of
 * stack (a path and the module's program headers, copied from the loader).
 */
#include "elfsym.h"
#include "prim.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_MODULES 1024
#define MAX_PHDRS 64
#define MAX_SHNUM 65536
#define MAX_SYMS (1u << 23)             /* symbols per table */
#define MAX_STRTAB (256u << 20)         /* bytes of names per table */
#define MAX_TOTAL (1ull << 30)          /* bytes of tables, all modules */
#define MAX_NOTES 65536
#define SCAN_BACK 16                    /* overlapping symbols looked through */
#define ARENA_CHUNK (1u << 20)
#define ARENA_CHUNKS 64
#define NAME_MAX_LEN 4096               /* longer demangled names are cut */
#define DEMANGLED 0x100u                /* sym.rank: name already demangled */

struct sym {
    uint64_t start, size;               /* file addresses */
    uint32_t rank;                      /* binding preference | DEMANGLED */
    const char *name;
};

struct module {
    uintptr_t bias;
    uint64_t fingerprint;
    const char *name;                   /* as the loader gives it ("" for the executable) */
    const char *path;                   /* what we show */
    struct sym *syms;
    size_t nsyms;
    char *strtab;                       /* the names, NUL-terminated */
    size_t syms_bytes, str_bytes;       /* as mmap'd */
};

static gg_spin g_lock = GG_SPIN_INIT;
static struct module g_modules[MAX_MODULES];
static size_t g_nmodules;
static uint64_t g_total;                /* bytes mmap'd for tables */
static char *g_arena;
static size_t g_arena_left;
static unsigned g_arena_chunks;

typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
static _Atomic(demangle_fn) g_demangle;
static _Atomic unsigned long long g_demangle_adds = ~0ull;

/* ---- small helpers ------------------------------------------------------ */

static char *arena_copy(const char *s, size_t n)
{
    if (n + 1 > ARENA_CHUNK)
        n = ARENA_CHUNK - 1;
    if (n + 1 > g_arena_left) {
        if (g_arena_chunks >= ARENA_CHUNKS || !(g_arena = gg_pages(ARENA_CHUNK)))
            return NULL;
        g_arena_chunks++;
        g_arena_left = ARENA_CHUNK;
    }
    char *p = g_arena;
    memcpy(p, s, n);
    p[n] = '\0';
    g_arena += n + 1;
    g_arena_left -= n + 1;
    return p;
}

/* Exactly n bytes at off, or false. */
static bool pread_full(int fd, void *buf, size_t n, uint64_t off)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        p += r;
        off += (uint64_t)r;
        n -= (size_t)r;
    }
    return true;
}

/* [off, off + size) within a file of `file` bytes, without overflow. */
static inline bool in_file(uint64_t off, uint64_t size, uint64_t file)
{
    return off <= file && size <= file - off;
}

/* Pages for a table, counted against the total. */
static void *table_alloc(size_t size)
{
    if (size == 0 || size > MAX_TOTAL - g_total)
        return NULL;
    void *p = gg_pages(size);
    if (p)
        g_total += size;
    return p;
}

static void table_free(void *p, size_t size)
{
    if (p) {
        gg_pages_free(p, size);
        g_total -= size;
    }
}

static uint64_t fingerprint(const ElfW(Phdr) *ph, int n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        if (ph[i].p_type != PT_LOAD)
            continue;
        uint64_t v[4] = { ph[i].p_vaddr, ph[i].p_memsz, ph[i].p_offset, ph[i].p_flags };
        for (int k = 0; k < 4; k++)
            h = (h ^ v[k]) * 0x100000001b3ull;
    }
    return h;
}

/* The GNU build id inside a block of notes; false when there is none. */
static bool build_id(const uint8_t *notes, size_t len, const uint8_t **id, size_t *idlen)
{
    size_t off = 0;
    while (len - off >= sizeof(ElfW(Nhdr))) {
        ElfW(Nhdr) nh;
        memcpy(&nh, notes + off, sizeof nh);
        size_t name = (nh.n_namesz + 3u) & ~3u, desc = (nh.n_descsz + 3u) & ~3u;
        off += sizeof nh;
        if (name > len - off || desc > len - off - name)
            return false;
        if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
            memcmp(notes + off, "GNU", 4) == 0 && nh.n_descsz > 0) {
            *id = notes + off + name;
            *idlen = nh.n_descsz;
            return true;
        }
        off += name + desc;
    }
    return false;
}

/* ---- reading a symbol table --------------------------------------------- */

/* Binding preference when several names share an address. */
static uint32_t rank_of(unsigned bind)
{
    return bind == STB_GLOBAL ? 3 : bind == STB_WEAK ? 2 : bind == STB_LOCAL ? 1 : 0;
}

static bool sym_before(const struct sym *a, const struct sym *b)
{
    if (a->start != b->start)
        return a->start < b->start;
    if (a->rank != b->rank)
        return a->rank > b->rank;
    return a->size > b->size;
}

/* Heapsort: in place, no allocation, n log n on any input. */
static void sift(struct sym *s, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && sym_before(&s[child], &s[child + 1]))
            child++;
        if (!sym_before(&s[root], &s[child]))
            return;
        struct sym t = s[root];
        s[root] = s[child];
        s[child] = t;
        root = child;
    }
}

static void sort_syms(struct sym *s, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        sift(s, i, n);
    for (size_t end = n; end-- > 1;) {
        struct sym t = s[0];
        s[0] = s[end];
        s[end] = t;
        sift(s, 0, end);
    }
}

/* The loaded image's view, to check the file against; NULL for tests. */
struct image {
    uintptr_t bias;
    const ElfW(Phdr) *phdrs;
    int phnum;
};

static bool same_file(int fd, const Elf64_Ehdr *eh, uint64_t fsize, const struct image *img)
{
    if (eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phnum == 0 || eh->e_phnum > MAX_PHDRS ||
        !in_file(eh->e_phoff, (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr), fsize))
        return false;
    static Elf64_Phdr ph[MAX_PHDRS]; /* under g_lock: not kilobytes of a small stack */
    if (!pread_full(fd, ph, eh->e_phnum * sizeof ph[0], eh->e_phoff))
        return false;
    if (!img)
        return true;
    if (fingerprint(ph, eh->e_phnum) != fingerprint(img->phdrs, img->phnum))
        return false;
    /* Build ids, when both sides have one, must agree. */
    const uint8_t *mem_id = NULL, *file_id = NULL;
    size_t mem_len = 0, file_len = 0;
    for (int i = 0; i < img->phnum && !mem_id; i++)
        if (img->phdrs[i].p_type == PT_NOTE && img->phdrs[i].p_memsz <= MAX_NOTES)
            build_id((const uint8_t *)(img->bias + img->phdrs[i].p_vaddr),
                     img->phdrs[i].p_memsz, &mem_id, &mem_len);
    if (!mem_id)
        return true;
    static uint8_t notes[MAX_NOTES];                   /* under the lock */
    for (int i = 0; i < eh->e_phnum; i++) {
        if (ph[i].p_type != PT_NOTE || ph[i].p_filesz > sizeof notes ||
            !in_file(ph[i].p_offset, ph[i].p_filesz, fsize) ||
            !pread_full(fd, notes, ph[i].p_filesz, ph[i].p_offset))
            continue;
        if (build_id(notes, ph[i].p_filesz, &file_id, &file_len))
            return file_len == mem_len && memcmp(file_id, mem_id, mem_len) == 0;
    }
    return true;
}

/* Read the functions of the ELF file at `path` into *m. False (m empty)
 * when the file is not readable, not the loaded one, or malformed. */
static bool load_syms(const char *path, const struct image *img, struct module *m)
{
    bool ok = false;
    Elf64_Shdr *sh = NULL;
    size_t sh_bytes = 0, syms_bytes = 0, str_bytes = 0;
    char *strtab = NULL;
    struct sym *syms = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat st;
    Elf64_Ehdr eh;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !pread_full(fd, &eh, sizeof eh, 0))
        goto out;
    uint64_t fsize = (uint64_t)st.st_size;
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB
                                                                         : ELFDATA2MSB) ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff == 0 ||
        !same_file(fd, &eh, fsize, img))
        goto out;

    /* Section headers; more than 0xff00 are counted in the first one. */
    uint64_t shnum = eh.e_shnum;
    if (shnum == 0) {
        Elf64_Shdr first;
        if (!in_file(eh.e_shoff, sizeof first, fsize) ||
            !pread_full(fd, &first, sizeof first, eh.e_shoff))
            goto out;
        shnum = first.sh_size;
    }
    sh_bytes = (size_t)shnum * sizeof *sh;
    if (shnum == 0 || shnum > MAX_SHNUM || !in_file(eh.e_shoff, sh_bytes, fsize) ||
        !(sh = table_alloc(sh_bytes)) || !pread_full(fd, sh, sh_bytes, eh.e_shoff))
        goto out;
    const Elf64_Shdr *symtab = NULL;
    for (uint64_t i = 0; i < shnum && !symtab; i++)
        if (sh[i].sh_type == SHT_SYMTAB)
            symtab = &sh[i];
    for (uint64_t i = 0; i < shnum && !symtab; i++)
        if (sh[i].sh_type == SHT_DYNSYM)
            symtab = &sh[i];
    if (!symtab || symtab->sh_entsize != sizeof(Elf64_Sym) || symtab->sh_link >= shnum ||
        symtab->sh_size % sizeof(Elf64_Sym) != 0 ||
        symtab->sh_size / sizeof(Elf64_Sym) > MAX_SYMS ||
        !in_file(symtab->sh_offset, symtab->sh_size, fsize))
        goto out;
    const Elf64_Shdr *strs = &sh[symtab->sh_link];
    if (strs->sh_type != SHT_STRTAB || strs->sh_size == 0 || strs->sh_size > MAX_STRTAB ||
        !in_file(strs->sh_offset, strs->sh_size, fsize))
        goto out;
    str_bytes = (size_t)strs->sh_size + 1;
    if (!(strtab = table_alloc(str_bytes)) ||
        !pread_full(fd, strtab, strs->sh_size, strs->sh_offset))
        goto out;
    strtab[strs->sh_size] = '\0';                      /* every name ends */

    size_t nsym = (size_t)(symtab->sh_size / sizeof(Elf64_Sym)), n = 0;
    syms_bytes = (nsym ? nsym : 1) * sizeof *syms;
    if (!(syms = table_alloc(syms_bytes)))
        goto out;
    static Elf64_Sym chunk[1024];                      /* under the lock */
    for (size_t done = 0; done < nsym;) {
        size_t k = nsym - done < 1024 ? nsym - done : 1024;
        if (!pread_full(fd, chunk, k * sizeof chunk[0], symtab->sh_offset + done * sizeof chunk[0]))
            goto out;
        for (size_t i = 0; i < k; i++) {
            const Elf64_Sym *s = &chunk[i];
            unsigned type = ELF64_ST_TYPE(s->st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s->st_size == 0 ||
                s->st_shndx == SHN_UNDEF || s->st_shndx >= SHN_LORESERVE ||
                s->st_shndx >= shnum || s->st_name == 0 || s->st_name >= strs->sh_size)
                continue;
            const Elf64_Shdr *sec = &sh[s->st_shndx];
            if ((sec->sh_flags & (SHF_ALLOC | SHF_EXECINSTR)) != (SHF_ALLOC | SHF_EXECINSTR) ||
                s->st_value < sec->sh_addr || s->st_value - sec->sh_addr > sec->sh_size ||
                s->st_size > sec->sh_size - (s->st_value - sec->sh_addr))
                continue;
            syms[n++] = (struct sym){ s->st_value, s->st_size,
                                      rank_of(ELF64_ST_BIND(s->st_info)), strtab + s->st_name };
        }
        done += k;
    }
    sort_syms(syms, n);
    size_t kept = 0;                                   /* one name per address */
    for (size_t i = 0; i < n; i++)
        if (kept == 0 || syms[kept - 1].start != syms[i].start)
            syms[kept++] = syms[i];
    m->syms = syms;
    m->nsyms = kept;
    m->strtab = strtab;
    m->syms_bytes = syms_bytes;
    m->str_bytes = str_bytes;
    ok = true;
out:
    close(fd);
    table_free(sh, sh_bytes);
    if (!ok) {
        table_free(strtab, str_bytes);
        table_free(syms, syms_bytes);
    }
    return ok;
}

/* The function holding file address v, or NULL. */
static struct sym *find_sym(const struct module *m, uint64_t v)
{
    size_t lo = 0, hi = m->nsyms;                      /* first start > v */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (m->syms[mid].start <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (size_t i = lo, looked = 0; i-- > 0 && looked < SCAN_BACK; looked++)
        if (v - m->syms[i].start < m->syms[i].size)
            return &m->syms[i];
    return NULL;
}

/* ---- the demangler ------------------------------------------------------ */

/* __cxa_demangle, looked for again whenever objects were loaded since the
 * last look. Outside our lock: dlsym and dlopen take the loader's. */
static demangle_fn demangler(unsigned long long adds)
{
    demangle_fn f = atomic_load(&g_demangle);
    if (f || atomic_exchange(&g_demangle_adds, adds) == adds)
        return f;
    void *p = dlsym(RTLD_DEFAULT, "__cxa_demangle");
    if (!p) {
        /* libstdc++ is often there only RTLD_LOCAL (under a Python extension);
         * the handle is kept, so it stays while we hold its function. */
        void *h = dlopen("libstdc++.so.6", RTLD_NOLOAD | RTLD_LAZY);
        if (h)
            p = dlsym(h, "__cxa_demangle");
    }
    *(void **)&f = p;
    atomic_store(&g_demangle, f);
    return f;
}

static bool demangle_with(demangle_fn f, const char *name, char *out, size_t size)
{
    if (!f || !name || name[0] != '_' || name[1] != 'Z' || size == 0)
        return false;
    int status = -1;
    char *d = f(name, NULL, NULL, &status);
    if (!d)
        return false;
    bool ok = status == 0;
    if (ok) {
        size_t n = strlen(d);
        if (n >= size)
            n = size - 1;
        memcpy(out, d, n);
        out[n] = '\0';
    }
    free(d);
    return ok;
}

static int adds_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    *(unsigned long long *)arg = info->dlpi_adds;
    return 1;
}

bool gg_elfsym_demangle(const char *name, char *out, size_t size)
{
    unsigned long long adds = 0;
    dl_iterate_phdr(adds_cb, &adds);
    return demangle_with(demangler(adds), name, out, size);
}

/* ---- lookups ------------------------------------------------------------ */

struct where {
    uintptr_t addr;
    bool found;
    unsigned long long adds;
    struct image img;
    ElfW(Phdr) phdrs[MAX_PHDRS];
    char name[PATH_MAX];
};

/* Copies what it needs: nothing here may call back into the loader. */
static int where_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct where *w = arg;
    w->adds = info->dlpi_adds;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type != PT_LOAD || w->addr < lo || w->addr - lo >= ph->p_memsz)
            continue;
        const char *name = info->dlpi_name ? info->dlpi_name : "";
        size_t n = strlen(name);
        if (n >= sizeof w->name || info->dlpi_phnum > MAX_PHDRS)
            return 1;                                  /* ours to refuse */
        memcpy(w->name, name, n + 1);
        memcpy(w->phdrs, info->dlpi_phdr, info->dlpi_phnum * sizeof w->phdrs[0]);
        w->img = (struct image){ info->dlpi_addr, w->phdrs, info->dlpi_phnum };
        w->found = true;
        return 1;
    }
    return 0;
}

/* The module record for what `w` found, loading its table the first time
 * (under the lock). NULL when the table of modules is full. */
static struct module *module_for(const struct where *w)
{
    uint64_t fp = fingerprint(w->img.phdrs, w->img.phnum);
    for (size_t i = 0; i < g_nmodules; i++) {
        struct module *m = &g_modules[i];
        if (m->bias == w->img.bias && m->fingerprint == fp && strcmp(m->name, w->name) == 0)
            return m;
    }
    if (g_nmodules >= MAX_MODULES)
        return NULL;
    struct module *m = &g_modules[g_nmodules];
    *m = (struct module){ .bias = w->img.bias, .fingerprint = fp };
    m->name = arena_copy(w->name, strlen(w->name));
    const char *file = w->name;
    static char exe[PATH_MAX]; /* under g_lock */
    if (!w->name[0]) {                                 /* the executable */
        file = "/proc/self/exe";
        ssize_t n = readlink(file, exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = '\0';
        m->path = arena_copy(exe, strlen(exe));
    } else {
        m->path = m->name;
    }
    if (!m->name || !m->path)
        return NULL;
    load_syms(file, &w->img, m);                       /* none on failure: still a module */
    g_nmodules++;
    return m;
}

bool gg_elfsym_lookup(uintptr_t addr, struct gg_elfsym_hit *out)
{
    *out = (struct gg_elfsym_hit){ NULL, 0, NULL, 0, 0 };
    /* Kilobytes (a path, the program headers): on the side stack. */
    struct where *wp = gg_side_push(sizeof *wp);
    if (!wp)
        return false;
    struct where *const w = wp;
    w->addr = addr;
    w->found = false;
    dl_iterate_phdr(where_cb, w);
    /* A signal handler interrupting a lookup on its own thread gets no
     * name rather than waiting for itself. */
    if (!w->found || !gg_spin_trylock(&g_lock, 1000000)) {
        gg_side_pop(wp);
        return false;
    }
    demangle_fn dm = demangler(w->adds);
    struct module *m = module_for(w);
    if (m) {
        out->module = m->path;
        out->bias = m->bias;
        struct sym *s = find_sym(m, addr - m->bias);
        if (s && dm && !(s->rank & DEMANGLED)) {
            static char name[NAME_MAX_LEN]; /* under g_lock */
            if (demangle_with(dm, s->name, name, sizeof name)) {
                const char *copy = arena_copy(name, strlen(name));
                if (copy)
                    s->name = copy;
            }
            s->rank |= DEMANGLED;
        }
        if (s) {
            out->sym = s->name;
            out->start = m->bias + s->start;
            out->size = s->size;
        }
    }
    gg_spin_unlock(&g_lock);
    gg_side_pop(wp);
    return m != NULL;
}

#ifdef GG_TESTING
long gg_elfsym_test_file(const char *path, uint64_t vaddr, char *name, size_t size)
{
    struct module m = { 0 };
    gg_spin_lock(&g_lock);
    bool ok = load_syms(path, NULL, &m);
    const struct sym *s = ok ? find_sym(&m, vaddr) : NULL;
    if (size) {
        size_t n = s ? strlen(s->name) : 0;
        n = n < size ? n : size - 1;
        memcpy(name, s ? s->name : "", n);
        name[n] = '\0';
    }
    table_free(m.syms, m.syms_bytes);
    table_free(m.strtab, m.str_bytes);
    gg_spin_unlock(&g_lock);
    return ok ? (long)m.nsyms : -1;
}
#endif

void gg_elfsym_after_fork(void)
{
    gg_spin_reset(&g_lock);
}
