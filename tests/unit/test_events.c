/* test_events.c - every event's schema (events.c) and what a verdict
 * becomes (react.c), read back from a journal in a temporary directory. */
#include <gnu/libc-version.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "advice.h"
#include "device.h"
#include "events.h"
#include "journal.h"
#include "react.h"
#include "unit.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

/* An address inside libc itself: a function of libc's own that no
 * sanitizer intercepts. */
static uintptr_t libc_ip(void)
{
    return (uintptr_t)&gnu_get_libc_version + 4;
}

static char dir[] = "/tmp/gg_events_XXXXXX";
static char text[65536];

static const char *journal(void)
{
    unit_slurp(gg_journal_path(), text, sizeof text);
    return text;
}

/* The line of event ev, or NULL. */
static const char *line_of(const char *ev)
{
    char key[64];
    snprintf(key, sizeof key, "\"ev\":\"%s\"", ev);
    const char *p = strstr(journal(), key);
    if (!p)
        return NULL;
    while (p > text && p[-1] != '\n')
        p--;
    return p;
}

static void setup(void)
{
    gg_devices_reset();
    struct gg_device *d = &gg_devices[0];
    d->present = true;
    d->mode = GG_MODE_ENFORCE;
    d->total = 24 * GiB;
    d->limit = 22 * GiB;
    d->near = GiB;
    snprintf(d->name, sizeof d->name, "NVIDIA \"Quoted\" GPU");
    gg_device_count = 1;
}

static void test_start_mode_note_error(void)
{
    gg_events_start("trainer", "host1", 2);
    const char *l = line_of("start");
    CHECK(l && strncmp(l, "{\"t\":", 5) == 0);
    CHECK(l && strstr(l, "\"rank\":2,\"version\":\""));
    CHECK(l && strstr(l, "\"name\":\"NVIDIA \\\"Quoted\\\" GPU\""));
    CHECK(l && strstr(l, "\"limit\":23622320128,\"mode\":\"enforce\""));
    gg_events_mode(0, "enforce", "trainer registered");
    CHECK(strstr(journal(), "\"ev\":\"mode\",\"dev\":0,\"mode\":\"enforce\",\"why\":\"trainer registered\"}"));
    gg_events_note("line\nnext");
    CHECK(strstr(journal(), "\"ev\":\"note\",\"text\":\"line\\nnext\"}"));
    gg_events_error("policy %s", "bad");
    CHECK(strstr(journal(), "\"ev\":\"error\",\"message\":\"policy bad\"}"));
}

static void test_incident_and_advice(void)
{
    struct gg_call c = {.dev = 0, .api = 0, .refusable = GG_REFUSABLE, .api_name = "cudaMalloc",
                        .bytes = 2 * GiB, .site = GG_SITE_NONE,
                        .caller = libc_ip()}; /* asked from libc */
    struct gg_verdict v = {.incident = GG_INCIDENT_REFUSED, .journal = true, .used = 21 * GiB};
    struct gg_batch was;
    gg_advice_set_batch((struct gg_batch){32, 1}, &was);
    signal(SIGUSR2, SIG_DFL);
    gg_react(&c, &v);
    /* said once the caller's next move is known: here its retry of the same
     * request, which works (PyTorch emptied its cache) */
    CHECK(line_of("refused") == NULL);
    struct gg_verdict freed = {.freed = 3 * GiB}, retried = {.settle = true};
    gg_react_free(&freed);
    gg_react(&c, &retried);
    const char *l = line_of("refused");
    CHECK(l && strstr(l, "\"dev\":0,\"api\":\"cudaMalloc\",\"bytes\":2147483648,"
                         "\"used\":22548578304,\"limit\":23622320128,\"total\":25769803776,"
                         "\"count\":0,\"caller\":\"libc.so.6\",\"reserved\":0,\"allocated\":0,"
                         "\"recovered\":true,\"retried\":true,\"freed\":3221225472,"
                         "\"freed_count\":1,\"freed_largest\":3221225472,"
                         "\"stack\":[],\"pystack\":[]}"));
    CHECK_EQ_U64(atomic_load(&gg_devices[0].refusals_recovered), 1);
    l = line_of("advice");
    CHECK(l && strstr(l, "\"dev\":0,\"batch_size\":16,\"grad_accum\":2,\"reason\":\"refused\","
                         "\"signaled\":false,\"heard\":true}")); /* a trainer registered */
    struct gg_verdict nm = {.incident = GG_INCIDENT_NEAR_MISS, .journal = false, .count = 9};
    gg_react(&c, &nm);
    CHECK(line_of("near_miss") == NULL); /* sampled out: advice only */
    /* a pool's request served from what its pool held, let through past the
     * limit because of who asked; no module for the address: caller null */
    struct gg_call pc = c;
    pc.pool = 1;
    pc.grows = 0;
    pc.caller = 0;
    struct gg_verdict sp = {.incident = GG_INCIDENT_NEAR_MISS, .journal = true, .over_limit = true,
                            .spared = true, .count = 1};
    gg_react(&pc, &sp);
    l = line_of("near_miss");
    CHECK(l && strstr(l, "\"count\":1,\"over_limit\":true,\"spared\":\"never_refuse\","
                         "\"caller\":null,\"grows\":0,\"reserved\":0,\"allocated\":0,"));
}

