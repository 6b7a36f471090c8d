/* test_torch.c - torch.c: what the shim asks PyTorch's instrumentation for,
 * when, in which order, and what its answers become (`torch` lines read
 * back from a journal in a temporary directory). The interpreter is played
 * by the test: a fake Py_AddPendingCall counts what is queued, and
 * gg_torch_pending runs it. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "events.h"
#include "guard.h"
#include "journal.h"
#include "pycall.h"
#include "torch.h"
#include "unit.h"

#define MiB (1ULL << 20)
#define GiB (1ULL << 30)

static char dir[] = "/tmp/gg_torch_XXXXXX";
static char text[1 << 20];

static const char *journal(void)
{
    unit_slurp(gg_journal_path(), text, sizeof text);
    return text;
}

/* The last line of event ev, or NULL. */
static const char *last_line(const char *ev)
{
    static char line[1 << 17];
    char key[64];
    snprintf(key, sizeof key, "\"ev\":\"%s\"", ev);
    const char *p = journal(), *found = NULL;
    while ((p = strstr(p, key)) != NULL)
        found = p++;
    if (!found)
        return NULL;
    while (found > text && found[-1] != '\n')
        found--;
    const char *nl = strchr(found, '\n');
    size_t n = nl ? (size_t)(nl - found) : strlen(found);
    if (n >= sizeof line)
        n = sizeof line - 1;
    memcpy(line, found, n);
    line[n] = '\0';
    return line;
}

static int count_of(const char *ev)
{
    char key[64];
    int n = 0;
    snprintf(key, sizeof key, "\"ev\":\"%s\"", ev);
    for (const char *p = journal(); (p = strstr(p, key)) != NULL; p++)
        n++;
    return n;
}

/* ---- the interpreter, played ---------------------------------------------------- */

static atomic_int queued; /* incidents() threads queue at once */

static int fake_add(gg_pycall_fn fn, void *arg)
{
    (void)arg;
    if (fn == gg_torch_pending)
        queued++;
    return 0;
}

#define MAX_REQ 16
static struct gpuguard_torch_request got[MAX_REQ];
static int ngot;

static void callback(const struct gpuguard_torch_request *r)
{
    if (ngot < MAX_REQ)
        got[ngot++] = *r;
}

static void run_pending(void)
{
    ngot = 0;
    queued = 0;
    gg_torch_pending(NULL);
}

static void fresh(void)
{
    gg_torch_reset();
    gg_pycall_test_use(fake_add, NULL);
    queued = 0;
    ngot = 0;
    CHECK(gg_torch_attach(callback));
}

static void setup(void)
{
    gg_devices_reset();
    struct gg_device *d = &gg_devices[0];
    d->present = true;
    d->mode = GG_MODE_ENFORCE;
    atomic_store(&d->enforcing, true);
    d->total = 24 * GiB;
    d->limit = 22 * GiB;
    d->near = GiB;
    snprintf(d->name, sizeof d->name, "GPU");
    gg_device_count = 1;
}

/* ---- the tests -------------------------------------------------------------------- */

static void test_nothing_is_asked_without_the_instrumentation(void)
{
    gg_torch_reset();
    gg_pycall_test_use(fake_add, NULL);
    queued = 0;
    gg_torch_incident(0, GG_INCIDENT_NEAR_MISS, MiB, true);
    gg_torch_incident(0, GG_INCIDENT_REFUSED, MiB, true);
    gg_torch_forecast(0, 5);
    CHECK_EQ_U64(queued, 0);
}

static void test_the_first_near_miss_of_a_step_asks_once(void)
{
    fresh();
    for (int i = 0; i < 5; i++)
        gg_torch_incident(0, GG_INCIDENT_NEAR_MISS, (uint64_t)(i + 1) * MiB, true);
    CHECK_EQ_U64(queued, 1); /* one call queued, whatever comes after */
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK_STR(got[0].why, "near_miss");
    CHECK_EQ_U64(got[0].dev, 0);
    CHECK_EQ_U64(got[0].request, MiB); /* the first one's */
    CHECK_EQ_U64(got[0].history, 0);
    CHECK(got[0].seq != 0);
    unsigned seq = got[0].seq;
    gg_torch_incident(0, GG_INCIDENT_NEAR_MISS, MiB, true); /* same step: asked already */
    CHECK_EQ_U64(queued, 0);
    run_pending();
    CHECK_EQ_U64(ngot, 0);
    gg_torch_boundary(1); /* a new step: its first near miss asks */
    gg_torch_incident(0, GG_INCIDENT_NEAR_MISS, 2 * MiB, true);
    CHECK_EQ_U64(queued, 1);
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK(got[0].seq > seq);
    uint64_t step = 0;
    CHECK(gg_torch_step(&step));
    CHECK_EQ_U64(step, 2); /* in progress: the boundary's + 1 */
}

