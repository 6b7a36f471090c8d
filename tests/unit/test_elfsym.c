/* Unit tests for elfsym.c: addresses named only inside a function's extent,
 * against test libraries built by make (tests/elfsym/): static and exported
 * functions, padding, a stripped copy (.dynsym only), C++ names, the PIE test
 * program itself and a non-PIE one; and corrupt copies of an ELF file, which
 * must give no symbols or sane ones, never a crash (run it under ASan). */
#include "elfsym.h"
#include "unit.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[PATH_MAX];              /* build/tests/elfsym */

static const char *path_of(const char *name)
{
    static char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

static void *load(const char *name)
{
    void *h = dlopen(path_of(name), RTLD_NOW | RTLD_LOCAL);
    if (!h)
        printf("  cannot load %s: %s\n", name, dlerror());
    return h;
}

static void *fn(void *h, const char *name)
{
    void *p = h ? dlsym(h, name) : NULL;
    if (!p)
        printf("  no %s\n", name);
    return p;
}

/* The name elfsym gives addr, or "" for none. */
static const char *name_at(uintptr_t addr)
{
    struct gg_elfsym_hit hit;
    if (!gg_elfsym_lookup(addr, &hit))
        return "(no module)";
    if (hit.sym)
        CHECK(addr - hit.start < hit.size);  /* every answer: inside the extent */
    return hit.sym ? hit.sym : "";
}

static bool ends_with(const char *s, const char *tail)
{
    size_t a = s ? strlen(s) : 0, b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

static void test_inside_extents(void)
{
    void *h = load("libsym.so");
    uintptr_t exported = (uintptr_t)fn(h, "exported_fn");
    void *(*local_of)(void) = (void *(*)(void))fn(h, "symlib_local");
    if (!exported || !local_of) {
        CHECK(0);
        return;
    }
    uintptr_t local = (uintptr_t)local_of();
    struct gg_elfsym_hit hit;
    CHECK(gg_elfsym_lookup(exported, &hit));
    CHECK_STR(hit.sym, "exported_fn");
    CHECK(ends_with(hit.module, "/libsym.so"));
    CHECK_EQ_U64(hit.start, exported);
    CHECK(hit.size > 0);
    CHECK_STR(name_at(exported + hit.size - 1), "exported_fn");
    CHECK(strcmp(name_at(exported + hit.size), "exported_fn") != 0); /* one past the end */
    CHECK_STR(name_at(local), "local_fn");                          /* static: .symtab */
    CHECK_STR(name_at(local + 2), "local_fn");
}

/* w[1] = the last byte of the executable PT_LOAD of the module holding w[0]. */
static int exec_end_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t *w = arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && w[0] >= lo && w[0] - lo < ph->p_memsz)
            w[1] = lo + ph->p_memsz - 1;
    }
    return 0;
}

static void test_padding_is_nameless(void)
{
    void *h = load("libsym.so");
    uintptr_t tiny = (uintptr_t)fn(h, "tiny_fn"), aligned = (uintptr_t)fn(h, "aligned_fn");
    struct gg_elfsym_hit hit;
    if (!tiny || !aligned || !gg_elfsym_lookup(tiny, &hit)) {
        CHECK(0);
        return;
    }
    uintptr_t gap = tiny + hit.size;
    CHECK(gap < aligned);                   /* aligned_fn is 256-aligned: padding between */
    CHECK_STR(name_at(gap), "");
    CHECK_STR(name_at(aligned - 1), "");
    CHECK_STR(name_at(aligned), "aligned_fn");
    /* The last byte of the executable segment lies in no function. */
    uintptr_t w[2] = { aligned, 0 };
    dl_iterate_phdr(exec_end_cb, w);
    CHECK(w[1] > aligned);
    CHECK_STR(name_at(w[1]), "");
}

