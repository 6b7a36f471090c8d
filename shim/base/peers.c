/* peers.c - layer 1: the guarded processes of one user that share a GPU
 * (see peers.h). */
#include "peers.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "prim.h"

#define MAGIC 0x31737265657067ull /* "gpeers1" */
#define HEADER 64
#define FILE_BYTES 8192
/* The slots' locks: one byte each, past the data (a lock needs no data). */
#define LOCK_BASE (1 << 20)
#define JOIN_TRIES 20

_Static_assert(sizeof(struct gg_peer_slot) == 64, "a slot is one cache line");
_Static_assert(HEADER + GG_PEERS_SLOTS * sizeof(struct gg_peer_slot) <= FILE_BYTES,
               "the slots fit the file");

struct file {
    _Atomic uint64_t magic;
    uint64_t reserved[7];
};

static struct gg_peer_slot *slot_at(void *map, int i)
{
    return (struct gg_peer_slot *)((char *)map + HEADER) + i;
}

static int lock(int fd, short type, off_t at, off_t len, int cmd)
{
    struct flock l;
    memset(&l, 0, sizeof l);
    l.l_type = type;
    l.l_whence = SEEK_SET;
    l.l_start = at;
    l.l_len = len;
    return fcntl(fd, cmd, &l) == 0 ? (cmd == F_GETLK ? l.l_type : 0) : -1;
}

static void nap_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

int gg_peers_dir(const char *base, char *out, size_t cap, char *why, size_t wcap)
{
    unsigned uid = (unsigned)geteuid();
    int n = snprintf(out, cap, "%s/gpuguard-%u", base, uid);
    if (n <= 0 || (size_t)n >= cap) {
        snprintf(why, wcap, "%s: path too long", base);
        return -1;
    }
    if (mkdir(out, 0700) != 0 && errno != EEXIST) {
        snprintf(why, wcap, "cannot make %s: %s", out, strerror(errno));
        return -1;
    }
    int fd = open(out, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(why, wcap, "cannot open %s: %s%s", out, strerror(errno),
                 errno == ELOOP || errno == ENOTDIR ? " (a symbolic link is never followed)" : "");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    if (st.st_uid != uid || (st.st_mode & 077)) {
        snprintf(why, wcap, "%s belongs to uid %u with mode %03o, not to uid %u alone", out,
                 (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), uid);
        return -1;
    }
    return 0;
}

/* The file's name: the IPC namespace's and the key's, letters kept. */
static void file_name(char *out, size_t cap, const char *key)
{
    struct stat ns;
    unsigned long long ipc = stat("/proc/self/ns/ipc", &ns) == 0 ? (unsigned long long)ns.st_ino : 0;
    int n = snprintf(out, cap, "peers.%llu.", ipc);
    size_t j = n > 0 ? (size_t)n : 0;
    for (const char *k = key; *k && j + 1 < cap; k++) {
        char c = *k;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '-' || c == '_';
        out[j++] = ok ? c : '_';
    }
    out[j] = '\0';
}

/* The ledger, opened: one this user made alone, sized and marked. -1 with
 * why (EAGAIN: try again). */
static int open_file(int dfd, const char *name, void **map, char *why, size_t wcap)
{
    int fd = openat(dfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EEXIST)
        fd = openat(dfd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) /* removed between the two: again */
            return errno = EAGAIN, -1;
        snprintf(why, wcap, "cannot open %s: %s", name, strerror(errno));
        return errno = EINVAL, -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077) || st.st_nlink != 1) {
        snprintf(why, wcap, "%s is not a file of this user's alone; not used", name);
        close(fd);
        return errno = EINVAL, -1;
    }
    /* Extending it from several processes at once is harmless: never shrunk,
     * and new bytes read as zero, a valid empty ledger. */
    if (st.st_size < FILE_BYTES && ftruncate(fd, FILE_BYTES) != 0) {
        snprintf(why, wcap, "cannot size %s: %s", name, strerror(errno));
        close(fd);
        return errno = EINVAL, -1;
    }
    void *m = mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(why, wcap, "cannot map %s: %s", name, strerror(errno));
        close(fd);
        return errno = EINVAL, -1;
    }
    struct file *f = m;
    uint64_t none = 0;
    if (!atomic_compare_exchange_strong(&f->magic, &none, MAGIC) && none != MAGIC) {
        snprintf(why, wcap, "%s was made by another version of gpuguard; not used", name);
        munmap(m, FILE_BYTES);
        close(fd);
        return errno = EINVAL, -1;
    }
    *map = m;
    return fd;
}

/* Does name in dfd still name the file open as fd (the last member did not
 * remove it meanwhile)? */
