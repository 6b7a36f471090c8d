/* test_peers.c - the ledger guarded processes share per GPU: the user's
 * directory and file (never another user's, a link, or one open to others),
 * members that see each other, a killed member's share dropped, the last
 * one out removing the file, threads raising and lowering claims while
 * others sum, and two processes deciding at the same moment: at least one
 * sees the other, every time. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "peers.h"
#include "unit.h"

static char base[256];

static void setup(void)
{
    snprintf(base, sizeof base, "/tmp/gg-peers-test-XXXXXX");
    if (!unit_tmpdir(base))
        abort();
}

static void rm_rf(const char *path)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        printf("  (could not remove %s)\n", path);
}

static void test_the_users_directory(void)
{
    char dir[512], why[512];
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == 0);
    struct stat st;
    CHECK(stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    CHECK(st.st_uid == geteuid());
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == 0); /* again: the same */
    /* open to others: refused, and said */
    chmod(dir, 0755);
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == -1);
    CHECK(strstr(why, "mode 755") != NULL);
    chmod(dir, 0700);
    /* a symbolic link in its place: never followed */
    char other[600], link_base[300];
    snprintf(link_base, sizeof link_base, "%s/l", base);
    mkdir(link_base, 0700);
    snprintf(other, sizeof other, "%s/gpuguard-%u", link_base, (unsigned)geteuid());
    CHECK(symlink(dir, other) == 0);
    CHECK(gg_peers_dir(link_base, dir, sizeof dir, why, sizeof why) == -1);
    CHECK(strstr(why, "symbolic link") != NULL);
}

static void test_a_file_of_this_user_alone(void)
{
    char dir[512], why[512], path[700];
    struct gg_peers p;
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == 0);
    CHECK(gg_peers_join(&p, dir, "GPU-aaaa", why, sizeof why) == 0);
    CHECK(gg_peers_on(&p));
    snprintf(path, sizeof path, "%s/%s", dir, p.name);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    gg_peers_leave(&p);
    CHECK(stat(path, &st) != 0 && errno == ENOENT); /* the last one out removed it */
    /* a file open to others in its place: not used */
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0);
    fchmod(fd, 0644);
    close(fd);
    CHECK(gg_peers_join(&p, dir, "GPU-aaaa", why, sizeof why) == -1);
    CHECK(!gg_peers_on(&p));
    CHECK(strstr(why, "not a file of this user's alone") != NULL);
    unlink(path);
    /* a link in its place: never followed */
    CHECK(symlink("/etc/passwd", path) == 0);
    CHECK(gg_peers_join(&p, dir, "GPU-aaaa", why, sizeof why) == -1);
    unlink(path);
    /* another version's file */
    fd = open(path, O_CREAT | O_WRONLY, 0600);
    CHECK(fd >= 0 && write(fd, "gpuguard-v9-xxxx", 16) == 16);
    close(fd);
    CHECK(gg_peers_join(&p, dir, "GPU-aaaa", why, sizeof why) == -1);
    CHECK(strstr(why, "another version") != NULL);
    unlink(path);
    /* no UUID, no ledger */
    CHECK(gg_peers_join(&p, dir, "", why, sizeof why) == -1);
}

/* A member in a child process: joins, publishes, says so on a pipe, then
 * waits to be killed (or leaves when told). */
static pid_t member(const char *dir, const char *key, uint64_t cur, uint64_t claim, int *ready,
                    int *go)
{
    int up[2], down[2];
    if (pipe(up) || pipe(down))
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        struct gg_peers p;
        char why[256], c = 0;
        close(up[0]);
        close(down[1]);
        if (gg_peers_join(&p, dir, key, why, sizeof why) != 0)
            _exit(3);
        gg_peers_publish(&p, cur);
        gg_peers_raise(&p, claim);
        if (write(up[1], "j", 1) != 1)
            _exit(4);
        if (read(down[0], &c, 1) == 1 && c == 'l')
            gg_peers_leave(&p);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    *ready = up[0];
    *go = down[1];
    char c;
    if (read(up[0], &c, 1) != 1)
        printf("  member %d did not join\n", (int)pid);
    return pid;
}

static void test_members_see_each_other_and_the_dead_are_dropped(void)
{
    char dir[512], why[512], path[700];
    struct gg_peers p;
    struct gg_peers_sum s;
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == 0);
    CHECK(gg_peers_join(&p, dir, "GPU-bbbb", why, sizeof why) == 0);
    gg_peers_publish(&p, 7);
    int r1, g1, r2, g2;
    pid_t a = member(dir, "GPU-bbbb", 100, 300, &r1, &g1);
    pid_t b = member(dir, "GPU-bbbb", 1000, 1000, &r2, &g2);
    gg_peers_sum(&p, &s);
    CHECK_EQ_U64(s.members, 2);
    CHECK_EQ_U64(s.cur, 1100);
    CHECK_EQ_U64(s.extra, 200);
    CHECK_EQ_U64(s.dropped, 0);
    CHECK((s.pids[0] == a && s.pids[1] == b) || (s.pids[0] == b && s.pids[1] == a));
    /* another GPU's ledger is another file */
    struct gg_peers q;
    CHECK(gg_peers_join(&q, dir, "GPU-cccc", why, sizeof why) == 0);
    gg_peers_sum(&q, &s);
    CHECK_EQ_U64(s.members, 0);
    gg_peers_leave(&q);
    /* killed: no share left behind */
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    gg_peers_sum(&p, &s);
    CHECK_EQ_U64(s.members, 1);
    CHECK_EQ_U64(s.cur, 1000);
    CHECK_EQ_U64(s.extra, 0);
    CHECK_EQ_U64(s.dropped, 1);
    gg_peers_sum(&p, &s);
    CHECK_EQ_U64(s.dropped, 0); /* dropped once */
    /* a member that leaves: gone at once, the file stays for the rest */
    CHECK(write(g2, "l", 1) == 1);
    waitpid(b, NULL, 0);
    gg_peers_sum(&p, &s);
    CHECK_EQ_U64(s.members, 0);
    CHECK_EQ_U64(s.dropped, 0);
    snprintf(path, sizeof path, "%s/%s", dir, p.name);
    struct stat st;
    CHECK(stat(path, &st) == 0);
    gg_peers_leave(&p);
    CHECK(stat(path, &st) != 0);
    close(r1);
    close(g1);
    close(r2);
    close(g2);
}

