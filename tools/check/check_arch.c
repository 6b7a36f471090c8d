/* check_arch.c - gpuguard-check's device-code check (see check_arch.h). */
#include "check_arch.h"

#include <cuda.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fatbin.h"
#include "origin.h"

#define EXIT_OK 0
#define EXIT_PROBLEM 1
#define EXIT_USAGE 2
#define MAX_GPUS 64
#define MAX_TORCH_LIBS 64
#define PYTHON_TIMEOUT_MS 20000

/* ---- the GPUs ------------------------------------------------------------ */

struct gpu {
    int index;
    char name[256];
    int major, minor;
};

/* The visible GPUs through libcuda.so.1; -1 (said on stderr when `loud`)
 * when there is no driver or no GPU. */
static int list_gpus(struct gpu *g, int max, bool loud)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        if (loud)
            fprintf(stderr, "gpuguard-check: no CUDA driver (libcuda.so.1 not found)\n");
        return -1;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(lib, "cuInit");
    CUresult (*count)(int *) = (CUresult(*)(int *))dlsym(lib, "cuDeviceGetCount");
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(lib, "cuDeviceGet");
    CUresult (*name)(char *, int, CUdevice) =
        (CUresult(*)(char *, int, CUdevice))dlsym(lib, "cuDeviceGetName");
    CUresult (*attr)(int *, CUdevice_attribute, CUdevice) =
        (CUresult(*)(int *, CUdevice_attribute, CUdevice))dlsym(lib, "cuDeviceGetAttribute");
    int n = 0;
    if (!init || !count || !get || !name || !attr || init(0) != CUDA_SUCCESS ||
        count(&n) != CUDA_SUCCESS || n <= 0) {
        if (loud)
            fprintf(stderr, "gpuguard-check: no CUDA devices to judge against\n");
        return -1;
    }
    if (n > max)
        n = max;
    for (int i = 0; i < n; i++) {
        CUdevice d;
        g[i].index = i;
        if (get(&d, i) != CUDA_SUCCESS || name(g[i].name, sizeof g[i].name - 1, d) != CUDA_SUCCESS ||
            attr(&g[i].major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d) != CUDA_SUCCESS ||
            attr(&g[i].minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d) != CUDA_SUCCESS) {
            if (loud)
                fprintf(stderr, "gpuguard-check: cannot read GPU %d from the driver\n", i);
            return -1;
        }
        g[i].name[sizeof g[i].name - 1] = '\0';
    }
    return n;
}

/* ---- one file against the GPUs --------------------------------------------- */

/* Reads `path`; false (with the line that says why) when there is nothing
 * to judge. *problem: the file could not be read as it should. */
static bool read_lib(const char *path, struct gg_fatbin *fb, bool *problem)
{
    gg_fatbin_init(fb);
    int r = gg_fatbin_read_file(fb, path);
    *problem = false;
    if (r == GG_FATBIN_OK && fb->ncode)
        return true;
    if (r == GG_FATBIN_OK || r == GG_FATBIN_NONE)
        printf("%s: no device code\n", path);
    else if (r == GG_FATBIN_UNREGISTERED)
        printf("%s: %s\n", path, gg_fatbin_strerror(r));
    else if (r == GG_FATBIN_EOPEN) {
        printf("%s: cannot read: %s\n", path, strerror(errno ? errno : EIO));
        *problem = true;
    } else {
        printf("%s: %s (at offset %llu)\n", path, gg_fatbin_strerror(r),
               (unsigned long long)fb->err_off);
        *problem = true;
    }
    return false;
}

/* "runs SASS sm_86" / "runs by JIT from PTX compute_80" / "cannot run: ..." */
static void verdict_text(const struct gg_fatbin_verdict *v, const struct gpu *g, char *out,
                         size_t cap)
{
    char used[32];
    gg_fatbin_code_name(v->used, used, sizeof used);
    if (!v->ok)
        snprintf(out, cap, "CANNOT RUN: no kernel image for sm_%d", g->major * 10 + g->minor);
    else if (v->used.kind == GG_FATBIN_PTX)
        snprintf(out, cap, "runs by JIT compilation of PTX %s", used);
    else
        snprintf(out, cap, "runs SASS %s", used);
}

