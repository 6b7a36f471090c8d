/* test_values.c - the one parser per kind of value (values.c); sizes are
 * also exercised through files in test_policy.c. */
#include <signal.h>

#include "values.h"
#include "unit.h"

#define GiB (1ULL << 30)

static void test_sizes(void)
{
    struct gg_size s;
    const char *why;
    CHECK(gg_value_size("1.5 GiB", &s, &why) == 0 && !s.is_percent && s.bytes == 3 * GiB / 2);
    CHECK(gg_value_size("10%", &s, &why) == 0 && s.is_percent && s.percent == 10.0);
    CHECK(gg_value_size("4096", &s, &why) == 0 && s.bytes == 4096);
    CHECK(gg_value_size("2 GB", &s, &why) == 0 && s.bytes == 2000000000ull);
    CHECK(gg_value_size("-1 GiB", &s, &why) == -1);
    CHECK_STR(why, "negative size");
    CHECK(gg_value_size("1.5", &s, &why) == -1); /* bytes are whole */
    CHECK(gg_value_size("99999999999 TiB", &s, &why) == -1);
    CHECK_STR(why, "size too large");
    CHECK_EQ_U64(gg_size_bytes((struct gg_size){0, 50.0, true}, 24 * GiB), 12 * GiB);
    CHECK_EQ_U64(gg_size_bytes((struct gg_size){0, 100.0, true}, 24 * GiB), 24 * GiB);
}

static void test_int_bool_word(void)
{
    int v;
    bool b;
    char why[128];
    const char *w;
    CHECK(gg_value_int(" 42 ", 1, 100, &v, why, sizeof why) == 0 && v == 42);
    CHECK(gg_value_int("101", 1, 100, &v, why, sizeof why) == -1);
    CHECK_STR(why, "out of range (1..100)");
    CHECK(gg_value_int("4x", 1, 100, &v, why, sizeof why) == -1);
    CHECK_STR(why, "not an integer (expected 1..100)");
    /* one boolean vocabulary for files and the environment */
    const char *yes[] = {"yes", "TRUE", "1", "On"}, *no[] = {"no", "false", "0", "OFF"};
    for (int i = 0; i < 4; i++) {
        CHECK(gg_value_bool(yes[i], &b, &w) == 0 && b);
        CHECK(gg_value_bool(no[i], &b, &w) == 0 && !b);
    }
    CHECK(gg_value_bool("maybe", &b, &w) == -1);
    CHECK(gg_value_word(" Enforce ", &gg_vocab_mode, &v, why, sizeof why) == 0 &&
          v == GG_MODE_ENFORCE);
    CHECK(gg_value_word("loud", &gg_vocab_mode, &v, why, sizeof why) == -1);
    CHECK_STR(why, "bad value (expected auto, enforce, observe or off)");
    CHECK_STR(gg_mode_name(GG_MODE_AUTO), "auto");
    CHECK_STR(gg_stacks_name(GG_STACKS_NEAR_MISS), "near_miss");
    CHECK_STR(gg_enforce_name(GG_ENFORCE_ALL), "all");
}

static void test_signals(void)
{
    int sig;
    const char *why;
    CHECK(gg_value_signal("usr1", &sig, &why) == 0 && sig == SIGUSR1);
    CHECK(gg_value_signal("none", &sig, &why) == 0 && sig == 0);
    CHECK(gg_value_signal("SIGTERM", &sig, &why) == -1); /* a trainer stops on it */
    CHECK(gg_value_signal("SIGBOGUS", &sig, &why) == -1);
    CHECK_STR(gg_signal_name(SIGUSR2), "SIGUSR2");
    CHECK_STR(gg_signal_name(0), "none");
}

static void test_globs_and_rank(void)
{
    const char *why;
    long r;
    CHECK(gg_value_globs("NVIDIA GeForce RTX 3090*, NVIDIA A100*", &why) == 0);
    CHECK(gg_value_globs("A,,B", &why) == -1);
    CHECK(gg_globs_match("NVIDIA GeForce RTX 3090*, NVIDIA A100*", "NVIDIA A100-SXM4-80GB"));
    CHECK(!gg_globs_match("NVIDIA GeForce RTX 3090*", "NVIDIA GeForce RTX 4090"));
    CHECK(gg_value_rank("3", 100, &r, &why) == 0 && r == 3);
    CHECK(gg_value_rank("../../x", 100, &r, &why) == -1);
    CHECK(gg_value_rank("-1", 100, &r, &why) == -1);
    CHECK(gg_value_rank("101", 100, &r, &why) == -1);
    CHECK(gg_value_rank("99999999999999999999999", 100, &r, &why) == -1);
    CHECK(gg_value_rank("", 100, &r, &why) == -1);
}

int main(void)
{
    RUN(test_sizes);
    RUN(test_int_bool_word);
    RUN(test_signals);
    RUN(test_globs_and_rank);
    return unit_done();
}
