/* pysite.c - layer 5: gpuguard's site directory on a Python interpreter's
 * path, at load (see pysite.h). */
#include "pysite.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prim.h"
#include "settings.h"
#include "values.h"

#define TREE_DEPTH 4
#define TREE_ENTRIES 2048

/* At load, on one thread, once. */
static char problem[PATH_MAX + 512];

const char *gg_pysite_problem(void)
{
    return problem[0] ? problem : NULL;
}

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool gg_pysite_find(const char *libdir, char *out, size_t cap)
{
    /* installed (lib/), the source tree's build/ and build/<variant>/ */
    static const char *const tries[] = {"../share/gpuguard/site", "../tools/site",
                                        "../../tools/site"};
    for (size_t i = 0; i < GG_COUNT(tries); i++) {
        char cand[PATH_MAX], a[PATH_MAX + 32], b[PATH_MAX + 32], real[PATH_MAX];
        int n = snprintf(cand, sizeof cand, "%s/%s", libdir, tries[i]);
        if (n <= 0 || (size_t)n >= sizeof cand)
            continue;
        snprintf(a, sizeof a, "%s/sitecustomize.py", cand);
        snprintf(b, sizeof b, "%s/gpuguard/__init__.py", cand);
        if (!is_file(a) || !is_file(b) || !realpath(cand, real) || strlen(real) >= cap)
            continue;
        memcpy(out, real, strlen(real) + 1);
        return true;
    }
    return false;
}

/* Is `dir` one of the entries of the colon-separated path? */
static bool has_entry(const char *path, const char *dir)
{
    size_t len = strlen(dir);
    for (const char *p = path; p && *p;) {
        const char *colon = strchr(p, ':');
        size_t n = colon ? (size_t)(colon - p) : strlen(p);
        if (n == len && memcmp(p, dir, n) == 0)
            return true;
        p = colon ? colon + 1 : NULL;
    }
    return false;
}

bool gg_pysite_pythonpath(const char *old, const char *site, char *out, size_t cap)
{
    if (old && has_entry(old, site))
        return false;
    int n = snprintf(out, cap, "%s%s%s", site, old && *old ? ":" : "", old && *old ? old : "");
    return n > 0 && (size_t)n < cap;
}

unsigned gg_pysite_options(int argc, char *const *argv)
{
    unsigned flags = 0;
    for (int i = 1; i < argc && argv[i]; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || !a[1] || !strcmp(a, "--"))
            break; /* the script, stdin, or the end of the options */
        if (a[1] == '-') {
            if (!strcmp(a, "--check-hash-based-pycs"))
                i++; /* and its value */
            continue;
        }
        for (const char *c = a + 1; *c; c++) {
            if (*c == 'c' || *c == 'm')
                return flags; /* the rest is the command's or the module's */
            if (*c == 'W' || *c == 'X') {
                if (!c[1])
                    i++; /* the option's argument is the next word */
                break;
            }
            flags |= *c == 'I' ? GG_PY_ISOLATED | GG_PY_NO_ENV : *c == 'E' ? GG_PY_NO_ENV
                   : *c == 'S' ? GG_PY_NO_SITE : 0u;
        }
    }
    return flags;
}

/* ---- who could have written it ------------------------------------------------------- */

/* The field `n` (0-based, ':'-separated) of a line of /etc/passwd or
 * /etc/group, into out; false when the line has fewer. */
static bool field(const char *line, int n, char *out, size_t cap)
{
    for (; n > 0 && line; n--) {
        line = strchr(line, ':');
        if (line)
            line++;
    }
    if (!line)
        return false;
    size_t len = strcspn(line, ":\n");
    if (len >= cap)
        return false;
    memcpy(out, line, len);
    out[len] = '\0';
    return true;
}

