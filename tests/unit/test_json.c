/* test_json.c - one journal line: commas, escapes, growth to the heap. */
#include <math.h>

#include "json.h"
#include "unit.h"

static void test_nesting_and_commas(void)
{
    char buf[256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_obj(&j);
    gg_json_ku64(&j, "a", 1);
    gg_json_key(&j, "b");
    gg_json_arr(&j);
    gg_json_i64(&j, -2);
    gg_json_obj(&j);
    gg_json_kbool(&j, "c", true);
    gg_json_obj_end(&j);
    gg_json_null(&j);
    gg_json_arr_end(&j);
    gg_json_kf64(&j, "d", 0.5);
    gg_json_kf64(&j, "e", NAN);
    gg_json_key(&j, "f");
    gg_json_hex(&j, 0xdeadbeef);
    gg_json_obj_end(&j);
    CHECK_STR(j.buf, "{\"a\":1,\"b\":[-2,{\"c\":true},null],\"d\":0.500000,\"e\":null,\"f\":\"0xdeadbeef\"}");
    CHECK(!j.heap);
    gg_json_free(&j);
}

static void test_escapes(void)
{
    char buf[256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_str(&j, "q\"b\\n\n\t\x01\x7f \xc3\xa9");
    CHECK_STR(j.buf, "\"q\\\"b\\\\n\\n\\t\\u0001\\u007f \xc3\xa9\"");
    gg_json_free(&j);
    gg_json_init(&j, buf, sizeof buf);
    gg_json_str(&j, NULL);
    CHECK_STR(j.buf, "null");
    gg_json_free(&j);
}

static void test_grows_to_heap(void)
{
    char buf[16];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    gg_json_arr(&j);
    for (int i = 0; i < 1000; i++)
        gg_json_u64(&j, 1234567890);
    gg_json_arr_end(&j);
    CHECK(j.heap);
    CHECK(!j.failed);
    CHECK_EQ_U64(j.len, 2 + 1000 * 10 + 999);
    CHECK(j.buf[0] == '[' && j.buf[j.len - 1] == ']');
    gg_json_free(&j);
}

static void test_too_deep_fails_cleanly(void)
{
    char buf[256];
    struct gg_json j;
    gg_json_init(&j, buf, sizeof buf);
    for (int i = 0; i < GG_JSON_DEPTH + 4; i++)
        gg_json_arr(&j);
    CHECK(j.failed);
    gg_json_free(&j);
}

int main(void)
{
    RUN(test_nesting_and_commas);
    RUN(test_escapes);
    RUN(test_grows_to_heap);
    RUN(test_too_deep_fails_cleanly);
    return unit_done();
}