static void test_stripped(void)
{
    void *full = load("libsym.so"), *h = load("libsym_stripped.so");
    void *(*local_of)(void) = (void *(*)(void))fn(h, "symlib_local");
    void *(*full_local_of)(void) = (void *(*)(void))fn(full, "symlib_local");
    uintptr_t exported = (uintptr_t)fn(h, "exported_fn");
    if (!local_of || !full_local_of || !exported) {
        CHECK(0);
        return;
    }
    uintptr_t local = (uintptr_t)local_of();
    /* Right after exported_fn: a reader that takes the nearest symbol
     * before (libunwind's unw_get_proc_name) calls it exported_fn+0x22;
     * .dynsym has no extent holding it, so elfsym gives no name. */
    struct gg_elfsym_hit hit, full_hit;
    CHECK(gg_elfsym_lookup(local + 2, &hit));
    CHECK(hit.sym == NULL);
    CHECK(ends_with(hit.module, "/libsym_stripped.so"));
    /* module+0xOFFSET is the file's own address: the same in both copies. */
    CHECK(gg_elfsym_lookup((uintptr_t)full_local_of() + 2, &full_hit));
    CHECK_EQ_U64(local + 2 - hit.bias, (uintptr_t)full_local_of() + 2 - full_hit.bias);
    CHECK_STR(name_at(exported + 1), "exported_fn");              /* .dynsym still names */
}

static int libstdcxx_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "libstdc++"))
        *(bool *)arg = true;
    return 0;
}

/* Before any C++ library is loaded: no demangler, names stay as they are. */
static void test_no_demangler_yet(void)
{
    char out[64] = "untouched";
    bool loaded = false;
    dl_iterate_phdr(libstdcxx_cb, &loaded);
    if (loaded) {                          /* under ASan, say */
        printf("  (libstdc++ already loaded: nothing to check)\n");
        return;
    }
    CHECK(!gg_elfsym_demangle("_ZN7gg_test6cxx_fnEi", out, sizeof out));
    CHECK_STR(out, "untouched");
}

static void test_cxx_demangled(void)
{
    void *h = load("libsymcxx.so");       /* RTLD_LOCAL, and libstdc++ with it */
    uintptr_t f = (uintptr_t)fn(h, "_ZN7gg_test6cxx_fnEi");
    uintptr_t t = (uintptr_t)fn(h, "_ZN7gg_test5twiceIiEET_S1_");
    uintptr_t g = (uintptr_t)fn(h, "_ZNK7gg_test3Box3getEv");
    if (!f || !t || !g) {
        CHECK(0);
        return;
    }
    CHECK_STR(name_at(f + 1), "gg_test::cxx_fn(int)");
    CHECK_STR(name_at(t), "int gg_test::twice<int>(int)");
    CHECK_STR(name_at(g + 1), "gg_test::Box::get() const");
    CHECK_STR(name_at(f + 1), "gg_test::cxx_fn(int)");            /* cached */
    char out[12];
    CHECK(gg_elfsym_demangle("_ZN7gg_test6cxx_fnEi", out, sizeof out));
    CHECK_STR(out, "gg_test::cx");                                /* cut to fit */
    CHECK(!gg_elfsym_demangle("exported_fn", out, sizeof out));
    CHECK(!gg_elfsym_demangle("_Znot valid", out, sizeof out));
    /* Unloaded: the names given out stay valid (they are copies). */
    const char *name = name_at(f + 1);
    dlclose(h);
    CHECK_STR(name, "gg_test::cxx_fn(int)");
}

int main(void);

static __attribute__((noinline)) int own_static(int x)
{
    return x * 7 + 1;
}

static void test_main_program(void)
{
    struct gg_elfsym_hit hit;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';
    CHECK(own_static(1) == 8);
    CHECK(gg_elfsym_lookup((uintptr_t)own_static + 1, &hit));
    CHECK_STR(hit.sym, "own_static");
    CHECK_STR(hit.module, exe);
    CHECK(hit.bias != 0);                  /* PIE: loaded away from its file address */
    CHECK_STR(name_at((uintptr_t)main + 1), "main");
}

