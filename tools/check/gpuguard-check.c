/* gpuguard-check - the GPUs, the policy each one gets, and a policy linter.
 *
 *   gpuguard-check [--policy FILE|DIR]   list each GPU, its policy and limit
 *   gpuguard-check --lint FILE|DIR...    validate policies; exit 1 on a problem
 *
 * Shares the shim's policy code (shim/policy.c). The CUDA driver is loaded at
 * run time with dlopen("libcuda.so.1"): nothing here needs libcuda to link.
 * Exit status: 0 clean, 1 a policy problem, 2 usage or no usable driver.
 */
#include "policy.h"
#include "arch.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GG_EXIT_OK 0
#define GG_EXIT_PROBLEM 1
#define GG_EXIT_USAGE 2

static const char gg_usage[] =
    "usage: gpuguard-check [--policy FILE|DIR]\n"
    "       gpuguard-check --lint FILE|DIR...\n"
    "       gpuguard-check --arch [FILE...]\n"
    "       gpuguard-check --help\n"
    "\n"
    "Without --lint: lists each GPU (through libcuda.so.1) with the policy it gets,\n"
    "its mode, headroom and limit, and the trainer's batch and accumulation; the\n"
    "policies come from --policy, else GPUGUARD_POLICY, else the ones installed\n"
    "beside this program. GPUGUARD_MODE, GPUGUARD_HEADROOM, GPUGUARD_JOURNAL_DIR and\n"
    "GPUGUARD_SIGNAL apply as they do in the shim.\n"
    "\n"
    "--lint: checks each policy file (each *.ini of a directory) and prints\n"
    "FILE:LINE: message for every problem, including a GPU name that two files of\n"
    "one directory both match. Exit status 1 on any problem, 0 when clean.\n"
    "\n"
    "--arch: for each FILE (a library or program) and each GPU, one line saying what\n"
    "device code the file carries and whether the GPU runs it; without FILE, the\n"
    "CUDA libraries of the PyTorch that python3 imports (the listing ends with the\n"
    "same verdict on it). Exit status 1 when a file has nothing some GPU can run.\n"
    "\n"
    "Exit status 2: a bad option, or no usable CUDA driver.\n";

/* Real CUDA device names of common GPUs, to find globs that overlap. */
static const char *const gg_known_names[] = {
    "NVIDIA GeForce RTX 3060", "NVIDIA GeForce RTX 3060 Ti", "NVIDIA GeForce RTX 3060 Laptop GPU",
    "NVIDIA GeForce RTX 3070", "NVIDIA GeForce RTX 3070 Ti", "NVIDIA GeForce RTX 3080",
    "NVIDIA GeForce RTX 3080 Ti", "NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA GeForce RTX 4060", "NVIDIA GeForce RTX 4060 Ti", "NVIDIA GeForce RTX 4070",
    "NVIDIA GeForce RTX 4070 SUPER", "NVIDIA GeForce RTX 4070 Ti",
    "NVIDIA GeForce RTX 4070 Ti SUPER", "NVIDIA GeForce RTX 4080",
    "NVIDIA GeForce RTX 4080 SUPER", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090 D",
    "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 5060",
    "NVIDIA GeForce RTX 5060 Ti", "NVIDIA GeForce RTX 5070", "NVIDIA GeForce RTX 5070 Ti",
    "NVIDIA GeForce RTX 5070 Ti Laptop GPU", "NVIDIA GeForce RTX 5080",
    "NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 5090 D", "NVIDIA GeForce RTX 5090 D v2",
    "NVIDIA GeForce RTX 5090 Laptop GPU", "NVIDIA GeForce RTX 2080 Ti", "NVIDIA TITAN RTX",
    "NVIDIA RTX A4000", "NVIDIA RTX A5000", "NVIDIA RTX A6000",
    "NVIDIA RTX 6000 Ada Generation", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition", "Tesla T4", "Tesla V100-SXM2-16GB",
    "Tesla V100-SXM2-32GB", "Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB",
    "Tesla P100-PCIE-16GB", "NVIDIA A10", "NVIDIA A10G", "NVIDIA A16", "NVIDIA A30",
    "NVIDIA A40", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "NVIDIA A100-SXM4-80GB",
    "NVIDIA A100-SXM-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
    "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe",
    "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA H800", "NVIDIA H800 PCIe",
    "NVIDIA GH200 480GB", "NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA B200", "NVIDIA L4",
    "NVIDIA L40", "NVIDIA L40S",
};

