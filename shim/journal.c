/* journal.c - layer 4: the journal file (see journal.h). */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
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

bool gg_journal_open(const char *dir, const char *comm, long rank)
{
    int n;
    if (rank >= 0)
        n = snprintf(path, sizeof path, "%s/gpuguard.%s.rank%ld.%d.jsonl", dir, comm, rank,
                     (int)getpid());
    else
        n = snprintf(path, sizeof path, "%s/gpuguard.%s.%d.jsonl", dir, comm, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof path) {
        gg_say("journal directory name too long: %s; no journal", dir);
        path[0] = '\0';
        return false;
    }
    int f = gg_file_create(path);
    struct stat st;
    if (f < 0 || fstat(f, &st) != 0) {
        gg_say("cannot create journal %s: %s; no journal", path, strerror(errno));
        if (f >= 0)
            close(f);
        path[0] = '\0';
        return false;
    }
    file_dev = st.st_dev;
    file_ino = st.st_ino;
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
    gg_spin_lock(&reopen_lock);
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

#define PENDING 16
#define PENDING_LEN 1024
static char pending[PENDING][PENDING_LEN];
static size_t pending_len[PENDING];
static int npending;
static bool holding;

void gg_journal_hold(void)
{
    holding = true;
    npending = 0;
}

void gg_journal_release(bool open)
{
    holding = false;
    for (int i = 0; open && i < npending; i++)
        gg_journal_write(pending[i], pending_len[i]);
    npending = 0;
}

void gg_journal_write(const char *line, size_t len)
{
    if (holding) {
        /* Only the starting thread writes while holding (others wait). */
        if (npending < PENDING && len <= PENDING_LEN) {
            memcpy(pending[npending], line, len);
            pending_len[npending++] = len;
        }
        return;
    }
    int f = atomic_load_explicit(&fd, memory_order_relaxed);
    if (f < 0)
        return;
    int saved = errno;
    if (gg_unlikely(!is_ours(f)))
        f = reopen(f);
    if (f >= 0)
        (void)gg_write_all(f, line, len);
    errno = saved;
}
