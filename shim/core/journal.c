/* journal.c - layer 4: the journal file (see journal.h). */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prim.h"

static _Atomic int fd = -1;
static dev_t file_dev;
static ino_t file_ino;
static char path[GG_PATH_MAX + 128];
static gg_spin reopen_lock = GG_SPIN_INIT;

/* Writers take turns, in the order they came (a ticket lock: lines land in
 * the order they were finished), so that a line that did not fit can be
 * cut off again before anyone appends after it. A signal handler that
 * interrupts a write on its own thread does not wait for itself: its line
 * is lost, and counted. */
static _Atomic unsigned turn_next, turn_now;
static GG_TLS bool writing;
static _Atomic bool final_lines; /* see gg_journal_final */

static bool take_turn(void)
{
    if (writing)
        return false; /* this thread is waiting for, or has, a turn */
    writing = true;
    unsigned me = atomic_fetch_add_explicit(&turn_next, 1, memory_order_relaxed);
    for (unsigned spins = 0; atomic_load_explicit(&turn_now, memory_order_acquire) != me;
         spins++) {
        if (spins > 64)
            sched_yield();
    }
    return true;
}

static void end_turn(void)
{
    writing = false;
    atomic_fetch_add_explicit(&turn_now, 1, memory_order_release);
}
static off_t end;                    /* the journal's size: whole lines only */
static _Atomic uint64_t lost, lost_said; /* lines not written; of them, said in the journal */
static bool failing;                 /* a write has failed (said once on stderr) */

/* The first life of pid P is gpuguard.<comm>.P.jsonl; a file of that name
 * already there (the same pid in an earlier container, or this process
 * before it exec'ed itself) makes it P-2, P-3, ...: never someone else's
 * file, never appended to. */
#define LIVES 64
static int create(const char *dir, const char *comm, long rank, int *life)
{
    for (*life = 1; *life <= LIVES; (*life)++) {
        char pid[32], rk[32] = "";
        if (*life == 1)
            snprintf(pid, sizeof pid, "%d", (int)getpid());
        else
            snprintf(pid, sizeof pid, "%d-%d", (int)getpid(), *life);
        if (rank >= 0)
            snprintf(rk, sizeof rk, ".rank%ld", rank);
        size_t dl = strlen(dir);
        int n = snprintf(path, sizeof path, "%s%sgpuguard.%s%s.%s.jsonl", dir,
                         dl && dir[dl - 1] == '/' ? "" : "/", comm, rk, pid);
        if (n < 0 || (size_t)n >= sizeof path) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int f = gg_file_create(path);
        if (f >= 0 || errno != EEXIST)
            return f;
    }
    return -1;
}

bool gg_journal_open(const char *dir, const char *comm, long rank)
{
    int life;
    int f = create(dir, comm, rank, &life);
    struct stat st;
    if (f < 0 || fstat(f, &st) != 0) {
        if (errno == ENAMETOOLONG)
            gg_say("journal directory name too long: %s; no journal", dir);
        else
            gg_say("cannot create journal %s: %s; no journal", path, strerror(errno));
        if (f >= 0)
            close(f);
        path[0] = '\0';
        return false;
    }
    file_dev = st.st_dev;
    file_ino = st.st_ino;
    end = 0;
    atomic_store(&fd, f);
    return true;
}

const char *gg_journal_path(void)
{
    return path[0] ? path : NULL;
}

void gg_journal_drop(void)
{
    int f = atomic_exchange(&fd, -1);
    if (f >= 0)
        close(f);
    path[0] = '\0';
    /* A parent thread's turn never ends here: start the turns afresh. */
    atomic_store(&turn_next, 0);
    atomic_store(&turn_now, 0);
    writing = false;
    gg_spin_reset(&reopen_lock);
}

static bool is_ours(int f)
{
    struct stat st;
    return fstat(f, &st) == 0 && st.st_dev == file_dev && st.st_ino == file_ino;
}

/* The descriptor is someone else's now: open the journal again by its path
 * (no O_CREAT: only the file the shim created, if it is still there). */