static void test_refusals_ask_every_time_until_answered(void)
{
    fresh();
    gg_torch_incident(0, GG_INCIDENT_REFUSED, 64 * MiB, true);
    gg_torch_incident(0, GG_INCIDENT_OOM, 32 * MiB, true);
    run_pending();
    CHECK_EQ_U64(ngot, 2);
    CHECK_STR(got[0].why, "refused");
    CHECK_STR(got[1].why, "oom");
    CHECK_EQ_U64(got[1].request, 32 * MiB);
}

/* PyTorch's OOM observer answers unasked (seq 0): the device's last
 * failure names it, and the request it answers is settled. */
static void test_an_unasked_answer_settles_the_failure(void)
{
    fresh();
    gg_torch_incident(0, GG_INCIDENT_REFUSED, 64 * MiB, true);
    struct gpuguard_torch_view v;
    memset(&v, 0, sizeof v);
    v.dev = 0;
    v.reserved = 4 * GiB;
    v.allocated = 3 * GiB;
    v.request = 64 * MiB;
    gg_torch_answer(&v);
    const char *l = last_line("torch");
    CHECK(l && strstr(l, "\"why\":\"refused\""));
    CHECK(l && strstr(l, "\"step\":null"));
    run_pending();
    CHECK_EQ_U64(ngot, 0); /* answered already */
}

static void test_forecast_turns_history_on_for_its_step_only(void)
{
    fresh();
    gg_torch_boundary(4);
    gg_torch_forecast(0, 5);
    CHECK_EQ_U64(queued, 1);
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK_STR(got[0].why, "forecast");
    CHECK_EQ_U64(got[0].history, 1); /* on before the view */
    /* step 5 runs; its first near miss, then its boundary: history off after the view */
    gg_torch_incident(0, GG_INCIDENT_NEAR_MISS, MiB, true);
    gg_torch_boundary(5);
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK_STR(got[0].why, "near_miss");
    CHECK_EQ_U64(got[0].history, -1);
    /* the next boundary: nothing left to say */
    gg_torch_boundary(6);
    CHECK_EQ_U64(queued, 0);
    run_pending();
    CHECK_EQ_U64(ngot, 0);
}

static void test_history_alone_is_a_request_without_a_view(void)
{
    fresh();
    gg_torch_boundary(1);
    gg_torch_forecast(0, 2);
    run_pending();
    CHECK_EQ_U64(got[0].history, 1);
    gg_torch_boundary(2);
    CHECK_EQ_U64(queued, 1);
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK_EQ_U64(got[0].dev, (uint64_t)-1);
    CHECK_STR(got[0].why, "");
    CHECK_EQ_U64(got[0].history, -1);
    /* a forecast again at the boundary that ends the history step keeps it on */
    gg_torch_forecast(0, 3);
    gg_torch_boundary(3);
    gg_torch_forecast(0, 4);
    run_pending();
    CHECK(ngot >= 1);
    int on = 0, off = 0;
    for (int i = 0; i < ngot; i++) {
        on += got[i].history > 0;
        off += got[i].history < 0;
    }
    CHECK_EQ_U64(on, 1);
    CHECK_EQ_U64(off, 0);
}

