/* journal.c - the JSON-lines journal (see journal.h). */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "os.h"

static _Atomic int journal_fd = -1;
static char journal_path[1200];
static uint64_t start_ns;

double gg_journal_time(void)
{
    return (double)(gg_now_ns() - start_ns) / 1e9;
}

bool gg_journal_open(const char *dir, const char *rank)
{
    start_ns = gg_now_ns();
    char comm[32], rk[32];
    gg_comm(comm, sizeof comm);
    if (rank) {
        /* RANK goes into a file name: digits only, as ranks are. */
        size_t j = 0;
        for (size_t i = 0; rank[i] && j + 1 < sizeof rk; i++)
            rk[j++] = rank[i] >= '0' && rank[i] <= '9' ? rank[i] : '_';
        rk[j] = '\0';
        rank = rk;
    }
    int n;
    if (rank)
        n = snprintf(journal_path, sizeof journal_path, "%s/gpuguard.%s.rank%s.%d.jsonl",
                     dir, comm, rank, (int)getpid());
    else
        n = snprintf(journal_path, sizeof journal_path, "%s/gpuguard.%s.%d.jsonl", dir, comm,
                     (int)getpid());
    if (n < 0 || (size_t)n >= sizeof journal_path) {
        gg_say("journal directory name too long: %s; no journal", dir);
        journal_path[0] = '\0';
        return false;
    }
    int fd = open(journal_path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC,
                  0600);
    if (fd < 0) {
        gg_say("cannot create journal %s: %s; no journal", journal_path, strerror(errno));
        journal_path[0] = '\0';
        return false;
    }
    atomic_store(&journal_fd, fd);
    return true;
}

const char *gg_journal_path(void)
{
    return journal_path[0] ? journal_path : NULL;
}

void gg_journal_drop(void)
{
    int fd = atomic_exchange(&journal_fd, -1);
    if (fd >= 0)
        close(fd);
    journal_path[0] = '\0';
}

void gg_journal_begin(struct gg_json *j, char *buf, size_t cap, const char *ev)
{
    gg_json_init(j, buf, cap);
    gg_json_obj(j);
    gg_json_kf64(j, "t", gg_journal_time());
    gg_json_kstr(j, "ev", ev);
}

void gg_journal_end(struct gg_json *j)
{
    gg_json_obj_end(j);
    gg_json_raw_newline(j);
    int fd = atomic_load_explicit(&journal_fd, memory_order_relaxed);
    if (fd >= 0 && !j->failed) {
        int saved = errno;
        (void)gg_write_all(fd, j->buf, j->len);
        errno = saved;
    }
    gg_json_free(j);
}

/* Errors found while starting, before the journal exists (policy problems). */
#define PENDING 16
static char pending[PENDING][512];
static int npending;
static bool holding;

void gg_journal_hold(void)
{
    holding = true;
    npending = 0;
}

static void error_event(const char *msg)
{
    char buf[1024];
    struct gg_json j;
    gg_journal_begin(&j, buf, sizeof buf, "error");
    gg_json_kstr(&j, "message", msg);
    gg_journal_end(&j);
}

void gg_journal_release(bool open)
{
    holding = false;
    for (int i = 0; open && i < npending; i++)
        error_event(pending[i]);
    npending = 0;
}

void gg_journal_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    gg_say("%s", msg);
    if (holding) {
        if (npending < PENDING)
            memcpy(pending[npending++], msg, sizeof msg);
        return;
    }
    error_event(msg);
}