/* ------------------------------------------------------------------------ */
/* Problems                                                                  */

/* Prints each problem once; counts them. */
struct gg_printer {
    int problems;
    char **seen;
    size_t nseen, cap;
};

static bool gg_printer_seen(struct gg_printer *pr, const char *line)
{
    char **grown;

    for (size_t i = 0; i < pr->nseen; i++)
        if (strcmp(pr->seen[i], line) == 0)
            return true;
    if (pr->nseen == pr->cap) {
        size_t cap = pr->cap ? pr->cap * 2 : 16;
        grown = realloc(pr->seen, cap * sizeof *grown);
        if (!grown)
            return false;
        pr->seen = grown;
        pr->cap = cap;
    }
    pr->seen[pr->nseen] = strdup(line);
    if (pr->seen[pr->nseen])
        pr->nseen++;
    return false;
}

static void gg_printer_free(struct gg_printer *pr)
{
    for (size_t i = 0; i < pr->nseen; i++)
        free(pr->seen[i]);
    free(pr->seen);
}

/* FILE:LINE: message, or FILE: message for a problem with no line. */
static void gg_print_problem(void *ctx, const char *file, int line, const char *msg)
{
    struct gg_printer *pr = ctx;
    char text[GG_PATH_MAX + 1024];

    if (line > 0)
        snprintf(text, sizeof text, "%s:%d: %s", file, line, msg);
    else
        snprintf(text, sizeof text, "%s: %s", file, msg);
    if (gg_printer_seen(pr, text))
        return;
    pr->problems++;
    printf("%s\n", text);
}

/* ------------------------------------------------------------------------ */
/* --lint                                                                    */

/* The files of one directory, for the overlap check. */
struct gg_lint_dir {
    struct gg_printer *pr;
    int files;
    struct gg_lint_file {
        char path[GG_PATH_MAX];
        char match[GG_MATCH_MAX];
    } *list;
    size_t n, cap;
};

static int gg_lint_remember(struct gg_lint_dir *ld, const char *path, const char *match)
{
    struct gg_lint_file *f;

    if (ld->n == ld->cap) {
        size_t cap = ld->cap ? ld->cap * 2 : 32;
        struct gg_lint_file *grown = realloc(ld->list, cap * sizeof *grown);
        if (!grown)
            return -1;
        ld->list = grown;
        ld->cap = cap;
    }
    f = &ld->list[ld->n++];
    snprintf(f->path, sizeof f->path, "%s", path);
    snprintf(f->match, sizeof f->match, "%s", match);
    return 0;
}

static int gg_lint_member(void *arg, const char *path, const char *name)
{
    struct gg_lint_dir *ld = arg;
    struct gg_policy p;

    ld->files++;
    gg_policy_load(path, &p, gg_print_problem, ld->pr);
    gg_policy_check_member(path, &p, gg_print_problem, ld->pr);
    if (strcmp(name, "default.ini") != 0 && p.match[0] &&
        gg_lint_remember(ld, path, p.match) != 0) {
        fprintf(stderr, "gpuguard-check: out of memory\n");
        return 2;
    }
    return 0;
}

static const char *gg_base(const char *path)
{
    const char *slash = strrchr(path, '/');

    return slash ? slash + 1 : path;
}

/* A known GPU name that two files of the directory both match. */
static void gg_lint_overlaps(const struct gg_lint_dir *ld)
{
    char msg[1024];

    for (size_t k = 0; k < sizeof gg_known_names / sizeof gg_known_names[0]; k++) {
        const struct gg_lint_file *first = NULL;

        for (size_t i = 0; i < ld->n; i++) {
            const struct gg_lint_file *f = &ld->list[i];

            if (!gg_policy_matches(f->match, gg_known_names[k]))
                continue;
            if (!first) {
                first = f;
                continue;
            }
            snprintf(msg, sizeof msg, "name %s is matched by both %.255s and %.255s (%.255s wins)",
                     gg_known_names[k], gg_base(first->path), gg_base(f->path),
                     gg_base(first->path));
            gg_print_problem(ld->pr, f->path, 0, msg);
        }
    }
}

