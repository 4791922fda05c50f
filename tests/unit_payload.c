/* unit_payload: the admin API's request bodies (payload.h): what a create, a
 * reset and a dead-letter replay accept, and the code and reason of each
 * refusal. No I/O. */
#include <string.h>

#include "payload.h"
#include "t.h"

#define BEGIN "\"beginTime\":\"2026-11-25T00:00:00Z\""
#define END "\"endTime\":\"2026-11-26T00:00:00Z\""

static api_err create(const char *body, payload_voucher *v, const char **why)
{
    return payload_voucher_create(body, body ? strlen(body) : 0, v, why);
}

static api_err reset(const char *body, payload_voucher *v, const char **why)
{
    return payload_voucher_reset(body, body ? strlen(body) : 0, v, why);
}

static void test_create_accepts_a_full_voucher(void)
{
    payload_voucher v;
    const char *why = "unset";
    T_EQ_I64(create("{\"title\":\"100 yuan off\",\"stock\":100," BEGIN "," END "}", &v, &why),
             API_OK);
    T_ASSERT(why == NULL);
    T_EQ_STR(v.title, "100 yuan off");
    T_EQ_I64(v.stock, 100);
    T_EQ_I64(v.begin_time, 1795564800);
    T_EQ_I64(v.end_time, 1795564800 + 86400);
}

static void test_create_edges_that_pass(void)
{
    payload_voucher v;
    const char *why;
    /* Whitespace around the value, stock 0 and 10^15-1, a zone offset,
     * begin == end, UTF-8 title, unknown fields ignored. */
    T_EQ_I64(create(" \n{\"title\":\"caf\xc3\xa9\",\"stock\":0,\"x\":[1]," BEGIN ","
                    "\"endTime\":\"2026-11-25T01:00:00+01:00\"}\r\n", &v, &why), API_OK);
    T_EQ_I64(v.stock, 0);
    T_EQ_I64(v.end_time, v.begin_time);
    T_EQ_I64(create("{\"title\":\"t\",\"stock\":999999999999999," BEGIN "," END "}", &v, &why),
             API_OK);
    T_EQ_I64(v.stock, 999999999999999LL);
    /* 16 digits: JSON answers would print it inexactly (cJSON: 15 digits) */
    T_EQ_I64(create("{\"title\":\"t\",\"stock\":1000000000000000," BEGIN "," END "}", &v, &why),
             API_INVALID_FIELD);
    T_EQ_I64(create("{\"title\":\"t\",\"stock\":1e2," BEGIN "," END "}", &v, &why), API_OK);
    T_EQ_I64(v.stock, 100);
}

static void test_not_json(void)
{
    static const char *const bad[] = { "", "{", "{\"title\":}", "{} {}", "{}x", "nul",
                                       "{\"title\":\"a\xff\"}" };
    payload_voucher v;
    const char *why;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (!T_EQ_I64(create(bad[i], &v, &why), API_INVALID_JSON))
            printf("    body was \"%s\"\n", bad[i]);
        T_EQ_STR(why, "request body is not valid JSON");
    }
    T_EQ_I64(payload_voucher_create(NULL, 0, &v, &why), API_INVALID_JSON);
    /* A raw NUL inside the bytes is not JSON either. */
    T_EQ_I64(payload_voucher_create("{\"title\":\"a\0b\"}", 15, &v, &why), API_INVALID_JSON);
}

/* A create body with one field replaced; the reason must name that field. */
static void expect_field(const char *body, const char *word)
{
    payload_voucher v;
    const char *why = NULL;
    if (!T_EQ_I64(create(body, &v, &why), API_INVALID_FIELD) ||
        !T_ASSERT(why != NULL && strstr(why, word) != NULL))
        printf("    body was %s, reason \"%s\"\n", body, why ? why : "(null)");
}