/* The line of a small file (/etc/passwd, /etc/group) whose field 2 is id. */
static bool line_of(const char *path, unsigned id, char *out, size_t cap)
{
    FILE *f = fopen(path, "re");
    bool found = false;
    char want[16], got[16];
    snprintf(want, sizeof want, "%u", id);
    while (f && !found && fgets(out, (int)cap, f))
        found = field(out, 2, got, sizeof got) && !strcmp(got, want);
    if (f)
        fclose(f);
    return found;
}

/* Is gid this user's private group (Debian's and Ubuntu's user private
 * groups, where a umask of 002 makes files group-writable): the user's own
 * primary group, named after the user, with no other member listed? Read
 * from /etc/passwd and /etc/group themselves (no name service at load); a
 * group found nowhere there is not. */
static bool private_group(gid_t gid)
{
    char pw[1024], gr[1024], user[256], primary[16], group[256], members[512], want[16];
    if (!line_of("/etc/passwd", (unsigned)geteuid(), pw, sizeof pw) ||
        !line_of("/etc/group", (unsigned)gid, gr, sizeof gr) || !field(pw, 0, user, sizeof user) ||
        !field(pw, 3, primary, sizeof primary) || !field(gr, 0, group, sizeof group))
        return false;
    snprintf(want, sizeof want, "%u", (unsigned)gid);
    if (!field(gr, 3, members, sizeof members))
        members[0] = '\0';
    return !strcmp(primary, want) && !strcmp(user, group) &&
           (!members[0] || !strcmp(members, user));
}

/* One file or directory: owned by root or this user, and written by no one
 * else (an ancestor directory, `above`, may be sticky: others can add to it
 * but not take away or rename what is there; group-writable is the owner's
 * alone in the owner's private group). */
static bool safe_node(const char *path, bool above, char *why, size_t cap)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        snprintf(why, cap, "%s: %s", path, strerror(errno));
        return false;
    }
    uid_t me = geteuid();
    if (st.st_uid != 0 && st.st_uid != me) {
        snprintf(why, cap, "%s belongs to uid %u", path, (unsigned)st.st_uid);
        return false;
    }
    if (S_ISLNK(st.st_mode)) {
        snprintf(why, cap, "%s is a symbolic link", path);
        return false;
    }
    bool sticky_dir = S_ISDIR(st.st_mode) && (st.st_mode & S_ISVTX);
    mode_t others = st.st_mode & 022;
    if (others == 020 && st.st_uid == me && private_group(st.st_gid))
        others = 0;
    if (others && !(above && sticky_dir)) {
        snprintf(why, cap, "%s is writable by %s (mode %03o)", path,
                 st.st_mode & 002 ? "every user" : "its group", (unsigned)(st.st_mode & 0777));
        return false;
    }
    return true;
}

/* Is dir (real) libdir (real) or above it? */
static bool holds(const char *dir, const char *libdir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/')
        return true;
    return !strncmp(dir, libdir, n) && (libdir[n] == '/' || libdir[n] == '\0');
}

/* real, then each directory above it, up to the first that holds libdir. */
static bool safe_chain(const char *real, const char *libdir, char *why, size_t cap)
{
    char p[PATH_MAX];
    if (strlen(real) >= sizeof p || real[0] != '/') {
        snprintf(why, cap, "%s: not an absolute path", real);
        return false;
    }
    memcpy(p, real, strlen(real) + 1);
    for (bool first = true;; first = false) {
        if (!safe_node(p, !first, why, cap))
            return false;
        if (holds(p, libdir))
            return true;
        char *slash = strrchr(p, '/');
        if (slash == p)
            p[1] = '\0';
        else
            *slash = '\0';
    }
}

/* Everything under dir, its own files and directories (never a link), at
 * most TREE_DEPTH deep and TREE_ENTRIES in all. */