static void test_a_leak_records_one_step_and_asks_after_the_next(void)
{
    fresh();
    struct gg_step_verdict sus;
    memset(&sus, 0, sizeof sus);
    sus.leak = true;
    sus.since_step = 4;
    sus.rate = 80 * MiB; /* the live bytes' trend: the cache grows with it */
    sus.w.live = 2 * GiB;
    sus.work = 4 * GiB;
    gg_torch_boundary(17);
    CHECK(gg_torch_leak(0, 17, &sus));
    CHECK_EQ_U64(queued, 1);
    run_pending(); /* history on for step 18, no view yet */
    CHECK_EQ_U64(ngot, 1);
    CHECK_STR(got[0].why, "");
    CHECK_EQ_U64(got[0].history, 1);
    CHECK(gg_torch_leak(0, 17, &sus)); /* said again meanwhile: one at a time */
    CHECK_EQ_U64(queued, 0);
    gg_torch_boundary(18); /* history off; no view: step 18's tensors may still be freed */
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK_STR(got[0].why, "");
    CHECK_EQ_U64(got[0].history, -1);
    gg_torch_boundary(19); /* what step 18 allocated and 19 kept: the view */
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK_STR(got[0].why, "leak");
    CHECK_EQ_U64(got[0].history, 0);
    /* its answer carries tensors though history is off */
    static struct gpuguard_pyframe fr = {"model.py", "Block.forward", 45};
    static struct gpuguard_torch_tensor t = {20 * MiB, 10, NULL, &fr, 1};
    struct gpuguard_torch_view v;
    memset(&v, 0, sizeof v);
    v.seq = got[0].seq;
    v.reserved = 2 * GiB;
    v.allocated = GiB;
    v.history = 1;
    v.tensors = &t;
    v.ntensors = 1;
    gg_torch_answer(&v);
    const char *l = last_line("torch");
    CHECK(l && strstr(l, "\"why\":\"leak\",\"step\":20,"));
    CHECK(l && strstr(l, "\"kept\":20971520,"));
    CHECK(l && strstr(l, "\"tensors\":[{\"bytes\":20971520,\"count\":10,"));
    /* confirmed: a leak at the rate one step kept, not the live bytes' trend */
    l = last_line("leak");
    CHECK(l && strstr(l, "\"since_step\":4,\"step\":20,\"rate\":20971520,\"confirmed\":true,"
                         "\"live_rate\":83886080,"));
    gg_torch_boundary(20);
    run_pending();
    CHECK_EQ_U64(ngot, 0);
    /* a check that finds nothing kept (the live bytes grew with the inputs,
     * or the cache kept what it reserved): no leak is said */
    CHECK(gg_torch_leak(0, 20, &sus));
    run_pending();
    gg_torch_boundary(21);
    run_pending();
    gg_torch_boundary(22);
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    CHECK_STR(got[0].why, "leak");
    int leaks = count_of("leak");
    static struct gpuguard_torch_tensor rest = {GiB, 100, NULL, NULL, 0}; /* no stack: older */
    memset(&v, 0, sizeof v);
    v.seq = got[0].seq;
    v.history = 1;
    v.tensors = &rest;
    v.ntensors = 1;
    gg_torch_answer(&v);
    l = last_line("torch");
    CHECK(l && strstr(l, "\"why\":\"leak\",\"step\":23,") && strstr(l, "\"kept\":0,"));
    CHECK_EQ_U64(count_of("leak"), leaks);
    /* a forecast's history holds the leak's view back until it is off */
    fresh();
    gg_torch_boundary(19);
    gg_torch_leak(0, 20, &sus);
    run_pending();
    gg_torch_forecast(0, 23);
    run_pending();
    gg_torch_boundary(21);
    gg_torch_boundary(22);
    run_pending();
    for (int i = 0; i < ngot; i++)
        CHECK(strcmp(got[i].why, "leak") != 0);
    gg_torch_boundary(23);
    run_pending();
    int leak = 0;
    for (int i = 0; i < ngot; i++)
        leak += strcmp(got[i].why, "leak") == 0;
    CHECK_EQ_U64(leak, 1);
}

static void test_an_answer_is_a_torch_line(void)
{
    fresh();
    struct gg_device *d = &gg_devices[0];
    atomic_store(&d->current, 20 * GiB); /* 2 GiB free under the 22 GiB limit */
    gg_torch_boundary(7);
    gg_torch_incident(0, GG_INCIDENT_NEAR_MISS, 4 * GiB, true);
    run_pending();
    CHECK_EQ_U64(ngot, 1);
    struct gpuguard_torch_view v;
    memset(&v, 0, sizeof v);
    v.seq = got[0].seq;
    v.dev = 0;
    v.reserved = 8 * GiB;
    v.allocated = 5 * GiB;
    v.largest_free = GiB;
    v.inactive_split = 512 * MiB;
    v.seg_small = 3;
    v.seg_large = 4;
    v.seg_huge = 1;
    gg_torch_answer(&v); /* request 0: the request's, 4 GiB */
    const char *l = last_line("torch");
    CHECK(l && strstr(l, "\"dev\":0,\"why\":\"near_miss\",\"step\":8,"));
    CHECK(l && strstr(l, "\"reserved\":8589934592,\"allocated\":5368709120,\"unallocated\":3221225472,"
                         "\"largest_free\":1073741824,\"inactive_split\":536870912,"
                         "\"request\":4294967296,\"fits_unfragmented\":null"));
    CHECK(l && !strstr(l, "\"tensors\"")); /* history was off */
    CHECK(l && !strstr(l, "\"raised\"")); /* asked: not the observer's */
    /* read later than the near miss it was asked about: no verdict of its
     * moment from it, and the moment it was asked about said */
    CHECK(l && strstr(l, "\"asked\":") && !strstr(l, "\"asked\":null"));
    /* 6 GiB would not have fit in 3 GiB of cache and 2 GiB of device: demand */
    v.seq = 0;
    v.request = 6 * GiB;
    snprintf(v.why, sizeof v.why, "oom");
    gg_torch_answer(&v);
    l = last_line("torch");
    CHECK(l && strstr(l, "\"why\":\"oom\""));
    CHECK(l && strstr(l, "\"raised\":true"));
    CHECK(l && strstr(l, "\"fits_unfragmented\":false"));
    /* nor one that fit the largest free block: not fragmentation either */
    v.request = 512 * MiB;
    gg_torch_answer(&v);
    CHECK(strstr(last_line("torch"), "\"fits_unfragmented\":false"));
    atomic_store(&d->current, 0);
}

