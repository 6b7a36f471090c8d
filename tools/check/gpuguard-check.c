/* gpuguard-check - the GPUs, the policy each one gets, and a policy linter.
 *
 *   gpuguard-check [--policy FILE|DIR]   list each GPU, its policy and limit
 *   gpuguard-check --lint FILE|DIR...    validate policies; exit 1 on a problem
 *
 * Shares the shim's code: its settings table and policy reader (layer 2) and
 * its driver probe (layer 3), so a policy means here exactly what it means in
 * the shim. The CUDA driver is loaded at run time with dlopen("libcuda.so.1"):
 * nothing here needs libcuda to link.
 * Exit status: 0 clean, 1 a policy problem, 2 usage or no usable driver.
 */
#include "driver.h"
#include "policy.h"
#include "settings.h"

#include "check_arch.h"

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
    "       gpuguard-check --values NAME=VALUE...\n"
    "       gpuguard-check --help\n"
    "\n"
    "Without --lint: lists each GPU (through libcuda.so.1) with the policy it gets,\n"
    "its mode, headroom and limit, and the trainer's batch and accumulation; the\n"
    "policies come from --policy, else GPUGUARD_POLICY, else the ones installed\n"
    "beside this program. The GPUGUARD_* variables apply as they do in the shim.\n"
    "\n"
    "--lint: checks each policy file (each *.ini of a directory) and prints\n"
    "FILE:LINE: message for every problem, including a GPU name that two files of\n"
    "one directory both match, and per file the [memory] and [trainer] keys it\n"
    "leaves to their defaults. Exit status 1 on any problem, 0 when clean.\n"
    "\n"
    "--arch: for each FILE (a library or program) and each GPU, one line saying what\n"
    "device code the file carries and whether the GPU runs it; without FILE, the\n"
    "CUDA libraries of the PyTorch that python3 imports (the listing ends with the\n"
    "same verdict on it). Exit status 1 when a file has nothing some GPU can run.\n"
    "\n"
    "--values: checks each VALUE as the shim reads its variable NAME (GPUGUARD_MODE,\n"
    "GPUGUARD_HEADROOM, GPUGUARD_SIGNAL, ...: docs/policy.md), with the same parser;\n"
    "prints NAME: 'VALUE': what is wrong, for each bad one (gpuguard-run checks its\n"
    "options with it). Exit status 1 when a value is bad, 0 when all are good.\n"
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

/* Prints each problem once; counts them. Seen lines are kept as 64-bit
 * hashes in an open-addressed set, so linting a file with 50 000 problems
 * takes linear time. */
struct gg_printer {
    int problems;
    uint64_t *seen;
    size_t nseen, cap;
};

static uint64_t gg_line_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ULL;
    return h | 1; /* 0 marks an empty slot */
}

static bool gg_set_insert(uint64_t *set, size_t cap, uint64_t h)
{
    for (size_t i = h & (cap - 1);; i = (i + 1) & (cap - 1)) {
        if (set[i] == h)
            return false;
        if (!set[i]) {
            set[i] = h;
            return true;
        }
    }
}

static bool gg_printer_seen(struct gg_printer *pr, const char *line)
{
    uint64_t h = gg_line_hash(line);
    if ((pr->nseen + 1) * 2 > pr->cap) {
        size_t cap = pr->cap ? pr->cap * 2 : 64;
        uint64_t *grown = calloc(cap, sizeof *grown);
        if (!grown)
            return false;
        for (size_t i = 0; i < pr->cap; i++)
            if (pr->seen[i])
                gg_set_insert(grown, cap, pr->seen[i]);
        free(pr->seen);
        pr->seen = grown;
        pr->cap = cap;
    }
    if (!gg_set_insert(pr->seen, pr->cap, h))
        return true;
    pr->nseen++;
    return false;
}