static bool still_there(int dfd, const char *name, int fd)
{
    struct stat a, b;
    return fstat(fd, &a) == 0 && fstatat(dfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 &&
           a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int gg_peers_join(struct gg_peers *p, const char *dir, const char *key, char *why, size_t wcap)
{
    memset(p, 0, sizeof *p);
    p->fd = -1;
    why[0] = '\0';
    if (!key || !key[0]) {
        snprintf(why, wcap, "the GPU has no UUID");
        return -1;
    }
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    file_name(p->name, sizeof p->name, key);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        snprintf(why, wcap, "cannot open %s: %s", dir, strerror(errno));
        return -1;
    }
    for (int attempt = 0; attempt < JOIN_TRIES; attempt++) {
        void *map = NULL;
        int fd = open_file(dfd, p->name, &map, why, wcap);
        if (fd < 0) {
            if (errno != EAGAIN)
                break;
            continue;
        }
        int index = -1;
        for (int i = 0; i < GG_PEERS_SLOTS && index < 0; i++)
            if (lock(fd, F_WRLCK, LOCK_BASE + i, 1, F_SETLK) == 0)
                index = i;
        if (index >= 0 && still_there(dfd, p->name, fd)) {
            struct gg_peer_slot *s = slot_at(map, index);
            /* A dead member's figures, if any: this slot is ours now. */
            atomic_store(&s->pending, 0);
            atomic_store(&s->claim, 0);
            atomic_store(&s->cur, 0);
            atomic_store(&s->pid, (int32_t)getpid());
            p->map = map;
            p->fd = fd;
            p->index = index;
            p->self = s;
            close(dfd);
            why[0] = '\0';
            return 0;
        }
        /* Every slot taken, or the last member removed the file meanwhile
         * (it holds every slot's lock while it does): again. */
        munmap(map, FILE_BYTES);
        close(fd);
        snprintf(why, wcap, "%s: all %d slots are in use", p->name, GG_PEERS_SLOTS);
        nap_us(1000);
    }
    close(dfd);
    return -1;
}

void gg_peers_leave(struct gg_peers *p)
{
    struct gg_peer_slot *s = p->self;
    if (!s)
        return;
    atomic_store(&s->pending, 0);
    atomic_store(&s->claim, 0);
    atomic_store(&s->cur, 0);
    atomic_store(&s->pid, 0);
    /* The last member: no other process holds a slot's lock. The file goes;
     * one joining meanwhile sees it gone and makes another. */
    if (lock(p->fd, F_WRLCK, LOCK_BASE, GG_PEERS_SLOTS, F_SETLK) == 0) {
        int dfd = open(p->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd >= 0) {
            if (still_there(dfd, p->name, p->fd))
                unlinkat(dfd, p->name, 0);
            close(dfd);
        }
        lock(p->fd, F_UNLCK, LOCK_BASE, GG_PEERS_SLOTS, F_SETLK);
    }
    /* The mapping and the descriptor stay: a thread still allocating at
     * exit writes a slot nobody counts any more. */
}

void gg_peers_after_fork(struct gg_peers *p)
{
    /* The child has the mapping but not the lock (record locks are not
     * inherited): it passes through and never writes the parent's slot. */
    p->self = NULL;
}

void gg_peers_raise(const struct gg_peers *p, uint64_t want)
{
    if (!p->self)
        return;
    uint64_t k = atomic_load(&p->self->claim);
    while (k < want && !atomic_compare_exchange_weak(&p->self->claim, &k, want)) {
    }
    atomic_thread_fence(memory_order_seq_cst);
}

void gg_peers_lower(const struct gg_peers *p, uint64_t from, uint64_t to)
{
    if (p->self && to < from)
        atomic_compare_exchange_strong(&p->self->claim, &from, to);
}

uint64_t gg_peers_pending(const struct gg_peers *p, int64_t delta)
{
    if (!p->self)
        return 0;
    return atomic_fetch_add(&p->self->pending, (uint64_t)delta) + (uint64_t)delta;
}

/* Is member i alive? Its lock says; a dead one's share is dropped (zeroed
 * under its lock, which a process joining meanwhile cannot take). */
static bool alive(const struct gg_peers *p, int i, struct gg_peers_sum *out)
{
    int held = lock(p->fd, F_WRLCK, LOCK_BASE + i, 1, F_GETLK);
    if (held != F_UNLCK)
        return true; /* held, or cannot tell: counted */
    if (lock(p->fd, F_WRLCK, LOCK_BASE + i, 1, F_SETLK) != 0)
        return true; /* someone took it just now */
    struct gg_peer_slot *s = slot_at(p->map, i);
    atomic_store(&s->pending, 0);
    atomic_store(&s->claim, 0);
    atomic_store(&s->cur, 0);
    atomic_store(&s->pid, 0);
    lock(p->fd, F_UNLCK, LOCK_BASE + i, 1, F_SETLK);
    out->dropped++;
    return false;
}

void gg_peers_sum(const struct gg_peers *p, struct gg_peers_sum *out)
{
    memset(out, 0, sizeof *out);
    out->first = true;
    if (!p->self)
        return;
    atomic_thread_fence(memory_order_seq_cst);
    for (int i = 0; i < GG_PEERS_SLOTS; i++) {
        if (i == p->index)
            continue;
        struct gg_peer_slot *s = slot_at(p->map, i);
        uint64_t pending = atomic_load(&s->pending), claim = atomic_load(&s->claim);
        uint64_t cur = atomic_load(&s->cur);
        int32_t pid = atomic_load_explicit(&s->pid, memory_order_relaxed);
        if (!pending && !claim && !cur && !pid)
            continue;
        if (!alive(p, i, out))
            continue;
        out->cur += cur;
        out->extra += claim > cur ? claim - cur : 0;
        out->pending += pending;
        if (pending && i < p->index)
            out->first = false;
        if (out->members < (int)GG_COUNT(out->pids))
            out->pids[out->members] = pid;
        out->members++;
    }
}
