/* test_backward.c - backward.c: `backward` lines are thinned per call site
 * (the first 8, then powers of 2, with the site's count), and a call whose
 * line was left out is written before the next incident, with the moment of
 * the call; read back from a journal in a temporary directory. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "backward.h"
#include "events.h"
#include "journal.h"
#include "torch.h"
#include "unit.h"

static char dir[] = "/tmp/gg_backward_XXXXXX";
static char text[1 << 20];

static const char *journal(void)
{
    unit_slurp(gg_journal_path(), text, sizeof text);
    return text;
}

static int count_of(const char *needle)
{
    int n = 0;
    for (const char *p = journal(); (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

static const struct gpuguard_pyframe train[] = {
    {"/w/train.py", "train_step", 57},
    {"/w/train.py", "main", 90},
};
static const struct gpuguard_pyframe eval[] = {
    {"/w/train.py", "eval_step", 70},
    {"/w/train.py", "main", 95},
};

static void test_thinned_per_site_with_counts(void)
{
    gg_backward_reset();
    int before = count_of("\"ev\":\"backward\"");
    for (int i = 0; i < 40; i++)
        gg_backward_call(train, 2, "MainThread");
    CHECK_EQ_U64(gg_backward_count(train, 2), 40);
    /* lines 1..8, 16 and 32 */
    CHECK_EQ_U64(count_of("\"ev\":\"backward\"") - before, 10);
    CHECK(count_of("\"count\":8}") == 1);
    CHECK(count_of("\"count\":16}") == 1);
    CHECK(count_of("\"count\":32}") == 1);
    CHECK(count_of("\"count\":9}") == 0);
    CHECK(strstr(journal(), "\"ev\":\"backward\",\"thread\":\"MainThread\",\"pystack\":"
                            "[{\"file\":\"/w/train.py\",\"line\":57,\"func\":\"train_step\"},"
                            "{\"file\":\"/w/train.py\",\"line\":90,\"func\":\"main\"}],"
                            "\"step\":null,\"count\":1}"));
    /* another site counts apart */
    gg_backward_call(eval, 2, "MainThread");
    CHECK_EQ_U64(gg_backward_count(eval, 2), 1);
    CHECK(strstr(journal(), "\"line\":70,\"func\":\"eval_step\"},{\"file\":\"/w/train.py\",\"line\":95,"
                            "\"func\":\"main\"}],\"step\":null,\"count\":1}"));
}

/* The 41st call is left out, then an incident comes: its line is written
 * then, so the latest backward line before the incident is the running one. */
static void test_the_running_call_is_written_before_an_incident(void)
{
    int before = count_of("\"count\":41}");
    gg_backward_call(train, 2, "MainThread");
    CHECK_EQ_U64(count_of("\"count\":41}"), before);
    gg_backward_flush();
    CHECK_EQ_U64(count_of("\"count\":41}"), before + 1);
    gg_backward_flush(); /* once */
    CHECK_EQ_U64(count_of("\"count\":41}"), before + 1);
    /* a kept call superseded by a written one is left out for good, and counted so */
    uint64_t left = gg_events_left_out(GG_EVENT_backward);
    gg_backward_call(train, 2, "MainThread"); /* 42: kept */
    gg_backward_call(eval, 2, "MainThread");  /* eval's 2nd: written */
    CHECK_EQ_U64(gg_events_left_out(GG_EVENT_backward), left + 1);
    gg_backward_flush();
    CHECK_EQ_U64(count_of("\"count\":42}"), 0);
}

static void *named_thread(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "trainer_7", 0, 0, 0);
    gg_backward_call(eval, 1, NULL);
    return NULL;
}

static void test_thread_name_and_step(void)
{
    gg_backward_reset();
    pthread_t t;
    CHECK(pthread_create(&t, NULL, named_thread, NULL) == 0);
    pthread_join(t, NULL);
    CHECK(strstr(journal(), "\"thread\":\"trainer_7\""));
    gg_torch_boundary(11);
    gg_backward_call(train, 1, "MainThread");
    CHECK(strstr(journal(), "\"line\":57,\"func\":\"train_step\"}],\"step\":12,\"count\":1}"));
    /* no frames at all is still a call */
    gg_backward_call(NULL, 3, "MainThread");
    CHECK(strstr(journal(), "\"pystack\":[],\"step\":12,\"count\":1}"));
}

int main(void)
{
    if (!unit_tmpdir(dir) || !gg_journal_open(dir, "test", -1))
        return 1;
    RUN(test_thinned_per_site_with_counts);
    RUN(test_the_running_call_is_written_before_an_incident);
    RUN(test_thread_name_and_step);
    return unit_done();
}