static int gg_lint_dir(const char *dir, struct gg_printer *pr)
{
    struct gg_lint_dir ld;
    char msg[256];
    int rc;

    memset(&ld, 0, sizeof ld);
    ld.pr = pr;
    rc = gg_policy_dir_each(dir, gg_lint_member, &ld);
    if (rc == -1) {
        snprintf(msg, sizeof msg, "cannot read policy directory: %s", strerror(errno));
        gg_print_problem(pr, dir, 0, msg);
    } else if (ld.files == 0) {
        gg_print_problem(pr, dir, 0, "no policy files (*.ini) in this directory");
    }
    gg_lint_overlaps(&ld);
    free(ld.list);
    return ld.files;
}

static int gg_lint(int argc, char **argv)
{
    struct gg_printer pr;
    int files = 0;

    memset(&pr, 0, sizeof pr);
    for (int i = 0; i < argc; i++) {
        struct stat st;

        if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            files += gg_lint_dir(argv[i], &pr);
        } else {
            struct gg_policy p;
            gg_policy_load(argv[i], &p, gg_print_problem, &pr);
            files++;
        }
    }
    if (pr.problems)
        printf("%d problem%s in %d file%s\n", pr.problems, pr.problems == 1 ? "" : "s", files,
               files == 1 ? "" : "s");
    else
        printf("%d file%s ok\n", files, files == 1 ? "" : "s");
    gg_printer_free(&pr);
    return pr.problems ? GG_EXIT_PROBLEM : GG_EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* The driver                                                                */

struct gg_driver {
    void *lib;
    CUresult (*init)(unsigned int flags);
    CUresult (*count)(int *n);
    CUresult (*get)(CUdevice *dev, int ordinal);
    CUresult (*name)(char *name, int len, CUdevice dev);
    CUresult (*total)(size_t *bytes, CUdevice dev);
    CUresult (*attribute)(int *v, CUdevice_attribute a, CUdevice dev);  /* optional */
    CUresult (*error_name)(CUresult r, const char **s);                 /* optional */
};

static void *gg_sym(struct gg_driver *d, const char *name, bool required)
{
    void *f = dlsym(d->lib, name);

    if (!f && required)
        fprintf(stderr, "gpuguard-check: libcuda.so.1 has no %s\n", name);
    return f;
}

static int gg_driver_open(struct gg_driver *d)
{
    memset(d, 0, sizeof *d);
    d->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!d->lib) {
        fprintf(stderr, "gpuguard-check: no CUDA driver (libcuda.so.1 not found)\n");
        return -1;
    }
    d->init = (CUresult(*)(unsigned int))gg_sym(d, "cuInit", true);
    d->count = (CUresult(*)(int *))gg_sym(d, "cuDeviceGetCount", true);
    d->get = (CUresult(*)(CUdevice *, int))gg_sym(d, "cuDeviceGet", true);
    d->name = (CUresult(*)(char *, int, CUdevice))gg_sym(d, "cuDeviceGetName", true);
    d->total = (CUresult(*)(size_t *, CUdevice))gg_sym(d, "cuDeviceTotalMem_v2", true);
    d->attribute = (CUresult(*)(int *, CUdevice_attribute, CUdevice))gg_sym(
        d, "cuDeviceGetAttribute", false);
    d->error_name = (CUresult(*)(CUresult, const char **))gg_sym(d, "cuGetErrorName", false);
    if (!d->init || !d->count || !d->get || !d->name || !d->total)
        return -1;
    return 0;
}

static void gg_driver_error(const struct gg_driver *d, const char *call, CUresult r)
{
    const char *name = NULL;

    if (d->error_name && d->error_name(r, &name) != CUDA_SUCCESS)
        name = NULL;
    fprintf(stderr, "gpuguard-check: %s failed: %s (%d)\n", call, name ? name : "error", (int)r);
}

/* One GPU as the driver describes it. */
struct gg_gpu {
    int index;
    char name[256];
    uint64_t total;
    int cc_major, cc_minor;  /* -1 when unknown */
};

