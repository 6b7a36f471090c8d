/* fuzz_policy.c - libFuzzer harness of the policy reader (layer 2: policy.c
 * over inifile.c, settings.c, values.c, prim.c).
 *
 * The input is a policy file, read the three ways the shim and
 * gpuguard-check read one: gg_policy_load on the file, gg_policy_select
 * with the file as GPUGUARD_POLICY, and gg_policy_select over a directory
 * that holds it (once as a GPU model's file, once as default.ini), for GPUs
 * with real names and one named by the input itself. Beyond "no crash, no
 * leak, no undefined behaviour", each read must keep the contract of
 * policy.h and settings.h:
 *  - every problem is reported with a file, a line inside the file (0 for
 *    the file as a whole) and a message that journals as valid JSON, and the
 *    count returned is the count reported;
 *  - a policy is broken exactly when it had a problem;
 *  - every value is in its range, and every value given (by the file or by
 *    default) is shown (gg_setting_format, what gpuguard-check lists) in a
 *    form that reads back as the same value;
 *  - the limit and near-miss margin never exceed the device.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "json_check.h"
#include "policy.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char root[256], model_dir[300], default_dir[300], model_file[320], default_file[320];

#define FAIL(...)                                                                         \
    do {                                                                                  \
        fprintf(stderr, "fuzz_policy: " __VA_ARGS__);                                     \
        fputc('\n', stderr);                                                              \
        abort();                                                                          \
    } while (0)

static void cleanup(void)
{
    unlink(model_file);
    unlink(default_file);
    rmdir(model_dir);
    rmdir(default_dir);
    rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/gg-fuzz-policy-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root))
        FAIL("cannot make a directory under %s: %s", tmp ? tmp : "/tmp", strerror(errno));
    snprintf(model_dir, sizeof model_dir, "%s/models", root);
    snprintf(default_dir, sizeof default_dir, "%s/defaults", root);
    snprintf(model_file, sizeof model_file, "%s/fuzz.ini", model_dir);
    snprintf(default_file, sizeof default_file, "%s/default.ini", default_dir);
    if (mkdir(model_dir, 0700) != 0 || mkdir(default_dir, 0700) != 0)
        FAIL("cannot make directories under %s: %s", root, strerror(errno));
    atexit(cleanup);
    return 0;
}

static void put_file(const char *path, const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || !gg_write_all(fd, data, size) || close(fd) != 0)
        FAIL("cannot write %s: %s", path, strerror(errno));
}

/* What one read reported. */
struct seen {
    int reports;
    int lines; /* of the input */
};

