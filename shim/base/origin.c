/* origin.c - where a library comes from (see origin.h). */
#include "origin.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_CAP 1024 /* longer paths are not looked up: this runs on any thread's stack */
#define MAX_LISTS 16 /* dpkg lists looked into for one library */
#define MAX_NAMES 4  /* wheel names tried for one file */

/* ---- what a library is, by its name ---------------------------------------------- */

/* The prefixes end where the name may go on: "libtorch" is not libtorchaudio. */
static const struct known {
    const char *prefix, *what, *wheel; /* wheel: the one PyTorch's CUDA wheels bring it in */
    bool torch;
} known[] = {
    {"libtorch.", "PyTorch", NULL, true},      {"libtorch_", "PyTorch", NULL, true},
    {"libc10.", "PyTorch", NULL, true},        {"libc10_", "PyTorch", NULL, true},
    {"libcaffe2_", "PyTorch", NULL, true},     {"libnccl.", "NCCL", "nvidia-nccl-cu12", false},
    {"libcudnn", "cuDNN", "nvidia-cudnn-cu12", false},
    {"libcublas", "cuBLAS", "nvidia-cublas-cu12", false},
    {"libcusparseLt", "cuSPARSELt", "nvidia-cusparselt-cu12", false},
    {"libcusparse.", "cuSPARSE", "nvidia-cusparse-cu12", false},
    {"libcufft", "cuFFT", "nvidia-cufft-cu12", false},
    {"libcurand", "cuRAND", "nvidia-curand-cu12", false},
    {"libcusolver", "cuSOLVER", "nvidia-cusolver-cu12", false},
    {"libgloo", "Gloo", NULL, false},
};

static const char *base_of(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static const struct known *known_of(const char *path)
{
    const char *b = base_of(path);
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strncmp(b, known[i].prefix, strlen(known[i].prefix)))
            return &known[i];
    return NULL;
}

/* ---- a text file, line by line ---------------------------------------------------- */

struct lines {
    int fd;
    size_t pos, len;
    char buf[4096];
};

static bool lines_open(struct lines *r, const char *path)
{
    int fd;
    struct stat st;
    do
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return false;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { /* a FIFO would block */
        close(fd);
        return false;
    }
    r->fd = fd;
    r->pos = r->len = 0;
    return true;
}

static void lines_close(struct lines *r)
{
    close(r->fd);
}

/* The next line, without its newline, cut to cap - 1 bytes (the rest
 * skipped); false at the end of the file or on an error. */
static bool lines_next(struct lines *r, char *out, size_t cap)
{
    size_t n = 0;
    bool any = false;
    for (;;) {
        if (r->pos == r->len) {
            ssize_t k;
            do
                k = read(r->fd, r->buf, sizeof r->buf);
            while (k < 0 && errno == EINTR);
            if (k <= 0)
                break; /* the last line may have no newline */
            r->pos = 0;
            r->len = (size_t)k;
        }
        char c = r->buf[r->pos++];
        any = true;
        if (c == '\n')
            break;
        if (n + 1 < cap)
            out[n++] = c;
    }
    out[n] = '\0';
    return any;
}

/* a "/" b (or a b when b starts with "/"), false when it does not fit:
 * such a path is not looked up. */
static bool join(char *out, size_t cap, const char *a, const char *b)
{
    int n = snprintf(out, cap, "%s%s%s", a, b[0] == '/' ? "" : "/", b);
    return n >= 0 && (size_t)n < cap;
}

static void copy(char *out, size_t cap, const char *s, size_t n)
{
    if (n >= cap)
        n = cap - 1;
    memcpy(out, s, n);
    out[n] = '\0';
}

/* ---- Debian packages ---------------------------------------------------------------- */

/* Does dpkg's list `file` name one of the paths? */
static bool list_has(const char *file, const char *const *paths, int npaths)
{
    struct lines r;
    char line[PATH_CAP];
    bool found = false;
    if (!lines_open(&r, file))
        return false;
    while (!found && lines_next(&r, line, sizeof line))
        for (int i = 0; i < npaths && !found; i++)
            found = !strcmp(line, paths[i]);
    lines_close(&r);
    return found;
}

/* The version of an installed package (of architecture `arch`, when its
 * list named one), from dpkg's status file. */
static void deb_version(const char *dpkg, const char *pkg, const char *arch, char *out, size_t cap)
{
    char file[PATH_CAP], line[512], version[64] = "";
    struct lines r;
    bool in = false, arch_ok = !arch[0];
    out[0] = '\0';
    if (!join(file, sizeof file, dpkg, "status") || !lines_open(&r, file))
        return;
    while (lines_next(&r, line, sizeof line)) {
        if (!line[0]) { /* the end of a package's stanza */
            if (in && arch_ok && version[0])
                break;
            in = false;
            arch_ok = !arch[0];
            version[0] = '\0';
        } else if (!strncmp(line, "Package: ", 9)) {
            in = !strcmp(line + 9, pkg);
        } else if (in && !strncmp(line, "Version: ", 9)) {
            copy(version, sizeof version, line + 9, strlen(line + 9));
        } else if (in && arch[0] && !strncmp(line, "Architecture: ", 14)) {
            arch_ok = !strcmp(line + 14, arch);
        }
    }
    lines_close(&r);
    if (in && arch_ok && version[0])
        copy(out, cap, version, strlen(version));
}

