/* test_device.c - the GPUs and their policies (device.c over driver.c and
 * policy.c), with the fake driver of tests/fake loaded by path: names,
 * limits from the shipped policies, readings, a failed query. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "driver.h"
#include "unit.h"

#define GiB (1ULL << 30)

static int problems;
static char said[2048];

static void collect(void *ctx, const char *file, int line, const char *msg)
{
    (void)ctx;
    (void)line;
    problems++;
    size_t n = strlen(said);
    snprintf(said + n, sizeof said - n, "%s: %s\n", file, msg);
}

static char root[512];

static void test_devices_and_policies(void)
{
    struct gg_process p;
    gg_process_defaults(&p);
    snprintf(p.policy, sizeof p.policy, "%s/policy", root);
    CHECK_EQ_U64(gg_devices_init(&p, collect, NULL), 2);
    CHECK_EQ_U64(problems, 0);
    struct gg_device *d0 = gg_device(0), *d1 = gg_device(1);
    CHECK(d0 && d1 && !gg_device(2));
    CHECK_STR(d0->name, "NVIDIA GeForce RTX 3090");
    CHECK_EQ_U64(d0->total, 24 * GiB);
    CHECK_EQ_U64(d0->limit, 24 * GiB - 2576980377ULL); /* rtx-3090.ini: headroom 10% */
    CHECK(d0->mode == GG_MODE_AUTO && !atomic_load(&d0->enforcing));
    CHECK(d0->cc_major == 8 && d0->cc_minor == 6);
    CHECK(strstr(gg_device_policy(0)->file, "rtx-3090.ini") != NULL);
    CHECK_STR(d1->name, "NVIDIA H100 80GB HBM3");
    CHECK(strstr(gg_device_policy(1)->file, "h100-80gb.ini") != NULL);
}

static void test_reading(void)
{
    struct gg_device *d = gg_device(1);
    /* no context on this thread: only a primary context's reading */
    uint64_t before = gg_device_estimate(d);
    CHECK_EQ_U64(before, 0);
    CHECK_EQ_U64(gg_device_refresh(d, 1, false), 0); /* may not retain: the estimate */
    CHECK(!atomic_load(&d->read_once));
    CHECK_EQ_U64(gg_device_refresh(d, 1, true), 1 * GiB); /* the fake's context bytes */
    CHECK(atomic_load(&d->read_once));
    CHECK_EQ_U64(gg_device_estimate(d), 1 * GiB);
    CHECK_EQ_U64(gg_driver_current_device(), (uint64_t)-1); /* left as it was */
}

int main(void)
{
    const char *build = getenv("GG_BUILD");
    char path[4200];
    snprintf(root, sizeof root, "%s", getenv("GG_ROOT") ? getenv("GG_ROOT") : ".");
    snprintf(path, sizeof path, "%s/fake/libcuda.so.1", build ? build : "build");
    setenv("FAKECUDA_DEVICES",
           "NVIDIA GeForce RTX 3090,24GiB,8.6;NVIDIA H100 80GB HBM3,80GiB,9.0", 1);
    setenv("FAKECUDA_CONTEXT_BYTES", "1GiB", 1);
    if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL)) {
        printf("cannot load the fake driver %s\n", path);
        return 1;
    }
    RUN(test_devices_and_policies);
    RUN(test_reading);
    return unit_done();
}