static void test_non_pie(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(path_of("nopie"), "nopie", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_outside_modules(void)
{
    struct gg_elfsym_hit hit;
    CHECK(!gg_elfsym_lookup(0x1000, &hit));
    void *anon = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(anon != MAP_FAILED && !gg_elfsym_lookup((uintptr_t)anon + 8, &hit));
    CHECK(hit.sym == NULL && hit.module == NULL);
    munmap(anon, 4096);
}

/* Threads naming addresses at once, in a module none has read yet (a copy
 * of libsym.so): run under ThreadSanitizer by make test-tsan. */
static uintptr_t copy_exported, copy_aligned;

static void *look_up(void *arg)
{
    long *bad = arg;
    for (int i = 0; i < 300; i++) {
        if (strcmp(name_at(copy_exported + 1), "exported_fn") != 0 ||
            strcmp(name_at(copy_aligned - 1), "") != 0 ||
            strcmp(name_at((uintptr_t)main + 1), "main") != 0)
            ++*bad;
    }
    return NULL;
}

static void test_threads(void)
{
    char copy[PATH_MAX + 64], cmd[3 * PATH_MAX];
    snprintf(copy, sizeof copy, "%s/libsym_copy.so", dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path_of("libsym.so"), copy);
    CHECK(system(cmd) == 0);
    void *h = dlopen(copy, RTLD_NOW | RTLD_LOCAL);
    copy_exported = (uintptr_t)fn(h, "exported_fn");
    copy_aligned = (uintptr_t)fn(h, "aligned_fn");
    if (!copy_exported || !copy_aligned) {
        CHECK(0);
        return;
    }
    pthread_t t[4];
    long bad[4] = { 0 };
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, look_up, &bad[i]) == 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ_U64(bad[i], 0);
    }
    unlink(copy);
}

/* ---- corrupt files ------------------------------------------------------ */

static uint8_t *image;
static size_t image_size;
static char tmp_path[PATH_MAX + 64];

static long try_file(const uint8_t *bytes, size_t size, uint64_t vaddr, char *name)
{
    int fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || (size && write(fd, bytes, size) != (ssize_t)size)) {
        CHECK(0);
        if (fd >= 0)
            close(fd);
        return -2;
    }
    close(fd);
    return gg_elfsym_test_file(tmp_path, vaddr, name, 64);
}