static void test_create_field_errors(void)
{
    char long_title[300];
    char body[600];

    expect_field("[1,2]", "object");
    expect_field("{\"stock\":1," BEGIN "," END "}", "title");
    expect_field("{\"title\":\"\",\"stock\":1," BEGIN "," END "}", "title");
    expect_field("{\"title\":7,\"stock\":1," BEGIN "," END "}", "title");
    memset(long_title, 'a', 201);
    long_title[201] = '\0';
    snprintf(body, sizeof body, "{\"title\":\"%s\",\"stock\":1," BEGIN "," END "}", long_title);
    expect_field(body, "title");
    expect_field("{\"title\":\"t\"," BEGIN "," END "}", "stock");
    expect_field("{\"title\":\"t\",\"stock\":-1," BEGIN "," END "}", "stock");
    expect_field("{\"title\":\"t\",\"stock\":1.5," BEGIN "," END "}", "stock");
    expect_field("{\"title\":\"t\",\"stock\":\"5\"," BEGIN "," END "}", "stock");
    expect_field("{\"title\":\"t\",\"stock\":9007199254740992," BEGIN "," END "}", "stock");
    expect_field("{\"title\":\"t\",\"stock\":1," END "}", "beginTime");
    expect_field("{\"title\":\"t\",\"stock\":1,\"beginTime\":\"tomorrow\"," END "}", "beginTime");
    expect_field("{\"title\":\"t\",\"stock\":1,\"beginTime\":1795564800," END "}", "beginTime");
    expect_field("{\"title\":\"t\",\"stock\":1," BEGIN "}", "endTime");
    expect_field("{\"title\":\"t\",\"stock\":1," BEGIN ",\"endTime\":\"2026-11-24T00:00:00Z\"}",
                 "before");
    expect_field("{\"title\":\"t\",\"stock\":1,\"beginTime\":\"1969-12-31T00:00:00Z\"," END "}",
                 "beginTime");
    expect_field("{\"title\":\"a\\u0000b\",\"stock\":1," BEGIN "," END "}", "NUL");
}

static void test_reset_needs_stock_only(void)
{
    payload_voucher v;
    const char *why;
    T_EQ_I64(reset("{\"stock\":5}", &v, &why), API_OK);
    T_EQ_I64(v.stock, 5);
    T_EQ_I64(v.begin_time, -1);
    T_EQ_I64(v.end_time, -1);
    T_EQ_STR(v.title, "");
    T_EQ_I64(reset("{\"stock\":5,\"beginTime\":null," END "}", &v, &why), API_OK);
    T_EQ_I64(v.begin_time, -1);
    T_EQ_I64(v.end_time, 1795564800 + 86400);
    T_EQ_I64(reset("{\"title\":\"ignored\",\"stock\":1}", &v, &why), API_OK);
    T_EQ_STR(v.title, "");
    T_EQ_I64(reset("{}", &v, &why), API_INVALID_FIELD);
    T_ASSERT(why != NULL && strstr(why, "stock") != NULL);
    T_EQ_I64(reset("{\"stock\":1,\"endTime\":\"x\"}", &v, &why), API_INVALID_FIELD);
    T_EQ_I64(reset("{\"stock\":1,\"beginTime\":\"2026-11-27T00:00:00Z\"," END "}", &v, &why),
             API_INVALID_FIELD);
    T_EQ_I64(reset("5", &v, &why), API_INVALID_FIELD);
}

static api_err replay(const char *body, int64_t *max, const char **why)
{
    return payload_replay(body, body ? strlen(body) : 0, max, why);
}

static void test_replay_takes_an_optional_max(void)
{
    static const char *const bad[] = { "{\"max\":0}", "{\"max\":10001}", "{\"max\":1.5}",
                                       "{\"max\":\"5\"}", "{\"max\":-1}", "{\"max\":null}",
                                       "[1]", "5" };
    int64_t max;
    const char *why = "unset";
    T_EQ_I64(replay(NULL, &max, &why), API_OK);
    T_ASSERT(why == NULL);
    T_EQ_I64(max, PAYLOAD_REPLAY_DEFAULT);
    T_EQ_I64(replay("", &max, &why), API_OK);
    T_EQ_I64(max, PAYLOAD_REPLAY_DEFAULT);
    T_EQ_I64(replay("{}", &max, &why), API_OK);
    T_EQ_I64(max, PAYLOAD_REPLAY_DEFAULT);
    T_EQ_I64(replay(" {\"max\":1} ", &max, &why), API_OK);
    T_EQ_I64(max, 1);
    T_EQ_I64(replay("{\"max\":10000,\"other\":true}", &max, &why), API_OK);
    T_EQ_I64(max, PAYLOAD_REPLAY_MAX);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        why = NULL;
        T_EQ_I64(replay(bad[i], &max, &why), API_INVALID_FIELD);
        T_ASSERT(why != NULL);
        T_EQ_I64(max, PAYLOAD_REPLAY_DEFAULT);
    }
    T_EQ_I64(replay("{", &max, &why), API_INVALID_JSON);
    T_EQ_I64(replay("{} x", &max, &why), API_INVALID_JSON);
}

int main(void)
{
    T_RUN(test_create_accepts_a_full_voucher);
    T_RUN(test_create_edges_that_pass);
    T_RUN(test_not_json);
    T_RUN(test_create_field_errors);
    T_RUN(test_reset_needs_stock_only);
    T_RUN(test_replay_takes_an_optional_max);
    return t_done();
}