static void test_batch_and_summary(void)
{
    struct gg_window w = {.peak = 5 * GiB, .peak_used = 6 * GiB, .live = GiB};
    /* the trainer's first batch: the phase before it has no batch to say */
    gg_events_batch(0, (struct gg_batch){16, 2}, (struct gg_batch){0, 0}, &w, false, NULL);
    CHECK(strstr(journal(), "\"ev\":\"batch\",\"dev\":0,\"batch_size\":16,\"grad_accum\":2,"
                            "\"peak\":5368709120,"));
    gg_events_batch(0, (struct gg_batch){8, 4}, (struct gg_batch){16, 2}, &w, false, "shape");
    CHECK(strstr(journal(), "\"batch_size\":8,\"grad_accum\":4,\"was_batch_size\":16,"
                            "\"was_grad_accum\":2,\"peak\":5368709120,"));
    CHECK(strstr(journal(), "\"live\":1073741824,\"reason\":\"shape\"}"));
    gg_events_batch(0, (struct gg_batch){8, 4}, (struct gg_batch){8, 4}, &w, true, NULL);
    CHECK(strstr(journal(), "\"ev\":\"batch\",\"dev\":0,\"batch_size\":8,\"grad_accum\":4,"
                            "\"was_batch_size\":8,\"was_grad_accum\":4,"
                            "\"peak\":5368709120,\"peak_used\":6442450944,\"live\":1073741824,"
                            "\"final\":true}"));
    /* 3 GiB on the device, 2 GiB of it a pool's, which handed out 512 MiB */
    atomic_store(&gg_devices[0].current, 3 * GiB);
    atomic_store(&gg_devices[0].pool_reserved, 2 * GiB);
    atomic_store(&gg_devices[0].pool_used, 512 * MiB);
    atomic_store(&gg_devices[0].peak_pool_reserved, 2 * GiB);
    gg_events_summary(1.5, true, NULL);
    const char *l = line_of("summary");
    CHECK(l && strstr(l, "\"live_bytes\":3221225472,\"live_allocs\":0,\"step\":null,\"steps\":0,"
                         "\"flush_steps\":0,\"advice\":0,\"advice_unheard\":0,"
                         "\"reserved\":3221225472,"
                         "\"allocated\":1610612736,\"pool_reserved\":2147483648,"
                         "\"pool_allocated\":536870912,\"peak_pool_reserved\":2147483648,"));
    CHECK(l && strstr(l, "\"duration\":1.500000"));
    CHECK(l && strstr(l, "\"peak_stack\":[],\"peak_pystack\":[],\"peak_sites\":[]"));
    /* every line is whole */
    const char *t = journal();
    CHECK(t[strlen(t) - 1] == '\n');
}

/* Each event's lines are written under its own row's budget (events.def):
 * note, LIMIT(256, 60): its burst, then the rest counted and said in a
 * suppressed line; start, ALWAYS: never limited. */
static void test_budgets_are_the_rows(void)
{
    uint64_t before = gg_events_left_out(GG_EVENT_note);
    for (int i = 0; i < 1000; i++)
        gg_events_note("flood");
    uint64_t left = gg_events_left_out(GG_EVENT_note) - before;
    CHECK(left >= 1000 - 258 - 1 && left <= 1000 - 256); /* the test's earlier note: 1 */
    uint64_t base[GG_EVENTS] = {0};
    CHECK(gg_events_suppressed(base));
    char want[64];
    snprintf(want, sizeof want, "\"note\":%llu},\"total\":",
             (unsigned long long)gg_events_left_out(GG_EVENT_note));
    const char *l = line_of("suppressed");
    CHECK(l && strstr(l, want));
    CHECK(!gg_events_suppressed(base)); /* nothing new since */
    for (int i = 0; i < 1000; i++)
        gg_events_start("trainer", "host1", 0);
    CHECK_EQ_U64(gg_events_left_out(GG_EVENT_start), 0);
}

int main(void)
{
    if (!unit_tmpdir(dir) || !gg_journal_open(dir, "test", -1))
        return 1;
    setup();
    RUN(test_start_mode_note_error);
    RUN(test_incident_and_advice);
    RUN(test_batch_and_summary);
    RUN(test_budgets_are_the_rows);
    return unit_done();
}