/* One line per GPU; true when every GPU runs the file. bad[k] (when given):
 * GPU k cannot. */
static bool judge_lib(const char *path, const struct gg_fatbin *fb, const struct gpu *g, int n,
                      bool *bad_cc, bool *bad)
{
    char carries[512], verdict[128];
    bool all = true;
    gg_fatbin_describe(fb, carries, sizeof carries);
    for (int i = 0; i < n; i++) {
        struct gg_fatbin_verdict v;
        gg_fatbin_judge(fb, g[i].major, g[i].minor, &v);
        verdict_text(&v, &g[i], verdict, sizeof verdict);
        printf("%s: GPU %d %s (%d.%d): %s; carries %s\n", path, g[i].index, g[i].name,
               g[i].major, g[i].minor, verdict, carries);
        if (!v.ok) {
            all = false;
            bad_cc[i] = true;
            if (bad)
                bad[i] = true;
        }
    }
    return all;
}

/* ---- the installed PyTorch --------------------------------------------------- */

/* Finds torch without importing it (no CUDA libraries loaded, no side
 * effect): its package directory, its version and CUDA version from
 * torch/version.py. */
static const char torch_probe[] =
    "import importlib.util as u, os, re\n"
    "s = u.find_spec('torch')\n"
    "d = os.path.dirname(s.origin) if s and s.origin else ''\n"
    "v = c = ''\n"
    "try:\n"
    "    t = open(os.path.join(d, 'version.py')).read() if d else ''\n"
    "    m = re.search(r'^__version__\\s*=\\s*[\\'\"]([^\\'\"]*)', t, re.M)\n"
    "    v = m.group(1) if m else ''\n"
    "    m = re.search(r'^cuda\\s*(?::[^=]*)?=\\s*[\\'\"]([^\\'\"]*)', t, re.M)\n"
    "    c = m.group(1) if m else ''\n"
    "except OSError:\n"
    "    pass\n"
    "print(d)\n"
    "print(v)\n"
    "print(c)\n";

struct torch {
    char dir[PATH_MAX];
    char version[64];
    char cuda[32];          /* "" for a CPU-only build */
    int nlibs;
    char *libs[MAX_TORCH_LIBS]; /* files of torch/lib with device code */
    struct gg_fatbin fb[MAX_TORCH_LIBS];
};

static void chomp_line(char **p, char *out, size_t cap)
{
    char *nl = strchr(*p, '\n');
    size_t n = nl ? (size_t)(nl - *p) : strlen(*p);
    snprintf(out, cap, "%.*s", (int)n, *p);
    *p += n + (nl ? 1 : 0);
}