static void report(void *ctx, const char *file, int line, const char *msg)
{
    struct seen *s = ctx;
    s->reports++;
    if (!file || !msg)
        FAIL("a report without a file or a message");
    if (line < 0 || line > s->lines)
        FAIL("line %d of a %d-line file: %s", line, s->lines, msg);
    if (strlen(msg) >= 1024)
        FAIL("a message of %zu bytes", strlen(msg));
    /* The shim journals it as an `error` event. */
    char buf[256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_obj(&j);
    gg_json_kstr(&j, "ev", "error");
    gg_json_kstr(&j, "file", file);
    gg_json_kstr(&j, "message", msg);
    gg_json_obj_end(&j);
    gg_json_raw_newline(&j);
    if (j.failed || gg_check_json_line(j.buf, j.len) != 6)
        FAIL("problem not journaled as valid JSON: %s", msg);
    gg_json_free(&j);
}

/* Values in range, and each value given shown as text that reads back as
 * the same value. */
static void check_values(const struct gg_policy *p)
{
    const struct gg_settings *s = &p->s;
    for (int id = 0; id < GG_SET_COUNT; id++) {
        const struct gg_setting_info *i = &gg_setting_info[id];
        if (i->process)
            continue;
        if (i->type == GG_T_INT) {
            int v = *(const int *)((const char *)s + i->offset);
            if (v != 0 && (v < i->min || v > i->max))
                FAIL("[%s] %s = %d out of [%ld, %ld]", i->section, i->key, v, i->min, i->max);
        }
        if (i->type == GG_T_SIZE) {
            const struct gg_size *v = (const void *)((const char *)s + i->offset);
            if (v->is_percent && !(v->percent >= 0 && v->percent <= 100))
                FAIL("[%s] %s = %g%%", i->section, i->key, v->percent);
        }
        char shown[GG_PATH_MAX + 32], again[GG_PATH_MAX + 32], why[256];
        struct gg_settings back = *s;
        gg_setting_format((enum gg_setting_id)id, s, NULL, shown, sizeof shown);
        if (!shown[0] || shown[0] == '(') /* not given: "", "(not given)" */
            continue;
        if (gg_setting_parse((enum gg_setting_id)id, &back, NULL, shown, why, sizeof why) != 0)
            FAIL("[%s] %s shown as '%s', which does not read back: %s", i->section, i->key,
                 shown, why);
        gg_setting_format((enum gg_setting_id)id, &back, NULL, again, sizeof again);
        if (strcmp(shown, again) != 0)
            FAIL("[%s] %s shown as '%s' reads back as '%s'", i->section, i->key, shown, again);
    }
    if (strnlen(s->match, GG_MATCH_MAX) == GG_MATCH_MAX ||
        strnlen(s->journal_dir, GG_PATH_MAX) == GG_PATH_MAX)
        FAIL("an unterminated string setting");
    if ((unsigned)s->mode > GG_MODE_AUTO || (unsigned)s->enforce > GG_ENFORCE_ALL ||
        (unsigned)s->stacks > GG_STACKS_ALL)
        FAIL("a word setting out of its vocabulary");
    static const uint64_t totals[] = {0, 1, 24ull << 30, UINT64_MAX};
    for (size_t k = 0; k < GG_COUNT(totals); k++) {
        if (gg_policy_limit(p, totals[k], NULL, NULL) > totals[k])
            FAIL("limit above the device's %llu bytes", (unsigned long long)totals[k]);
        if (gg_policy_near_miss(p, totals[k]) > totals[k])
            FAIL("near-miss margin above the device's %llu bytes", (unsigned long long)totals[k]);
    }
}

static void check_select(const char *where, const char *const *names, int n, const char *file,
                         int lines)
{
    static struct gg_policy out[4];
    struct seen seen = {0, lines};
    int problems = gg_policy_select(where, names, n, out, report, &seen);
    if (problems != seen.reports)
        FAIL("select %s: %d problems counted, %d reported", where, problems, seen.reports);
    for (int i = 0; i < n; i++) {
        if (out[i].file[0] && strcmp(out[i].file, file) != 0)
            FAIL("select %s: GPU %d got policy '%s'", where, i, out[i].file);
        check_values(&out[i]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct gg_policy p;
    int lines = 1;
    for (size_t i = 0; i < size; i++)
        lines += data[i] == '\n';
    put_file(model_file, data, size);

    struct seen seen = {0, lines};
    int problems = gg_policy_load(model_file, &p, report, &seen);
    if (problems != seen.reports)
        FAIL("load: %d problems counted, %d reported", problems, seen.reports);
    if (p.broken != (problems > 0))
        FAIL("load: broken = %d with %d problems", p.broken, problems);
    if (strcmp(p.file, model_file) != 0)
        FAIL("load: file '%s'", p.file);
    check_values(&p);

    /* A GPU named by the input's first line (up to 64 bytes), beside real
     * names: the match globs meet hostile names too. */
    char own[65];
    size_t k = 0;
    while (k < size && k < 64 && data[k] != '\n' && data[k] != '\0') {
        own[k] = (char)data[k];
        k++;
    }
    own[k] = '\0';
    const char *names[4] = {"NVIDIA GeForce RTX 3090", "NVIDIA A100-SXM4-80GB", own,
                            "Tesla T4"};
    check_select(model_file, names, 2, model_file, lines);
    check_select(model_dir, names, 4, model_file, lines);
    put_file(default_file, data, size);
    check_select(default_dir, names, 4, default_file, lines);
    return 0;
}