static void test_tensors_are_bounded(void)
{
    fresh();
    static struct gpuguard_pyframe frames[20];
    static struct gpuguard_torch_tensor t[40];
    for (int i = 0; i < 20; i++)
        frames[i] = (struct gpuguard_pyframe){"train.py", "Block.forward", 100 + i};
    for (int i = 0; i < 40; i++)
        t[i] = (struct gpuguard_torch_tensor){(uint64_t)(40 - i) * MiB, 2, i ? NULL : "torch.nn.functional.linear",
                                              frames, i == 0 ? 20 : 1};
    struct gpuguard_torch_view v;
    memset(&v, 0, sizeof v);
    v.dev = 0;
    snprintf(v.why, sizeof v.why, "oom");
    v.history = 1;
    v.ntensors = 40;
    v.tensors = t;
    int before = count_of("torch");
    gg_torch_answer(&v);
    CHECK_EQ_U64(count_of("torch"), before + 1);
    const char *l = last_line("torch");
    int n = 0;
    for (const char *p = l; p && (p = strstr(p, "\"bytes\":")) != NULL; p++)
        n++;
    CHECK_EQ_U64(n, 32);
    n = 0;
    for (const char *p = l; p && (p = strstr(p, "\"line\":")) != NULL; p++)
        n++;
    CHECK_EQ_U64(n, 16 + 31); /* 16 frames of the first, 1 of each other */
    CHECK(strstr(l, "\"tensors\":[{\"bytes\":41943040,\"count\":2,\"pystack\":[{\"file\":\"train.py\",\"line\":100,"
                    "\"func\":\"Block.forward\"}"));
    CHECK(strstr(l, "\"op\":\"torch.nn.functional.linear\"}"));
    CHECK(strstr(l, "\"op\":null}"));
    /* an answer to nothing known, and a device out of range: no line */
    v.history = 0;
    v.why[0] = '\0';
    v.seq = 12345;
    gg_torch_answer(&v);
    v.dev = 99;
    gg_torch_answer(&v);
    CHECK_EQ_U64(count_of("torch"), before + 1);
}

static _Atomic int stop;

static void *incidents(void *arg)
{
    int me = (int)(intptr_t)arg;
    struct gpuguard_torch_view v;
    memset(&v, 0, sizeof v);
    v.dev = 0;
    v.reserved = GiB;
    while (!atomic_load(&stop)) {
        gg_torch_incident(0, me % 2 ? GG_INCIDENT_NEAR_MISS : GG_INCIDENT_REFUSED, MiB, true);
        gg_torch_answer(&v); /* an OOM observer on another thread, unasked */
    }
    return NULL;
}

/* Hooks on several threads ask while the interpreter's thread runs what is
 * queued, step boundaries come and views are answered unasked (for
 * ThreadSanitizer: make test-tsan). */
static void test_threads_ask_while_the_main_thread_answers(void)
{
    fresh();
    atomic_store(&stop, 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, incidents, (void *)(intptr_t)i) == 0);
    int asked = 0;
    for (int i = 0; i < 2000; i++) {
        ngot = 0;
        gg_torch_pending(NULL);
        asked += ngot;
        if (i % 100 == 0) {
            gg_torch_boundary((uint64_t)i);
            gg_torch_forecast(0, (uint64_t)i + 1);
        }
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK(asked > 0);
    CHECK(count_of("torch") > 0);
}

static void test_detach_stops_asking(void)
{
    fresh();
    gg_torch_detach();
    CHECK(!gg_torch_attached());
    CHECK(!gg_pycall_is_open());
    gg_torch_incident(0, GG_INCIDENT_REFUSED, MiB, true);
    CHECK_EQ_U64(queued, 0);
    run_pending(); /* a call queued before the detach runs: it does nothing */
    CHECK_EQ_U64(ngot, 0);
}

int main(void)
{
    if (!unit_tmpdir(dir) || !gg_journal_open(dir, "test", -1))
        return 1;
    setup();
    RUN(test_nothing_is_asked_without_the_instrumentation);
    RUN(test_the_first_near_miss_of_a_step_asks_once);
    RUN(test_refusals_ask_every_time_until_answered);
    RUN(test_an_unasked_answer_settles_the_failure);
    RUN(test_forecast_turns_history_on_for_its_step_only);
    RUN(test_history_alone_is_a_request_without_a_view);
    RUN(test_a_leak_records_one_step_and_asks_after_the_next);
    RUN(test_an_answer_is_a_torch_line);
    RUN(test_tensors_are_bounded);
    RUN(test_threads_ask_while_the_main_thread_answers);
    RUN(test_detach_stops_asking);
    return unit_done();
}