/* The package whose list names the file: the lists of the packages named
 * like the library (libnccl.so.2: libnccl*, libtorch_cuda.so.2.6:
 * libtorch-cuda*). */
static bool deb_of(const char *path, const char *dpkg, struct gg_origin *o)
{
    char usr[PATH_CAP], stem[64], dir[PATH_CAP];
    const char *paths[2] = {path, usr};
    int npaths = 1;
    if (path[0] != '/')
        return false;
    if (!strncmp(path, "/lib", 4) || !strncmp(path, "/bin/", 5) || !strncmp(path, "/sbin/", 6)) {
        npaths = join(usr, sizeof usr, "/usr", path) ? 2 : 1; /* merged /usr: dpkg lists /usr/lib */
    }
    /* Debian names a library's package after it, '_' made '-'. */
    const char *b = base_of(path), *so = strstr(b, ".so");
    size_t n = so ? (size_t)(so - b) : strlen(b);
    if (n < 4 || n >= sizeof stem)
        return false;
    for (size_t i = 0; i < n; i++)
        stem[i] = b[i] == '_' ? '-' : (char)(b[i] >= 'A' && b[i] <= 'Z' ? b[i] + 32 : b[i]);
    stem[n] = '\0';
    DIR *d = join(dir, sizeof dir, dpkg, "info") ? opendir(dir) : NULL;
    if (!d)
        return false;
    struct dirent *e;
    int looked = 0;
    bool found = false;
    while (!found && looked < MAX_LISTS && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len <= 5 || strcmp(e->d_name + len - 5, ".list") || strncmp(e->d_name, stem, n))
            continue;
        char file[PATH_CAP];
        looked++;
        if (!join(file, sizeof file, dir, e->d_name) || !list_has(file, paths, npaths))
            continue;
        found = true;
        char name[128];
        copy(name, sizeof name, e->d_name, len - 5);
        char *colon = strchr(name, ':'); /* libtorch-cuda-2.6:amd64 */
        const char *arch = "";
        if (colon) {
            *colon = '\0';
            arch = colon + 1;
        }
        o->from = GG_ORIGIN_DEB;
        copy(o->package, sizeof o->package, name, strlen(name));
        deb_version(dpkg, name, arch, o->version, sizeof o->version);
    }
    closedir(d);
    return found;
}

/* ---- wheels ---------------------------------------------------------------------------- */

/* Does the wheel's RECORD (lines "path,hash,size") name `rel`? */
static bool record_has(const char *distinfo, const char *rel)
{
    char file[PATH_CAP], line[PATH_CAP];
    struct lines r;
    size_t n = strlen(rel);
    bool found = false;
    if (!join(file, sizeof file, distinfo, "RECORD") || !lines_open(&r, file))
        return false;
    while (!found && lines_next(&r, line, sizeof line))
        found = !strncmp(line, rel, n) && line[n] == ',';
    lines_close(&r);
    return found;
}

/* A .dist-info directory's project name (up to its first '-') against a
 * wanted one, case and '-', '_', '.' alike; `prefix`: the wanted name is
 * followed by digits only (nvidia_nccl_cu + 12). */
static bool name_is(const char *name, size_t len, const char *want, bool prefix)
{
    size_t w = strlen(want);
    if (len < w)
        return false;
    for (size_t i = 0; i < w; i++) {
        char a = name[i], b = want[i];
        if (a == '-' || a == '.')
            a = '_';
        if (a >= 'A' && a <= 'Z')
            a = (char)(a + 32);
        if (a != b)
            return false;
    }
    if (!prefix)
        return len == w;
    for (size_t i = w; i < len; i++)
        if (name[i] < '0' || name[i] > '9')
            return false;
    return len > w;
}