static GG_COLD int reopen(int stale)
{
    static bool said;
    int f = -1;
    if (!gg_spin_trylock(&reopen_lock, 1000000))
        return -1; /* a signal handler interrupting a reopen on its own thread */
    int cur = atomic_load(&fd);
    if (cur != stale) { /* another thread did it */
        gg_spin_unlock(&reopen_lock);
        return cur;
    }
    f = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    if (f >= 0 && !is_ours(f)) {
        close(f);
        f = -1;
    }
    struct stat st;
    if (f >= 0 && fstat(f, &st) == 0)
        end = st.st_size;
    atomic_store(&fd, f);
    gg_spin_unlock(&reopen_lock);
    if (f < 0 && !said) {
        said = true;
        gg_say("the journal's descriptor was taken over by the program and %s cannot be opened "
               "again; no more journal lines", path);
    }
    return f;
}

/* ---- lines before the journal opens ---------------------------------------------- */

/* What the start says before the journal opens (problems in the policies,
 * the start event of a node with 16 GPUs): kept whole, back to back, in
 * pages mapped for the start and unmapped after; what does not fit is
 * counted as lost. */
#define PENDING_BYTES (256u << 10)
static char *pending;
static size_t pending_used;
static bool holding;

void gg_journal_hold(void)
{
    holding = true;
    pending_used = 0;
    if (!pending)
        pending = gg_pages(PENDING_BYTES);
}

void gg_journal_release(bool open)
{
    holding = false;
    for (size_t at = 0; open && pending && at < pending_used;) {
        const char *nl = memchr(pending + at, '\n', pending_used - at);
        size_t len = nl ? (size_t)(nl - (pending + at)) + 1 : pending_used - at;
        gg_journal_write(pending + at, len);
        at += len;
    }
    pending_used = 0;
    gg_pages_free(pending, PENDING_BYTES);
    pending = NULL;
}

/* One write; what a full disk (or a file size limit) let through of a line
 * is cut off again, so the file holds whole lines only. */
static bool write_whole(int f, const char *line, size_t len)
{
    ssize_t n;
    do
        n = write(f, line, len);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)len) {
        end += n;
        return true;
    }
    int why = n < 0 ? errno : ENOSPC;
    if (n > 0 && ftruncate(f, end) != 0) {
        /* The fragment stays: end the line, so that the next ones parse. */
        if (write(f, "\n", 1) == 1)
            end += n + 1;
    }
    if (!failing) { /* once: the count is in the summary */
        failing = true;
        gg_say("cannot write the journal %s: %s; lines that do not fit are lost, and counted",
               path, strerror(why));
    }
    return false;
}

/* One line to the file (not while holding); a failure is counted as a lost
 * line when `counted`. */
static bool put(const char *line, size_t len, bool counted)
{
    int f = atomic_load_explicit(&fd, memory_order_relaxed);
    if (f < 0)
        return false;
    int saved = errno;
    if (gg_unlikely(!is_ours(f)))
        f = reopen(f);
    bool ok = false;
    if (f >= 0 && take_turn()) {
        ok = write_whole(f, line, len);
        end_turn();
    } else if (f >= 0 && final_lines) {
        /* The exit path on a thread whose own write it interrupted (a
         * signal handler calling exit()): the summary is written anyway,
         * after that write's whole line. */
        ok = write_whole(f, line, len);
    }
    if (!ok && f >= 0 && counted)
        atomic_fetch_add_explicit(&lost, 1, memory_order_relaxed);
    errno = saved;
    return ok;
}

bool gg_journal_write(const char *line, size_t len)
{
    if (holding) {
        /* Only the starting thread writes while holding (others wait). */
        if (pending && len <= PENDING_BYTES - pending_used) {
            memcpy(pending + pending_used, line, len);
            pending_used += len;
            return true;
        }
        atomic_fetch_add_explicit(&lost, 1, memory_order_relaxed);
        return false;
    }
    return put(line, len, true);
}

bool gg_journal_write_note(const char *line, size_t len)
{
    return !holding && put(line, len, false);
}

void gg_journal_final(void)
{
    atomic_store(&final_lines, true);
}

uint64_t gg_journal_lost(void)
{
    return atomic_load_explicit(&lost, memory_order_relaxed);
}

uint64_t gg_journal_lost_unsaid(void)
{
    return atomic_load_explicit(&lost, memory_order_relaxed) -
           atomic_load_explicit(&lost_said, memory_order_relaxed);
}

void gg_journal_lost_said(uint64_t n)
{
    atomic_fetch_add_explicit(&lost_said, n, memory_order_relaxed);
}
