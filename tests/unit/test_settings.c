/* test_settings.c - the table of settings.def (settings.c): every row has a
 * default that parses, a key its section knows, an environment override
 * that applies and is reported when bad. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include "settings.h"
#include "unit.h"

static int problems;
static char last[512];

static void collect(void *ctx, const char *file, int line, const char *msg)
{
    (void)ctx;
    problems++;
    snprintf(last, sizeof last, "%s:%d: %s", file, line, msg);
}

static void test_every_default_parses(void)
{
    struct gg_settings s;
    struct gg_process p;
    char why[256], text[GG_PATH_MAX];
    for (int id = 0; id < GG_SET_COUNT; id++) {
        const struct gg_setting_info *i = &gg_setting_info[id];
        if (i->dflt[0])
            CHECK(gg_setting_parse((enum gg_setting_id)id, &s, &p, i->dflt, why, sizeof why) == 0);
        if (!i->process)
            CHECK(gg_setting_find(i->section, i->key) == i);
    }
    gg_settings_defaults(&s);
    gg_process_defaults(&p);
    CHECK(s.mode == GG_MODE_AUTO);
    CHECK(s.signal == SIGUSR2);
    CHECK(s.batch_size == 0 && s.min_batch_size == 1 && s.depth == 32);
    CHECK(p.rank == -1 && !p.quiet && p.driver_hooks);
    /* metrics (docs/metrics.md): off until a directory is given, every 15 s */
    CHECK(!s.metrics_dir[0] && s.metrics_interval == 15 && p.local_rank == -1);
    gg_setting_format(GG_SET_metrics_dir, &s, &p, text, sizeof text);
    CHECK_STR(text, "(not given)");
    gg_setting_format(GG_SET_near_miss, &s, &p, text, sizeof text);
    CHECK_STR(text, "5%");
    gg_setting_format(GG_SET_batch_size, &s, &p, text, sizeof text);
    CHECK_STR(text, "(not given)");
    gg_setting_format(GG_SET_headroom, &s, &p, text, sizeof text);
    CHECK_STR(text, "10%");
    /* A share is shown as the size parser reads it: no exponent (found by
     * tests/fuzz/fuzz_policy: %g showed 0.0000001% as "1e-07%"). */
    static const char *const shares[] = {"0.0000001%", "12.5%", "33.333333333%", "100%"};
    for (size_t k = 0; k < GG_COUNT(shares); k++) {
        CHECK(gg_setting_parse(GG_SET_near_miss, &s, &p, shares[k], why, sizeof why) == 0);
        gg_setting_format(GG_SET_near_miss, &s, &p, text, sizeof text);
        CHECK_STR(text, shares[k]);
    }
}

static void test_find_and_keys(void)
{
    char keys[256];
    CHECK(gg_setting_find("MEMORY", "Headroom") == &gg_setting_info[GG_SET_headroom]);
    CHECK(gg_setting_find("memory", "headrom") == NULL);
    CHECK(gg_setting_find("process", "") == NULL); /* environment only */
    gg_setting_keys("trainer", keys, sizeof keys);
    CHECK_STR(keys, "signal, batch_size, grad_accum, min_batch_size, apply_batch, forecast, "
                    "max_tokens");
}

static void test_environment(void)
{
    struct gg_settings s;
    struct gg_process p;
    bool from[GG_SET_COUNT] = {0};
    gg_settings_defaults(&s);
    setenv("GPUGUARD_HEADROOM", "3 GiB", 1);
    setenv("GPUGUARD_MODE", "loud", 1);
    problems = 0;
    CHECK(gg_settings_from_env(&s, from, collect, NULL) == 1);
    CHECK(from[GG_SET_headroom] && !from[GG_SET_mode]);
    CHECK(s.headroom.bytes == 3ull << 30 && s.mode == GG_MODE_AUTO);
    CHECK_STR(last, "GPUGUARD_MODE:0: 'loud': bad value (expected auto, enforce, observe or off)");
    unsetenv("GPUGUARD_HEADROOM");
    setenv("GPUGUARD_MODE", " OFF ", 1);
    CHECK(gg_settings_env_off());
    unsetenv("GPUGUARD_MODE");
    CHECK(!gg_settings_env_off());

    gg_process_defaults(&p);
    setenv("RANK", "../../x", 1);
    setenv("GPUGUARD_QUIET", "yes", 1);
    problems = 0;
    CHECK(gg_process_from_env(&p, collect, NULL) == 1);
    CHECK(p.rank == -1 && p.quiet);
    CHECK_STR(last, "RANK:0: '../../x': not a plain decimal number");
    setenv("RANK", "7", 1);
    CHECK(gg_process_from_env(&p, collect, NULL) == 0 && p.rank == 7);
    unsetenv("RANK");
    setenv("LOCAL_RANK", "one", 1);
    CHECK(gg_process_from_env(&p, collect, NULL) == 1 && p.local_rank == -1);
    CHECK_STR(last, "LOCAL_RANK:0: 'one': not a plain decimal number");
    unsetenv("LOCAL_RANK");
    setenv("GPUGUARD_METRICS_INTERVAL", "0", 1);
    setenv("GPUGUARD_METRICS_DIR", "/var/lib/prometheus/node-exporter", 1);
    CHECK(gg_settings_from_env(&s, from, collect, NULL) == 1);
    CHECK_STR(last, "GPUGUARD_METRICS_INTERVAL:0: '0': out of range (1..86400)");
    CHECK(s.metrics_interval == 15 && from[GG_SET_metrics_dir]);
    CHECK_STR(s.metrics_dir, "/var/lib/prometheus/node-exporter");
    unsetenv("GPUGUARD_METRICS_INTERVAL");
    unsetenv("GPUGUARD_METRICS_DIR");
    unsetenv("GPUGUARD_QUIET");
}

int main(void)
{
    RUN(test_every_default_parses);
    RUN(test_find_and_keys);
    RUN(test_environment);
    return unit_done();
}