static int gg_driver_gpu(const struct gg_driver *d, int index, struct gg_gpu *g)
{
    CUdevice dev;
    size_t total = 0;
    CUresult r;

    memset(g, 0, sizeof *g);
    g->index = index;
    g->cc_major = g->cc_minor = -1;
    if ((r = d->get(&dev, index)) != CUDA_SUCCESS) {
        gg_driver_error(d, "cuDeviceGet", r);
        return -1;
    }
    if ((r = d->name(g->name, (int)sizeof g->name - 1, dev)) != CUDA_SUCCESS) {
        gg_driver_error(d, "cuDeviceGetName", r);
        return -1;
    }
    if ((r = d->total(&total, dev)) != CUDA_SUCCESS) {
        gg_driver_error(d, "cuDeviceTotalMem", r);
        return -1;
    }
    g->total = total;
    if (d->attribute &&
        (d->attribute(&g->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) !=
             CUDA_SUCCESS ||
         d->attribute(&g->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) !=
             CUDA_SUCCESS))
        g->cc_major = g->cc_minor = -1;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The listing                                                               */

static double gg_gib(uint64_t bytes)
{
    return (double)bytes / (double)(1ULL << 30);
}

static bool gg_is_dir(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The policies beside this program: ../share/gpuguard/policy when installed,
 * ../policy from build/, ../../policy from build/san or build/tsan. */
static bool gg_default_policy_dir(char *out, size_t cap)
{
    static const char *const rel[] = { "../share/gpuguard/policy", "../policy", "../../policy" };
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash;

    if (n <= 0)
        return false;
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    if (!slash)
        return false;
    *slash = '\0';
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char probe[PATH_MAX + 64];
        snprintf(probe, sizeof probe, "%s/%s", exe, rel[i]);
        if (gg_is_dir(probe) && realpath(probe, out) && strlen(out) < cap)
            return true;
    }
    return false;
}

static void gg_print_cc(const struct gg_gpu *g)
{
    if (g->cc_major < 0)
        printf("compute capability unknown\n");
    else
        printf("compute capability %d.%d (sm_%d%d)\n", g->cc_major, g->cc_minor, g->cc_major,
               g->cc_minor);
}

static void gg_print_headroom(const struct gg_policy *p, uint64_t total, uint64_t limit)
{
    uint64_t headroom = gg_size_bytes(p->headroom, total);
    uint64_t near = gg_policy_near_miss(p, total);

    printf("  headroom  %.2f GiB", gg_gib(headroom));
    if (p->headroom.is_percent)
        printf(" (%g%%)", p->headroom.percent);
    if (p->headroom_from_env)
        printf(" from GPUGUARD_HEADROOM");
    if (headroom > total)
        printf(", larger than the device");
    printf("; limit %.2f GiB; near misses above %.2f GiB used\n", gg_gib(limit),
           gg_gib(limit > near ? limit - near : 0));
}

static void gg_print_trainer(const struct gg_policy *p)
{
    const char *sig = gg_signal_name(p->signal);

    printf("  trainer   ");
    if (p->batch_size)
        printf("batch %d", p->batch_size);
    else
        printf("batch not given");
    if (p->grad_accum)
        printf(" x accum %d", p->grad_accum);
    printf(", min batch %d, signal ", p->min_batch_size);
    if (sig)
        printf("%s\n", sig);
    else
        printf("%d\n", p->signal);
}

static void gg_print_gpu(const struct gg_gpu *g, const struct gg_policy *p, uint64_t limit)
{
    printf("  memory    %.2f GiB (%" PRIu64 " bytes), ", gg_gib(g->total), g->total);
    gg_print_cc(g);
    printf("  policy    %s\n", p->file[0] ? p->file : "(built-in defaults)");
    if (p->broken)
        printf("  mode      observe: the policy has problems (it says %s)\n",
               gg_mode_name(p->mode));
    else if (p->mode == GG_MODE_AUTO)
        printf("  mode      auto: observe until a trainer registers, then enforce "
               "(enforce = %s, virtualize_meminfo = %s)\n",
               gg_enforce_name(p->enforce), p->virtualize_meminfo ? "yes" : "no");
    else
        printf("  mode      %s (enforce = %s, virtualize_meminfo = %s)\n", gg_mode_name(p->mode),
               gg_enforce_name(p->enforce), p->virtualize_meminfo ? "yes" : "no");
    gg_print_headroom(p, g->total, limit);
    gg_print_trainer(p);
    printf("  journal   %s (stacks %s, depth %d)\n", p->journal_dir, gg_stacks_name(p->stacks),
           p->depth);
}

static void gg_env_from_process(struct gg_policy_env *env)
{
    env->policy = getenv("GPUGUARD_POLICY");
    env->mode = getenv("GPUGUARD_MODE");
    env->headroom = getenv("GPUGUARD_HEADROOM");
    env->journal_dir = getenv("GPUGUARD_JOURNAL_DIR");
    env->signal = getenv("GPUGUARD_SIGNAL");
}

/* Where the policies come from, said once. NULL: the built-in defaults. */
static const char *gg_policy_location(const char *option, const struct gg_policy_env *env,
                                      char *buf, size_t cap)
{
    if (option) {
        printf("policies: %s (--policy)\n", option);
        return option;
    }
    if (env->policy && *env->policy) {
        printf("policies: %s (GPUGUARD_POLICY)\n", env->policy);
        return env->policy;
    }
    if (gg_default_policy_dir(buf, cap)) {
        printf("policies: %s (beside gpuguard-check)\n", buf);
        return buf;
    }
    printf("policies: none found beside gpuguard-check; built-in defaults\n");
    return NULL;
}

static int gg_list(const char *option)
{
    struct gg_driver d;
    struct gg_policy_env env;
    struct gg_printer pr;
    char dirbuf[PATH_MAX];
    const char *where;
    int count = 0;
    CUresult r;

    if (gg_driver_open(&d) != 0)
        return GG_EXIT_USAGE;
    if ((r = d.init(0)) != CUDA_SUCCESS) {
        gg_driver_error(&d, "cuInit", r);
        return GG_EXIT_USAGE;
    }
    if ((r = d.count(&count)) != CUDA_SUCCESS) {
        gg_driver_error(&d, "cuDeviceGetCount", r);
        return GG_EXIT_USAGE;
    }
    if (count <= 0) {
        fprintf(stderr, "gpuguard-check: no CUDA devices\n");
        return GG_EXIT_USAGE;
    }
    memset(&pr, 0, sizeof pr);
    gg_env_from_process(&env);
    where = gg_policy_location(option, &env, dirbuf, sizeof dirbuf);
    for (int i = 0; i < count; i++) {
        struct gg_gpu g;
        struct gg_policy p;
        uint64_t limit;

        if (gg_driver_gpu(&d, i, &g) != 0)
            return GG_EXIT_USAGE;
        printf("GPU %d: %s\n", i, g.name);
        gg_policy_select(where, g.name, &p, gg_print_problem, &pr);
        gg_policy_apply_env(&p, &env, gg_print_problem, &pr);
        limit = gg_policy_limit(&p, g.total, gg_print_problem, &pr);
        gg_print_gpu(&g, &p, limit);
    }
    if (pr.problems)
        printf("%d problem%s in the policies used\n", pr.problems, pr.problems == 1 ? "" : "s");
    gg_printer_free(&pr);
    gg_check_arch_torch_paragraph();
    return pr.problems ? GG_EXIT_PROBLEM : GG_EXIT_OK;
}

/* ------------------------------------------------------------------------ */

/* "gpuguard-check: ARG: what is wrong" and the usage, on stderr. */
static int gg_bad_usage(const char *arg, const char *what)
{
    fprintf(stderr, "gpuguard-check: %s: %s\n%s", arg, what, gg_usage);
    return GG_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    const char *policy = NULL;

    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(gg_usage, stdout);
        return GG_EXIT_OK;
    }
    if (argc >= 2 && strcmp(argv[1], "--lint") == 0) {
        if (argc == 2)
            return gg_bad_usage("--lint", "needs at least one FILE or DIR");
        for (int i = 2; i < argc; i++)
            if (argv[i][0] == '-' && argv[i][1] == '-')
                return gg_bad_usage(argv[i], "unknown option");
        return gg_lint(argc - 2, argv + 2);
    }
    if (argc >= 2 && strcmp(argv[1], "--arch") == 0)
        return gg_check_arch(argc - 2, argv + 2);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--policy") == 0 && i + 1 < argc)
            policy = argv[++i];
        else if (strncmp(argv[i], "--policy=", 9) == 0)
            policy = argv[i] + 9;
        else if (strcmp(argv[i], "--policy") == 0)
            return gg_bad_usage(argv[i], "needs a FILE or DIR");
        else if (argv[i][0] == '-')
            return gg_bad_usage(argv[i], "unknown option");
        else
            return gg_bad_usage(argv[i], "unexpected argument");
    }
    return gg_list(policy);
}