/* python3 on PATH runs the probe, within a time limit. */
static bool find_torch(struct torch *t)
{
    int fd[2];
    char out[2 * PATH_MAX];
    size_t len = 0;
    if (pipe(fd) != 0)
        return false;
    pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return false;
    }
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(fd[1], 1);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 2);
        }
        close(fd[0]);
        execlp("python3", "python3", "-c", torch_probe, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = PYTHON_TIMEOUT_MS - ((now.tv_sec - start.tv_sec) * 1000 +
                                         (now.tv_nsec - start.tv_nsec) / 1000000);
        struct pollfd p = {.fd = fd[0], .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) <= 0) {
            if (left <= 0 || errno != EINTR) {
                kill(pid, SIGKILL);
                len = 0;
                break;
            }
            continue;
        }
        ssize_t n = read(fd[0], out + len, sizeof out - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || (len += (size_t)n) == sizeof out - 1)
            break;
    }
    close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    out[len] = '\0';
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return false;
    char *p = out;
    chomp_line(&p, t->dir, sizeof t->dir);
    chomp_line(&p, t->version, sizeof t->version);
    chomp_line(&p, t->cuda, sizeof t->cuda);
    return t->dir[0] != '\0';
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* The shared libraries of torch/lib that carry device code. */
static void torch_libs(struct torch *t)
{
    char dir[PATH_MAX + 8];
    struct dirent **names;
    snprintf(dir, sizeof dir, "%s/lib", t->dir);
    int n = scandir(dir, &names, NULL, by_name);
    t->nlibs = 0;
    for (int i = 0; i < n; i++) {
        char path[2 * PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (strstr(names[i]->d_name, ".so") && stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
            t->nlibs < MAX_TORCH_LIBS) {
            struct gg_fatbin *fb = &t->fb[t->nlibs];
            gg_fatbin_init(fb);
            if (gg_fatbin_read_file(fb, path) == GG_FATBIN_OK && fb->ncode &&
                (t->libs[t->nlibs] = strdup(path)))
                t->nlibs++;
        }
        free(names[i]);
    }
    if (n >= 0)
        free(names);
}

static void torch_free(struct torch *t)
{
    for (int i = 0; i < t->nlibs; i++)
        free(t->libs[i]);
}

/* ---- a paragraph ----------------------------------------------------------- */

struct para {
    char text[16384];
    size_t len;
};

static void say(struct para *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct para *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->text + p->len, sizeof p->text - p->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        p->len += (size_t)n < sizeof p->text - p->len ? (size_t)n : sizeof p->text - p->len - 1;
}

/* Printed wrapped at 78 columns, words kept whole. */
static void print_para(const struct para *p)
{
    const char *s = p->text;
    while (*s) {
        size_t n = strlen(s), cut = n;
        if (n > 78) {
            cut = 78;
            while (cut > 0 && s[cut] != ' ')
                cut--;
            if (!cut)
                for (cut = 78; s[cut] && s[cut] != ' '; cut++)
                    ;
        }
        printf("%.*s\n", (int)cut, s);
        s += cut;
        while (*s == ' ')
            s++;
    }
}

static const char *base(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* The paragraph on torch; true when every GPU runs all its CUDA libraries. */
static bool torch_paragraph(const struct torch *t, const struct gpu *g, int n)
{
    struct para p = {.len = 0};
    bool all = true;
    say(&p, "PyTorch %s", t->version[0] ? t->version : "(version unknown)");
    if (t->cuda[0])
        say(&p, " (CUDA %s)", t->cuda);
    say(&p, " at %s", t->dir);
    if (!t->nlibs) {
        say(&p, ": %s, so it cannot use the GPU%s: %s.",
            t->cuda[0] ? "no library of torch/lib carries device code"
                       : "a CPU-only build (no CUDA libraries)",
            n > 1 ? "s" : "", gg_fatbin_torch_fix(g[0].major, g[0].minor));
        print_para(&p);
        return false;
    }
    /* What the libraries carry together. */
    struct gg_fatbin all_codes;
    gg_fatbin_init(&all_codes);
    for (int i = 0; i < t->nlibs; i++)
        for (unsigned k = 0; k < t->fb[i].ncode && all_codes.ncode < GG_FATBIN_CODES; k++) {
            bool have = false;
            for (unsigned j = 0; j < all_codes.ncode; j++)
                have |= !memcmp(&all_codes.code[j], &t->fb[i].code[k], sizeof all_codes.code[j]);
            if (!have)
                all_codes.code[all_codes.ncode++] = t->fb[i].code[k];
        }
    all_codes.fatbins = 1;
    char carries[512];
    gg_fatbin_describe(&all_codes, carries, sizeof carries);
    say(&p, ": its CUDA libraries (");
    for (int i = 0; i < t->nlibs; i++)
        say(&p, "%s%s", i ? ", " : "", base(t->libs[i]));
    say(&p, ") carry %s.", carries);
    for (int k = 0; k < n; k++) {
        int bad = 0;
        for (int i = 0; i < t->nlibs; i++) {
            struct gg_fatbin_verdict v;
            gg_fatbin_judge(&t->fb[i], g[k].major, g[k].minor, &v);
            bad += !v.ok;
        }
        say(&p, " GPU %d %s (compute capability %d.%d)", g[k].index, g[k].name, g[k].major,
            g[k].minor);
        if (!bad) {
            say(&p, " runs them.");
            continue;
        }
        all = false;
        say(&p, " cannot: no kernel image for sm_%d in ", g[k].major * 10 + g[k].minor);
        for (int i = 0, said = 0; i < t->nlibs; i++) {
            struct gg_fatbin_verdict v;
            gg_fatbin_judge(&t->fb[i], g[k].major, g[k].minor, &v);
            if (!v.ok)
                say(&p, "%s%s", said++ ? ", " : "", base(t->libs[i]));
        }
        say(&p, ", so the first CUDA kernel fails with \"no kernel image is available for "
                "execution on the device\"; for it, %s.",
            gg_fatbin_torch_fix(g[k].major, g[k].minor));
    }
    print_para(&p);
    return all;
}

void gg_check_arch_torch_paragraph(void)
{
    struct gpu g[MAX_GPUS];
    static struct torch t;
    int n = list_gpus(g, MAX_GPUS, false);
    if (n <= 0 || !find_torch(&t))
        return;
    torch_libs(&t);
    printf("\n");
    torch_paragraph(&t, g, n);
    torch_free(&t);
}

/* ---- --arch ------------------------------------------------------------------ */

/* What to do, per GPU that cannot run some FILE: for a file whose origin is
 * known (a Debian package, a wheel, one of PyTorch's libraries or those it
 * uses), a line in its user's terms, as the shim says it (origin.h,
 * gg_fatbin_fix); PyTorch is "here" when one of the FILEs is PyTorch's.
 * For the others, one line: rebuild them. */
static void fix_lines(int argc, char **argv, const bool *bad, const struct gpu *g, int n,
                      const bool *bad_cc)
{
    struct gg_origin *org = bad ? calloc((size_t)argc, sizeof *org) : NULL;
    int torch = -1;
    for (int i = 0; org && i < argc; i++) {
        gg_origin_of(argv[i], GG_ORIGIN_DPKG, &org[i]);
        if (org[i].torch && torch < 0)
            torch = i;
    }
    for (int k = 0; k < n; k++) {
        int cc = g[k].major * 10 + g[k].minor;
        bool rest = !org && bad_cc[k];
        for (int i = 0; org && i < argc; i++) {
            if (!bad[(size_t)i * n + k])
                continue;
            if (org[i].from == GG_ORIGIN_UNKNOWN && !org[i].what[0]) {
                rest = true;
                continue;
            }
            char who[640], fix[512];
            gg_origin_describe(&org[i], torch >= 0 && !org[i].torch ? &org[torch] : NULL, who,
                               sizeof who);
            gg_fatbin_fix(&org[i], torch >= 0, g[k].major, g[k].minor, fix, sizeof fix);
            printf("GPU %d (sm_%d): %s: %s%sFix: %s\n", g[k].index, cc, argv[i], who,
                   who[0] ? " " : "", fix);
        }
        if (rest)
            printf("GPU %d (sm_%d): rebuild what cannot run with -gencode "
                   "arch=compute_%d,code=sm_%d, or with PTX for compute_%d or older, which the "
                   "driver compiles at load\n",
                   g[k].index, cc, cc, cc, cc);
    }
    free(org);
}

int gg_check_arch(int argc, char **argv)
{
    struct gpu g[MAX_GPUS];
    bool bad_cc[MAX_GPUS] = {false}, problem = false;
    static struct torch t;
    int n = list_gpus(g, MAX_GPUS, true);
    if (n <= 0)
        return EXIT_USAGE;
    if (argc == 0) {
        if (!find_torch(&t)) {
            fprintf(stderr, "gpuguard-check: python3 imports no torch; name the files to check\n");
            return EXIT_USAGE;
        }
        torch_libs(&t);
        for (int i = 0; i < t.nlibs; i++)
            problem |= !judge_lib(t.libs[i], &t.fb[i], g, n, bad_cc, NULL);
        printf("\n");
        problem |= !torch_paragraph(&t, g, n);
        torch_free(&t);
        return problem ? EXIT_PROBLEM : EXIT_OK;
    }
    bool *bad = calloc((size_t)argc * (size_t)n, sizeof *bad); /* bad[file * n + gpu] */
    for (int i = 0; i < argc; i++) {
        static struct gg_fatbin fb;
        bool unreadable;
        if (read_lib(argv[i], &fb, &unreadable))
            problem |= !judge_lib(argv[i], &fb, g, n, bad_cc, bad ? bad + (size_t)i * n : NULL);
        problem |= unreadable;
    }
    fix_lines(argc, argv, bad, g, n, bad_cc);
    free(bad);
    return problem ? EXIT_PROBLEM : EXIT_OK;
}