static bool safe_tree(const char *dir, int depth, int *budget, char *why, size_t cap)
{
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(why, cap, "%s: %s", dir, strerror(errno));
        return false;
    }
    bool ok = true;
    for (struct dirent *e; ok && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[PATH_MAX];
        if (--*budget < 0 || snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) {
            snprintf(why, cap, "%s: too many files to check", dir);
            ok = false;
            break;
        }
        struct stat st;
        ok = safe_node(p, false, why, cap) && lstat(p, &st) == 0;
        if (ok && S_ISDIR(st.st_mode)) {
            if (depth >= TREE_DEPTH) {
                snprintf(why, cap, "%s: too deep to check", p);
                ok = false;
            } else {
                ok = safe_tree(p, depth + 1, budget, why, cap);
            }
        }
    }
    closedir(d);
    return ok;
}

bool gg_pysite_trusted(const char *site, const char *libdir, char *why, size_t cap)
{
    int budget = TREE_ENTRIES;
    if (cap)
        why[0] = '\0';
    if (!safe_chain(site, libdir, why, cap))
        return false;
    DIR *d = opendir(site);
    if (!d) {
        snprintf(why, cap, "%s: %s", site, strerror(errno));
        return false;
    }
    bool ok = true;
    /* What it holds; the source tree's entries are links into tools/python,
     * whose own directories are then checked the same way. */
    for (struct dirent *e; ok && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[PATH_MAX], real[PATH_MAX];
        struct stat st;
        if (snprintf(p, sizeof p, "%s/%s", site, e->d_name) >= (int)sizeof p ||
            lstat(p, &st) != 0) {
            snprintf(why, cap, "%s/%s: cannot check it", site, e->d_name);
            ok = false;
            break;
        }
        if (S_ISLNK(st.st_mode)) {
            ok = realpath(p, real) != NULL && safe_chain(real, libdir, why, cap);
            if (!ok && !why[0])
                snprintf(why, cap, "%s: %s", p, strerror(errno));
            if (ok && stat(real, &st) == 0 && S_ISDIR(st.st_mode))
                ok = safe_tree(real, 1, &budget, why, cap);
        } else {
            ok = safe_node(p, false, why, cap);
            if (ok && S_ISDIR(st.st_mode))
                ok = safe_tree(p, 1, &budget, why, cap);
        }
    }
    closedir(d);
    return ok;
}

/* ---- is this Python's own program? ------------------------------------------------------ */

struct exe_syms {
    bool bytes_main, main;
};

static uintptr_t at(uintptr_t v, uintptr_t base)
{
    /* glibc relocates the main program's dynamic entries on most targets,
     * not on all: an address below the load base is still the file's */
    return v < base ? v + base : v;
}

/* The number of symbols a GNU hash table covers. */
static size_t gnu_count(const uint32_t *h)
{
    uint32_t nbuckets = h[0], symoffset = h[1], bloom = h[2];
    if (!nbuckets || nbuckets > (1u << 24) || bloom > (1u << 24))
        return 0;
    const uint32_t *buckets = (const uint32_t *)((const uint64_t *)(h + 4) + bloom);
    const uint32_t *chains = buckets + nbuckets;
    uint32_t last = 0;
    for (uint32_t b = 0; b < nbuckets; b++)
        if (buckets[b] > last)
            last = buckets[b];
    if (last < symoffset)
        return symoffset;
    for (uint32_t i = last - symoffset; i < (1u << 24); i++)
        if (chains[i] & 1)
            return symoffset + i + 1;
    return 0;
}

/* Py_BytesMain (3.8+), _Py_UnixMain (3.7) and Py_Main (3.6, and Python 2)
 * among the main program's dynamic symbols, defined there (a static
 * libpython) or imported (a shared one). */
