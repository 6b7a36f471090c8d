/* test_journal.c - the journal file (journal.c): its name, whole lines,
 * lines held until it opens, and a descriptor taken over by the program. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "journal.h"
#include "unit.h"

static char dir[] = "/tmp/gg_journal_XXXXXX";

static void test_open_and_write(void)
{
    char want[256], buf[1024];
    gg_journal_hold();
    gg_journal_write("{\"held\":1}\n", 11);
    CHECK(gg_journal_open(dir, "trainer", 3));
    snprintf(want, sizeof want, "%s/gpuguard.trainer.rank3.%d.jsonl", dir, (int)getpid());
    CHECK_STR(gg_journal_path(), want);
    gg_journal_release(true);
    gg_journal_write("{\"a\":1}\n", 8);
    unit_slurp(want, buf, sizeof buf);
    CHECK_STR(buf, "{\"held\":1}\n{\"a\":1}\n");
    /* never a second journal over the first: the same pid's next life
     * (exec'ed, or the same pid in another container) gets the next name */
    CHECK(gg_journal_open(dir, "trainer", 3));
    snprintf(want, sizeof want, "%s/gpuguard.trainer.rank3.%d-2.jsonl", dir, (int)getpid());
    CHECK_STR(gg_journal_path(), want);
    snprintf(want, sizeof want, "%s/gpuguard.trainer.rank3.%d.jsonl", dir, (int)getpid());
    unit_slurp(want, buf, sizeof buf);
    CHECK_STR(buf, "{\"held\":1}\n{\"a\":1}\n");
    CHECK(gg_journal_open(dir, "trainer", -1));
}

static void test_taken_over(void)
{
    char buf[1024], own[300];
    const char *path = gg_journal_path();
    char saved[300];
    snprintf(saved, sizeof saved, "%s", path);
    /* The program closes every descriptor and opens its own file, which gets
     * the journal's number. */
    for (int fd = 3; fd < 64; fd++)
        close(fd);
    snprintf(own, sizeof own, "%s/own.txt", dir);
    int fd = open(own, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 3);
    gg_journal_write("{\"b\":2}\n", 8);
    unit_slurp(own, buf, sizeof buf);
    CHECK_STR(buf, "");
    unit_slurp(saved, buf, sizeof buf);
    CHECK_STR(buf, "{\"b\":2}\n");
    close(fd);
    gg_journal_drop();
    gg_journal_write("{\"c\":3}\n", 8); /* dropped: nowhere */
    unit_slurp(saved, buf, sizeof buf);
    CHECK_STR(buf, "{\"b\":2}\n");
    CHECK(gg_journal_path() == NULL);
}

static void test_unwritable(void)
{
    CHECK(!gg_journal_open("/nonexistent/dir", "x", -1));
    CHECK(gg_journal_path() == NULL);
}

int main(void)
{
    if (!unit_tmpdir(dir))
        return 1;
    RUN(test_open_and_write);
    RUN(test_taken_over);
    RUN(test_unwritable);
    return unit_done();
}