static void gg_printer_free(struct gg_printer *pr)
{
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

/* What a file leaves to the built-in defaults, of the keys that decide what
 * the guard does ([memory], [trainer]): one line, "key = value" as it would
 * be written, so a default is never a surprise (a missing headroom is
 * 10%, not 0). Not a problem. */
static void gg_lint_defaults(const char *path, const struct gg_policy *p)
{
    char line[2048], value[256];
    size_t len = 0;
    struct gg_process proc;

    memset(&proc, 0, sizeof proc);
    line[0] = '\0';
    for (int id = 0; id < GG_SET_COUNT; id++) {
        const struct gg_setting_info *i = &gg_setting_info[id];
        if (p->line[id] || (strcmp(i->section, "memory") != 0 && strcmp(i->section, "trainer") != 0))
            continue;
        gg_setting_format((enum gg_setting_id)id, &p->s, &proc, value, sizeof value);
        int w = snprintf(line + len, sizeof line - len, "%s%s = %s", len ? ", " : "", i->key,
                         value);
        if (w < 0 || (size_t)w >= sizeof line - len)
            break;
        len += (size_t)w;
    }
    if (len)
        printf("%s: left to defaults: %s\n", path, line);
}

static int gg_lint_member(void *arg, const char *path, const char *name)
{
    struct gg_lint_dir *ld = arg;
    struct gg_policy p;

    ld->files++;
    gg_policy_load(path, &p, gg_print_problem, ld->pr);
    gg_lint_defaults(path, &p);
    gg_policy_check_member(path, &p, gg_print_problem, ld->pr);
    if (strcmp(name, "default.ini") != 0 && p.s.match[0] &&
        gg_lint_remember(ld, path, p.s.match) != 0) {
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

            if (!gg_globs_match(f->match, gg_known_names[k]))
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
    int more = 0;
    rc = gg_policy_dir_each(dir, gg_lint_member, &ld, &more);
    if (rc == -1) {
        snprintf(msg, sizeof msg, "cannot read policy directory: %s", strerror(errno));
        gg_print_problem(pr, dir, 0, msg);
    } else if (ld.files == 0) {
        gg_print_problem(pr, dir, 0, "no policy files (*.ini) in this directory");
    }
    if (more) {
        snprintf(msg, sizeof msg, "more than %d policy files; the shim reads the first %d only",
                 GG_POLICY_DIR_MAX, GG_POLICY_DIR_MAX);
        gg_print_problem(pr, dir, 0, msg);
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
            gg_lint_defaults(argv[i], &p);
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

/* Where a setting's value came from. */
static void gg_print_origin(const struct gg_policy *p, enum gg_setting_id id, char *out,
                            size_t cap)
{
    if (p->invalid[id][0] && p->line[id])
        snprintf(out, cap, "default: line %d's %s is invalid", p->line[id], p->invalid[id]);
    else if (p->invalid[id][0])
        snprintf(out, cap, "default: %s=%s is invalid", gg_setting_info[id].env, p->invalid[id]);
    else if (p->from_env[id])
        snprintf(out, cap, "from %s", gg_setting_info[id].env);
    else if (p->line[id])
        snprintf(out, cap, "line %d", p->line[id]);
    else
        snprintf(out, cap, "default");
}

/* Every policy setting, from the table of settings.def. */
static void gg_print_settings(const struct gg_policy *p)
{
    const char *section = "";
    for (int id = 0; id < GG_SET_COUNT; id++) {
        const struct gg_setting_info *i = &gg_setting_info[id];
        char value[GG_PATH_MAX], origin[64];
        if (i->process)
            continue;
        if (strcmp(section, i->section) != 0) {
            section = i->section;
            printf("  [%s]\n", section);
        }
        gg_setting_format((enum gg_setting_id)id, &p->s, NULL, value, sizeof value);
        gg_print_origin(p, (enum gg_setting_id)id, origin, sizeof origin);
        printf("    %-19s = %-24s (%s)\n", i->key, value, origin);
    }
}

static void gg_print_mode(const struct gg_policy *p)
{
    const char *name = gg_mode_name((enum gg_mode)p->s.mode);
    const char *env = gg_setting_info[GG_SET_mode].env;
    int line = p->line[GG_SET_mode];

    if (p->broken && p->invalid[GG_SET_mode][0] && line)
        printf("  mode      observe: the policy has problems (line %d says mode = %s, which is "
               "invalid)\n", line, p->invalid[GG_SET_mode]);
    else if (p->broken && p->invalid[GG_SET_mode][0])
        printf("  mode      observe: the policy has problems (%s=%s is invalid)\n", env,
               p->invalid[GG_SET_mode]);
    else if (p->broken && p->from_env[GG_SET_mode])
        printf("  mode      observe: the policy has problems (%s says %s)\n", env, name);
    else if (p->broken && line)
        printf("  mode      observe: the policy has problems (line %d says mode = %s)\n", line,
               name);
    else if (p->broken)
        printf("  mode      observe: the policy has problems (without them: %s, the default)\n",
               name);
    else if (p->s.mode == GG_MODE_AUTO)
        printf("  mode      auto: observe until a trainer registers, then enforce\n");
    else
        printf("  mode      %s\n", gg_mode_name((enum gg_mode)p->s.mode));
}

/* What the trainer is told to start from, in one line. */
static void gg_print_trainer(const struct gg_policy *p)
{
    const char *sig = gg_signal_name(p->s.signal);
    printf("  trainer   ");
    if (p->s.batch_size)
        printf("batch %d", p->s.batch_size);
    else
        printf("batch not given");
    if (p->s.grad_accum)
        printf(" x accum %d", p->s.grad_accum);
    if (p->s.batch_size && p->s.apply_batch)
        printf(" (applied: the Python helper starts from it)");
    printf(", min batch %d, signal ", p->s.min_batch_size);
    if (sig)
        printf("%s\n", sig);
    else
        printf("%d\n", p->s.signal);
}

static void gg_print_gpu(const struct gg_gpu *g, const struct gg_policy *p, uint64_t limit)
{
    uint64_t headroom = gg_size_bytes(p->s.headroom, g->total);
    uint64_t near = gg_policy_near_miss(p, g->total);
    printf("  memory    %.2f GiB (%" PRIu64 " bytes), ", gg_gib(g->total), g->total);
    gg_print_cc(g);
    printf("  policy    %s\n", p->file[0] ? p->file : "(built-in defaults)");
    gg_print_mode(p);
    printf("  limit     %.2f GiB: headroom %.2f GiB%s; near misses above %.2f GiB used\n",
           gg_gib(limit), gg_gib(headroom), headroom > g->total ? ", larger than the device" : "",
           gg_gib(limit > near ? limit - near : 0));
    gg_print_trainer(p);
    gg_print_settings(p);
}

/* Where the policies come from, said once. NULL: the built-in defaults. */
static const char *gg_policy_location(const char *option, const struct gg_process *proc,
                                      char *buf, size_t cap)
{
    if (option) {
        printf("policies: %s (--policy)\n", option);
        return option;
    }
    if (proc->policy[0]) {
        printf("policies: %s (GPUGUARD_POLICY)\n", proc->policy);
        return proc->policy;
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
    struct gg_process proc;
    struct gg_printer pr;
    char dirbuf[PATH_MAX], why[256];
    const char *where, *call = "";
    int count = 0, r;

    if (gg_driver_open(true, why, sizeof why) != 0) {
        fprintf(stderr, "gpuguard-check: %s\n", why);
        return GG_EXIT_USAGE;
    }
    if ((r = gg_driver_init(&count, &call)) != 0) {
        fprintf(stderr, "gpuguard-check: %s failed: %s (%d)\n", call, gg_driver_error_name(r), r);
        return GG_EXIT_USAGE;
    }
    if (count <= 0) {
        fprintf(stderr, "gpuguard-check: no CUDA devices\n");
        return GG_EXIT_USAGE;
    }
    if (count > 64)
        count = 64;
    memset(&pr, 0, sizeof pr);
    gg_process_defaults(&proc);
    gg_process_from_env(&proc, gg_print_problem, &pr);
    where = gg_policy_location(option, &proc, dirbuf, sizeof dirbuf);
    struct gg_gpu gpus[64];
    const char *names[64];
    for (int i = 0; i < count; i++) {
        if ((r = gg_driver_gpu(i, &gpus[i], &call)) != 0) {
            fprintf(stderr, "gpuguard-check: GPU %d: %s failed: %s (%d)\n", i, call,
                    gg_driver_error_name(r), r);
            return GG_EXIT_USAGE;
        }
        names[i] = gpus[i].name;
    }
    struct gg_policy *policies = calloc((size_t)count, sizeof *policies);
    if (!policies) {
        fprintf(stderr, "gpuguard-check: out of memory\n");
        return GG_EXIT_USAGE;
    }
    gg_policy_select(where, names, count, policies, gg_print_problem, &pr);
    for (int i = 0; i < count; i++) {
        struct gg_policy *p = &policies[i];
        gg_policy_apply_env(p, gg_print_problem, &pr);
        uint64_t limit = gg_policy_limit(p, gpus[i].total, gg_print_problem, &pr);
        printf("GPU %d: %s\n", i, gpus[i].name);
        gg_print_gpu(&gpus[i], p, limit);
    }
    free(policies);
    if (pr.problems)
        printf("%d problem%s in the policies used\n", pr.problems, pr.problems == 1 ? "" : "s");
    gg_printer_free(&pr);
    gg_check_arch_torch_paragraph();
    return pr.problems ? GG_EXIT_PROBLEM : GG_EXIT_OK;
}

/* ------------------------------------------------------------------------ */
/* --values                                                                  */

/* Each NAME=VALUE read by the shim's own parser for the variable NAME, as
 * the shim reads it at start (settings.c): the same message on a bad one. */
static int gg_values(int argc, char **argv)
{
    struct gg_printer pr;
    struct gg_settings s;
    struct gg_process proc;

    memset(&pr, 0, sizeof pr);
    for (int i = 0; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        int id = -1;
        for (int k = 0; eq && k < GG_SET_COUNT; k++) {
            const char *env = gg_setting_info[k].env;
            if (env && strlen(env) == (size_t)(eq - argv[i]) &&
                strncmp(env, argv[i], (size_t)(eq - argv[i])) == 0)
                id = k;
        }
        if (id < 0) {
            fprintf(stderr, "gpuguard-check: --values: '%s' is not NAME=VALUE with NAME a "
                            "variable the shim reads (docs/policy.md)\n", argv[i]);
            gg_printer_free(&pr);
            return GG_EXIT_USAGE;
        }
        char why[256], msg[GG_PATH_MAX + 300];
        gg_settings_defaults(&s);
        gg_process_defaults(&proc);
        if (strlen(eq + 1) >= GG_PATH_MAX) {
            gg_print_problem(&pr, gg_setting_info[id].env, 0,
                             "too long (at most 1023 characters); ignored");
        } else if (gg_setting_parse((enum gg_setting_id)id, &s, &proc, eq + 1, why,
                                    sizeof why) != 0) {
            snprintf(msg, sizeof msg, "'%.120s': %s", eq + 1, why);
            gg_print_problem(&pr, gg_setting_info[id].env, 0, msg);
        }
    }
    int rc = pr.problems ? GG_EXIT_PROBLEM : GG_EXIT_OK;
    gg_printer_free(&pr);
    return rc;
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
    if (argc >= 2 && strcmp(argv[1], "--values") == 0) {
        if (argc == 2)
            return gg_bad_usage("--values", "needs at least one NAME=VALUE");
        return gg_values(argc - 2, argv + 2);
    }
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
