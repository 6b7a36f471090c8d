/* test_prim.c - layer 0 (prim.c): clocks, say, the process name, the
 * environment copy, file creation, pages, the lock and its try. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prim.h"
#include "unit.h"

static void test_clock(void)
{
    uint64_t a = gg_now_ns(), b = gg_now_ns();
    CHECK(b >= a);
    CHECK(gg_wall_s() > 1.7e9); /* after 2023 */
    gg_clock_start();
    usleep(2000);
    double t = gg_clock_since_start();
    CHECK(t >= 0.002 && t < 5.0);
}

/* The process's name, not the calling thread's. */
static void *renamed_thread(void *arg)
{
    prctl(PR_SET_NAME, "pt_autograd_0", 0, 0, 0);
    gg_proc_name(arg, 64);
    return NULL;
}

static void test_proc_name(void)
{
    char main_name[64], thread_name[64];
    gg_proc_name(main_name, sizeof main_name);
    CHECK_STR(main_name, "test_prim");
    pthread_t t;
    pthread_create(&t, NULL, renamed_thread, thread_name);
    pthread_join(t, NULL);
    CHECK_STR(thread_name, "test_prim");
    char tiny[5];
    gg_proc_name(tiny, sizeof tiny);
    CHECK_STR(tiny, "test");
}

static void test_env_copy(void)
{
    char buf[8];
    bool too_long;
    setenv("GG_TEST_X", "abc", 1);
    CHECK_STR(gg_env_copy("GG_TEST_X", buf, sizeof buf, &too_long), "abc");
    setenv("GG_TEST_X", "abc", 1);
    setenv("GG_TEST_X", "def", 1);
    CHECK_STR(buf, "abc"); /* a copy: the live environment changed, it did not */
    setenv("GG_TEST_X", "12345678", 1);
    CHECK(gg_env_copy("GG_TEST_X", buf, sizeof buf, &too_long) == NULL);
    CHECK(too_long);
    setenv("GG_TEST_X", "", 1);
    CHECK(gg_env_copy("GG_TEST_X", buf, sizeof buf, &too_long) == NULL);
    CHECK(!too_long);
    unsetenv("GG_TEST_X");
    CHECK(gg_env_copy("GG_TEST_X", buf, sizeof buf, NULL) == NULL);
}

static void test_file_create(void)
{
    char dir[] = "/tmp/gg_prim_XXXXXX", path[64], link[64];
    CHECK(unit_tmpdir(dir) != NULL);
    snprintf(path, sizeof path, "%s/j", dir);
    int fd = gg_file_create(path);
    CHECK(fd >= 0);
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    close(fd);
    CHECK(gg_file_create(path) == -1 && errno == EEXIST); /* never one it did not create */
    snprintf(link, sizeof link, "%s/l", dir);
    CHECK(symlink("/tmp/gg_prim_target_never", link) == 0);
    CHECK(gg_file_create(link) == -1); /* never through a symlink */
    unlink(link);
    unlink(path);
    rmdir(dir);
}

static void test_pages(void)
{
    char *p = gg_pages(1 << 20);
    CHECK(p != NULL);
    CHECK(p[0] == 0 && p[(1 << 20) - 1] == 0);
    p[100] = 1;
    gg_pages_free(p, 1 << 20);
    gg_pages_free(NULL, 0);
}

static gg_spin lock = GG_SPIN_INIT;
static long counter;

static void *adder(void *arg)
{
    (void)arg;
    for (int i = 0; i < 100000; i++) {
        gg_spin_lock(&lock);
        counter++;
        gg_spin_unlock(&lock);
    }
    return NULL;
}

static void test_lock(void)
{
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, adder, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK_EQ_U64(counter, 400000);
    /* held: a bounded try gives up instead of waiting forever */
    gg_spin_lock(&lock);
    CHECK(!gg_spin_trylock(&lock, 100));
    gg_spin_unlock(&lock);
    CHECK(gg_spin_trylock(&lock, 0));
    gg_spin_reset(&lock);
    CHECK(gg_spin_trylock(&lock, 0));
    gg_spin_unlock(&lock);
}

static void test_numbers(void)
{
    _Atomic uint64_t m = 5;
    CHECK(gg_atomic_max(&m, 7));
    CHECK(!gg_atomic_max(&m, 6));
    CHECK_EQ_U64(m, 7);
    CHECK(gg_mix64(1) != gg_mix64(2));
    CHECK(gg_hash_bytes("ab", 2) != gg_hash_bytes("ba", 2));
    char b[32];
    gg_fmt_bytes(b, sizeof b, 512);
    CHECK_STR(b, "512 B");
    gg_fmt_bytes(b, sizeof b, 3ull << 29);
    CHECK_STR(b, "1.5 GiB");
}

/* The side stack: last in, first out, bounded, per thread. */
static void test_side_stack(void)
{
    char *a = gg_side_push(100), *b = gg_side_push(4000);
    CHECK(a && b && b >= a + 100);
    CHECK(((uintptr_t)a & 15) == 0 && ((uintptr_t)b & 15) == 0);
    memset(a, 1, 100);
    memset(b, 2, 4000);
    CHECK_EQ_U64(gg_side_used(), 112 + 4000);
    gg_side_pop(b);
    CHECK_EQ_U64(gg_side_used(), 112);
    char *c = gg_side_push(GG_SIDE_BYTES); /* more than is left: none */
    CHECK(c == NULL);
    CHECK_EQ_U64(gg_side_used(), 112);
    gg_side_pop(a);
    CHECK_EQ_U64(gg_side_used(), 0);
    gg_side_pop(NULL);
    int x;
    gg_side_pop(&x); /* not the side stack's: ignored */
    CHECK_EQ_U64(gg_side_used(), 0);
}

static void test_real_dlsym(void)
{
    CHECK(gg_real_dlsym(RTLD_DEFAULT, "getpid") == (void *)getpid);
    CHECK(gg_real_dlsym(RTLD_DEFAULT, "gg_no_such_symbol") == NULL);
}

int main(void)
{
    RUN(test_clock);
    RUN(test_proc_name);
    RUN(test_env_copy);
    RUN(test_file_create);
    RUN(test_pages);
    RUN(test_lock);
    RUN(test_numbers);
    RUN(test_side_stack);
    RUN(test_real_dlsym);
    return unit_done();
}