static void test_a_slot_reused_starts_from_zero(void)
{
    char dir[512], why[512];
    struct gg_peers p;
    struct gg_peers_sum s;
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == 0);
    CHECK(gg_peers_join(&p, dir, "GPU-dddd", why, sizeof why) == 0);
    int r, g;
    pid_t a = member(dir, "GPU-dddd", 5 << 20, 6 << 20, &r, &g);
    kill(a, SIGKILL);
    waitpid(a, NULL, 0);
    /* the next member takes the dead one's slot and its figures are its own */
    pid_t b = member(dir, "GPU-dddd", 1, 2, &r, &g);
    gg_peers_sum(&p, &s);
    CHECK_EQ_U64(s.members, 1);
    CHECK_EQ_U64(s.cur, 1);
    CHECK_EQ_U64(s.extra, 1);
    kill(b, SIGKILL);
    waitpid(b, NULL, 0);
    gg_peers_leave(&p);
}

/* Two processes raise their claims at the same moment, each then sums the
 * other: at least one of them sees the other's new claim, every round. */
struct rounds {
    _Atomic int turn[2];
    _Atomic int saw[2][4000];
};

static void race(struct gg_peers *p, struct rounds *r, int me, int n)
{
    struct gg_peers_sum s;
    for (int i = 0; i < n; i++) {
        atomic_store(&r->turn[me], i + 1);
        while (atomic_load(&r->turn[!me]) < i + 1) {
        }
        uint64_t want = (uint64_t)(i + 1) * 1000;
        gg_peers_raise(p, want);
        gg_peers_sum(p, &s);
        atomic_store(&r->saw[me][i], s.extra + s.cur >= want);
        while (atomic_load(&r->turn[!me]) < i + 1) {
        }
    }
}

static void test_two_deciding_at_once_see_each_other(void)
{
    enum { N = 4000 };
    char dir[512], why[512];
    struct rounds *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(r != MAP_FAILED);
    memset(r, 0, sizeof *r);
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        struct gg_peers p;
        if (gg_peers_join(&p, dir, "GPU-eeee", why, sizeof why) != 0)
            _exit(3);
        race(&p, r, 1, N);
        _exit(0);
    }
    struct gg_peers p;
    CHECK(gg_peers_join(&p, dir, "GPU-eeee", why, sizeof why) == 0);
    race(&p, r, 0, N);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int neither = 0, both = 0;
    for (int i = 0; i < N; i++) {
        neither += !r->saw[0][i] && !r->saw[1][i];
        both += r->saw[0][i] && r->saw[1][i];
    }
    CHECK_EQ_U64(neither, 0);
    printf("  %d rounds: both saw the other in %d\n", N, both);
    gg_peers_leave(&p);
    munmap(r, sizeof *r);
}

/* Threads of one process raise, lower and count pending requests while
 * another process sums: the figures stay whole (TSan checks the rest). */
static struct gg_peers shared_p;

static void *worker(void *arg)
{
    uint64_t id = (uint64_t)(uintptr_t)arg;
    for (int i = 0; i < 20000; i++) {
        gg_peers_pending(&shared_p, 10);
        uint64_t k = gg_peers_claim(&shared_p);
        gg_peers_raise(&shared_p, k + id);
        gg_peers_publish(&shared_p, (uint64_t)i);
        gg_peers_lower(&shared_p, k + id, k);
        gg_peers_pending(&shared_p, -10);
    }
    return NULL;
}

static void test_threads_raise_and_lower(void)
{
    char dir[512], why[512];
    CHECK(gg_peers_dir(base, dir, sizeof dir, why, sizeof why) == 0);
    CHECK(gg_peers_join(&shared_p, dir, "GPU-ffff", why, sizeof why) == 0);
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_U64(gg_peers_pending(&shared_p, 0), 0);
    gg_peers_leave(&shared_p);
}

int main(void)
{
    setup();
    RUN(test_the_users_directory);
    RUN(test_a_file_of_this_user_alone);
    RUN(test_members_see_each_other_and_the_dead_are_dropped);
    RUN(test_a_slot_reused_starts_from_zero);
    RUN(test_two_deciding_at_once_see_each_other);
    RUN(test_threads_raise_and_lower);
    rm_rf(base);
    return unit_done();
}