static void test_corrupt_files(void)
{
    int fd = open(path_of("libsym.so"), O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        CHECK(0);
        return;
    }
    image_size = (size_t)st.st_size;
    image = malloc(image_size);
    CHECK(read(fd, image, image_size) == (ssize_t)image_size);
    close(fd);
    snprintf(tmp_path, sizeof tmp_path, "%s/corrupt.so", dir);

    /* The file as it is: exported_fn at its file address. */
    Elf64_Ehdr eh;
    memcpy(&eh, image, sizeof eh);
    Elf64_Shdr *sh = (Elf64_Shdr *)(image + eh.e_shoff);
    int symtab = -1;
    for (int i = 0; i < eh.e_shnum; i++)
        if (sh[i].sh_type == SHT_SYMTAB)
            symtab = i;
    CHECK(symtab > 0);
    if (symtab <= 0)
        return;
    int strtab = (int)sh[symtab].sh_link;
    uint64_t vaddr = 0;
    const Elf64_Sym *syms = (const Elf64_Sym *)(image + sh[symtab].sh_offset);
    for (size_t i = 0; i < sh[symtab].sh_size / sizeof *syms; i++)
        if (strcmp((const char *)image + sh[strtab].sh_offset + syms[i].st_name, "exported_fn") == 0)
            vaddr = syms[i].st_value;
    char name[64];
    long good = try_file(image, image_size, vaddr + 1, name);
    CHECK(good >= 5);
    CHECK_STR(name, "exported_fn");

    uint8_t *bad = malloc(image_size);
    /* Truncated anywhere: rejected or fewer symbols, never more. */
    for (size_t cut = 0; cut < image_size; cut += (cut < 128 ? 1 : 61)) {
        long n = try_file(image, cut, vaddr + 1, name);
        CHECK(n <= good);
    }
    try_file(image, eh.e_shoff + sizeof *sh * (size_t)symtab + 8, vaddr, name);

    /* One field at a time, to values that point anywhere. */
    static const uint64_t values[] = { 0, 1, 7, 23, 24, 0xff00, 0xffff, 0x7fffffff,
                                       0xffffffff, 0x100000000ull, ~0ull, ~0ull - 23 };
    struct { size_t off, size; } fields[] = {
        { offsetof(Elf64_Ehdr, e_shoff), 8 }, { offsetof(Elf64_Ehdr, e_shnum), 2 },
        { offsetof(Elf64_Ehdr, e_shentsize), 2 }, { offsetof(Elf64_Ehdr, e_phoff), 8 },
        { offsetof(Elf64_Ehdr, e_phnum), 2 }, { offsetof(Elf64_Ehdr, e_phentsize), 2 },
    };
    size_t nfields = sizeof fields / sizeof fields[0];
    for (size_t s = 0; s < 2; s++) {
        size_t base = eh.e_shoff + (size_t)(s ? strtab : symtab) * sizeof *sh;
        size_t shf[][2] = { { offsetof(Elf64_Shdr, sh_type), 4 }, { offsetof(Elf64_Shdr, sh_offset), 8 },
                            { offsetof(Elf64_Shdr, sh_size), 8 }, { offsetof(Elf64_Shdr, sh_link), 4 },
                            { offsetof(Elf64_Shdr, sh_entsize), 8 }, { offsetof(Elf64_Shdr, sh_addr), 8 } };
        for (size_t f = 0; f < sizeof shf / sizeof shf[0]; f++)
            for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
                memcpy(bad, image, image_size);
                memcpy(bad + base + shf[f][0], &values[v], shf[f][1]);
                try_file(bad, image_size, vaddr + 1, name);
            }
    }
    for (size_t f = 0; f < nfields; f++)
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            memcpy(bad, image, image_size);
            memcpy(bad + fields[f].off, &values[v], fields[f].size);
            try_file(bad, image_size, vaddr + 1, name);
        }

    /* Every symbol pointing anywhere: names out of the table, absolute or
     * huge values and sizes are dropped, the rest stay inside their text. */
    size_t nsyms = sh[symtab].sh_size / sizeof *syms;
    for (size_t field = 0; field < 4; field++) {
        memcpy(bad, image, image_size);
        Elf64_Sym *bs = (Elf64_Sym *)(bad + sh[symtab].sh_offset);
        for (size_t i = 0; i < nsyms; i++) {
            if (field == 0) bs[i].st_name = 0xfffffff0u;
            if (field == 1) bs[i].st_shndx = SHN_ABS;
            if (field == 2) bs[i].st_value = ~0ull - 4;
            if (field == 3) bs[i].st_size = ~0ull;
        }
        CHECK_EQ_U64(try_file(bad, image_size, vaddr + 1, name), 0);
    }
    /* The string table without its last NUL: names still end. */
    memcpy(bad, image, image_size);
    memset(bad + sh[strtab].sh_offset + sh[strtab].sh_size - 16, 'x', 16);
    CHECK(try_file(bad, image_size, vaddr + 1, name) == good);

    /* Random bytes flipped in the headers and tables, deterministically. */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    size_t regions[][2] = {
        { 0, sizeof eh }, { eh.e_shoff, (size_t)eh.e_shnum * sizeof *sh },
        { sh[symtab].sh_offset, sh[symtab].sh_size }, { sh[strtab].sh_offset, sh[strtab].sh_size },
    };
    for (int round = 0; round < 400; round++) {
        memcpy(bad, image, image_size);
        for (int k = 0; k < 1 + round % 16; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t *r = regions[x % 4];
            bad[r[0] + (x >> 8) % r[1]] ^= (uint8_t)(1u << ((x >> 40) & 7));
        }
        try_file(bad, image_size, vaddr + 1, name);
        CHECK(strlen(name) < 64);
    }
    unlink(tmp_path);
    free(bad);
    free(image);
}

int main(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = '\0';
    snprintf(dir, sizeof dir, "%s/../elfsym", dirname(self));
    RUN(test_inside_extents);
    RUN(test_padding_is_nameless);
    RUN(test_stripped);
    RUN(test_no_demangler_yet);
    RUN(test_cxx_demangled);
    RUN(test_main_program);
    RUN(test_non_pie);
    RUN(test_outside_modules);
    RUN(test_threads);
    RUN(test_corrupt_files);
    return unit_done();
}