static bool wheel_of(const char *path, struct gg_origin *o)
{
    const char *at = NULL;
    for (const char *p = path; (p = strstr(p, "-packages/")); p++)
        if (p - path >= 5 && (!strncmp(p - 5, "/site", 5) || !strncmp(p - 5, "/dist", 5)))
            at = p;
    if (!at)
        return false;
    const char *rel = at + strlen("-packages/");
    char dir[PATH_CAP], names[MAX_NAMES][96];
    int nnames = 0;
    bool prefix = false;
    copy(dir, sizeof dir, path, (size_t)(rel - 1 - path));
    if (!strncmp(rel, "torch/", 6)) {
        snprintf(names[nnames++], sizeof names[0], "torch");
    } else if (!strncmp(rel, "nvidia/", 7) && strchr(rel + 7, '/')) {
        /* nvidia/nccl/lib/libnccl.so.2: nvidia_nccl_cu12 */
        int sub = (int)(strchr(rel + 7, '/') - (rel + 7));
        snprintf(names[nnames++], sizeof names[0], "nvidia_%.*s_cu", sub, rel + 7);
        prefix = true;
    } else {
        /* flash_attn/... or flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so:
         * flash_attn_2_cuda, flash_attn_2, flash_attn */
        size_t n = strcspn(rel, "/.");
        char lead[96];
        copy(lead, sizeof lead, rel, n);
        for (char *c = lead; *c; c++)
            *c = *c == '-' ? '_' : (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
        while (nnames < MAX_NAMES && strlen(lead) >= 3) {
            snprintf(names[nnames++], sizeof names[0], "%s", lead);
            char *cut = strrchr(lead, '_');
            if (!cut)
                break;
            *cut = '\0';
        }
    }
    DIR *d = opendir(dir);
    if (!d)
        return false;
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(d))) {
        size_t len = strlen(e->d_name), tail = strlen(".dist-info");
        if (len <= tail || strcmp(e->d_name + len - tail, ".dist-info"))
            continue;
        const char *dash = memchr(e->d_name, '-', len - tail);
        size_t nlen = dash ? (size_t)(dash - e->d_name) : len - tail;
        bool named = false;
        for (int i = 0; i < nnames && !named; i++)
            named = name_is(e->d_name, nlen, names[i], prefix);
        char distinfo[PATH_CAP];
        if (!named || !join(distinfo, sizeof distinfo, dir, e->d_name) ||
            !record_has(distinfo, rel))
            continue;
        found = true;
        o->from = GG_ORIGIN_WHEEL;
        copy(o->package, sizeof o->package, e->d_name, nlen);
        for (char *c = o->package; *c; c++) /* pip's spelling: nvidia-nccl-cu12 */
            *c = *c == '_' ? '-' : (char)(*c >= 'A' && *c <= 'Z' ? *c + 32 : *c);
        if (dash)
            copy(o->version, sizeof o->version, dash + 1, len - tail - nlen - 1);
    }
    closedir(d);
    return found;
}

/* ---- the library ------------------------------------------------------------------------ */

/* Debian's PyTorch: libtorch2.6, libtorch-cuda-2.6, python3-torch-cuda; not
 * libtorchaudio2.6 or python3-torchvision. */
static bool torch_package(const char *p)
{
    if (!strncmp(p, "libtorch", 8))
        return p[8] == '-' || (p[8] >= '0' && p[8] <= '9');
    return !strncmp(p, "python3-torch", 13) && (!p[13] || p[13] == '-');
}

bool gg_origin_of(const char *path, const char *dpkg, struct gg_origin *o)
{
    memset(o, 0, sizeof *o);
    const struct known *k = known_of(path);
    if (k) {
        snprintf(o->what, sizeof o->what, "%s", k->what);
        o->torch = k->torch;
    }
    bool found = false;
    if (!strncmp(path, "/usr/", 5) || !strncmp(path, "/lib", 4))
        found = deb_of(path, dpkg, o);
    if (!found)
        found = wheel_of(path, o);
    if (found) /* what brought it decides whose it is: torchaudio's wheel is not PyTorch */
        o->torch = o->from == GG_ORIGIN_WHEEL ? !strcmp(o->package, "torch")
                                              : torch_package(o->package);
    else if (strstr(path, "/torch/lib/")) /* PyTorch's install, from no wheel found */
        o->torch = true;
    return found;
}

void gg_origin_source(const struct gg_origin *o, char *out, size_t cap)
{
    const char *kind = o->from == GG_ORIGIN_DEB ? "the Debian package" : "the wheel";
    if (o->from == GG_ORIGIN_UNKNOWN)
        snprintf(out, cap, "%s", "");
    else
        snprintf(out, cap, "%s %s%s%s", kind, o->package, o->version[0] ? " " : "", o->version);
}

const char *gg_origin_torch_wheel(const struct gg_origin *o)
{
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(known[i].what, o->what))
            return known[i].wheel;
    return NULL;
}

void gg_origin_describe(const struct gg_origin *o, const struct gg_origin *torch, char *out,
                        size_t cap)
{
    char src[192], tsrc[192];
    gg_origin_source(o, src, sizeof src);
    out[0] = '\0';
    if (o->torch && (!o->what[0] || !strcmp(o->what, "PyTorch")))
        snprintf(out, cap, "It is one of PyTorch's own libraries%s%s.", src[0] ? ", from " : "",
                 src);
    else if (o->torch)
        snprintf(out, cap, "It is %s as PyTorch ships it%s%s.", o->what, src[0] ? ", in " : "",
                 src);
    else if (o->what[0] && torch) {
        gg_origin_source(torch, tsrc, sizeof tsrc);
        snprintf(out, cap, "It is %s%s%s, which PyTorch here%s%s%s uses%s.", o->what,
                 src[0] ? ", from " : "", src, tsrc[0] ? " (" : "", tsrc, tsrc[0] ? ")" : "",
                 !strcmp(o->what, "NCCL") ? " for its multi-GPU collectives (torch.distributed)"
                                          : "");
    } else if (o->what[0])
        snprintf(out, cap, "It is %s%s%s.", o->what, src[0] ? ", from " : "", src);
    else if (src[0])
        snprintf(out, cap, "It comes from %s.", src);
}