static int main_program(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    struct exe_syms *out = arg;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn)
        return 1;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    size_t strsz = 0, count = 0;
    for (const ElfW(Dyn) *d = dyn; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)at(d->d_un.d_ptr, info->dlpi_addr); break;
        case DT_STRTAB: strtab = (const char *)at(d->d_un.d_ptr, info->dlpi_addr); break;
        case DT_STRSZ: strsz = d->d_un.d_val; break;
        case DT_HASH: count = ((const uint32_t *)at(d->d_un.d_ptr, info->dlpi_addr))[1]; break;
        case DT_GNU_HASH:
            if (!count)
                count = gnu_count((const uint32_t *)at(d->d_un.d_ptr, info->dlpi_addr));
            break;
        default: break;
        }
    }
    if (!symtab || !strtab || count > (1u << 24))
        return 1;
    for (size_t i = 0; i < count; i++) {
        size_t name = symtab[i].st_name;
        if (!name || name >= strsz)
            continue;
        const char *s = strtab + name;
        if (strnlen(s, strsz - name) == strsz - name)
            continue; /* not terminated within the table */
        if (!strcmp(s, "Py_BytesMain") || !strcmp(s, "_Py_UnixMain"))
            out->bytes_main = true; /* 3.8 and later; 3.7 */
        else if (!strcmp(s, "Py_Main"))
            out->main = true;
    }
    return 1; /* the first object is the main program: no other */
}

bool gg_pysite_is_interpreter(void)
{
    struct exe_syms s = {false, false};
    dl_iterate_phdr(main_program, &s);
    /* Py_BytesMain: 3.8 and later; _Py_UnixMain: 3.7; Py_Main alone: 3.6
     * and before, and Python 2, which has no PyOS_FSPath (3.6) */
    return s.bytes_main || (s.main && gg_real_dlsym(RTLD_DEFAULT, "PyOS_FSPath"));
}

/* ---- at load --------------------------------------------------------------------------------- */

bool gg_pysite_load(int argc, char **argv)
{
    const char *v = getenv(gg_setting_info[GG_SET_torch].env);
    const char *why;
    bool on = false;
    problem[0] = '\0';
    if (gg_secure() || !v || gg_value_bool(v, &on, &why) != 0 || !on || gg_settings_env_off())
        return false; /* a bad value is said when the shim starts (GPUGUARD_TORCH is not valid) */
    if (!gg_real_dlsym(RTLD_DEFAULT, "Py_IsInitialized") || !gg_pysite_is_interpreter())
        return false; /* not a Python interpreter's own program */
    if (argc > 0 && argv && gg_pysite_options(argc, argv))
        return false; /* -I, -E: PYTHONPATH is ignored; -S: no sitecustomize */
    Dl_info info;
    static char lib[PATH_MAX], site[PATH_MAX], path[2 * PATH_MAX], reason[PATH_MAX + 128];
    if (!dladdr((void *)&gg_pysite_load, &info) || !info.dli_fname || !realpath(info.dli_fname, lib))
        return false;
    char *slash = strrchr(lib, '/');
    if (!slash)
        return false;
    if (slash == lib)
        slash[1] = '\0'; /* a library in / */
    else
        *slash = '\0';
    if (!gg_pysite_find(lib, site, sizeof site))
        return false;
    const char *old = getenv("PYTHONPATH");
    if (old && has_entry(old, site))
        return false;
    reason[0] = '\0';
    if (!gg_pysite_trusted(site, lib, reason, sizeof reason)) {
        snprintf(problem, sizeof problem,
                 "GPUGUARD_TORCH=1: Python is not instrumented: gpuguard's site directory %s "
                 "could have been written by another user: %s (it, what it holds and the "
                 "directories above it must belong to root or this user, writable by no one "
                 "else)", site, reason);
        return false;
    }
    if (!gg_pysite_pythonpath(old, site, path, sizeof path))
        return false;
    return setenv("PYTHONPATH", path, 1) == 0;
}

/* At load, before the interpreter reads its environment; glibc hands a
 * constructor the program's arguments. */
__attribute__((constructor)) static void at_load(int argc, char **argv, char **envp)
{
    (void)envp;
    (void)gg_pysite_load(argc, argv);
}
