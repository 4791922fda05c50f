/* unit_rcluster: the Redis Cluster routing's pure parts (no server): the
 * key hash and its hash tags, with the vectors of the cluster specification
 * (https://redis.io/docs/reference/cluster-spec/) and of CLUSTER KEYSLOT's
 * page; the redirection replies read; the seed list. tests/test_rcluster.c
 * runs the routing against a real cluster. */
#include <string.h>

#include "rcluster.h"
#include "t.h"

static int slot_of(const char *key)
{
    return rcluster_keyslot(key, strlen(key));
}

static void test_crc16_reference_vector(void)
{
    /* The specification's reference: "123456789" -> 0x31C3. */
    T_EQ_I64(rcluster_crc16("123456789", 9), 0x31C3);
    T_EQ_I64(rcluster_crc16("", 0), 0);
    /* Bytes above 0x7f are unsigned. */
    T_EQ_I64(rcluster_crc16("\xff", 1), 0x1EF0);
}

static void test_keyslot_vectors(void)
{
    /* CLUSTER KEYSLOT's documented answers. */
    T_EQ_I64(slot_of("somekey"), 11058);
    T_EQ_I64(slot_of("foo"), 12182);
    T_EQ_I64(slot_of("bar"), 5061);
    /* Computed with Python's binascii.crc_hqx(key, 0) & 16383. */
    T_EQ_I64(slot_of("{user1000}.following"), 3443);
    T_EQ_I64(slot_of(""), 0);
}

static void test_hash_tags_follow_the_specification(void)
{
    /* The tag alone is hashed: keys with one tag share a slot. */
    T_EQ_I64(slot_of("{user1000}.following"), slot_of("{user1000}.followers"));
    T_EQ_I64(slot_of("{user1000}.following"), slot_of("user1000"));
    /* The specification's examples: "foo{}{bar}" hashes whole (the first
     * pair is empty), "foo{{bar}}zap" hashes "{bar", "foo{bar}{zap}" hashes
     * "bar". */
    T_EQ_I64(slot_of("foo{}{bar}"), rcluster_crc16("foo{}{bar}", 10) & 16383);
    T_EQ_I64(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    T_EQ_I64(slot_of("foo{{bar}}zap"), 4015);
    T_EQ_I64(slot_of("foo{bar}{zap}"), slot_of("bar"));
    /* "{}" and a '}' before the '{' hash the whole key. */
    T_EQ_I64(slot_of("{}"), rcluster_crc16("{}", 2) & 16383);
    T_EQ_I64(slot_of("a}b{c}"), slot_of("c"));
    T_EQ_I64(slot_of("{unclosed"), rcluster_crc16("{unclosed", 9) & 16383);
    /* The service's layouts: a user's lock and a voucher's keys. */
    T_EQ_I64(slot_of("lock:order:{42}"), slot_of("42"));
    T_EQ_I64(slot_of("lock:order:{42}"), 8000);
    T_EQ_I64(slot_of("seckill:v:{7}"), slot_of("seckill:v:{7}:stock"));
    /* Only 'len' bytes count. */
    T_EQ_I64(rcluster_keyslot("foo{bar}", 3), slot_of("foo"));
}

static redisReply err_reply(const char *s)
{
    redisReply r;
    memset(&r, 0, sizeof r);
    r.type = REDIS_REPLY_ERROR;
    r.str = (char *)s;
    r.len = strlen(s);
    return r;
}

static void test_redirections_are_read(void)
{
    rcluster_redirect rd;
    redisReply r;

    r = err_reply("MOVED 3999 127.0.0.1:6381");
    T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_MOVED);
    T_EQ_I64(rd.slot, 3999);
    T_EQ_STR(rd.host, "127.0.0.1");
    T_EQ_I64(rd.port, 6381);

    r = err_reply("ASK 16383 ::1:7000");
    T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_ASK);
    T_EQ_I64(rd.slot, 16383);
    T_EQ_STR(rd.host, "::1");
    T_EQ_I64(rd.port, 7000);

    /* A node that does not know its own address names the port only. */
    r = err_reply("MOVED 12 :7002");
    T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_MOVED);
    T_EQ_STR(rd.host, "");
    T_EQ_I64(rd.port, 7002);

    r = err_reply("TRYAGAIN Multiple keys request during rehashing of slot");
    T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_TRYAGAIN);
    r = err_reply("CLUSTERDOWN The cluster is down");
    T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_CLUSTERDOWN);
    r = err_reply("CLUSTERDOWN Hash slot not served");
    T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_CLUSTERDOWN);
}

static void test_other_replies_are_answers(void)
{
    static const char *const not_redirects[] = {
        "CROSSSLOT Keys in request don't hash to the same slot",
        "NOSCRIPT No matching script. Please use EVAL.",
        "ERR unknown command",
        "MOVED",                         /* no slot */
        "MOVED ",
        "ASK",
        "MOVED 16384 127.0.0.1:1",       /* no such slot */
        "MOVED -1 127.0.0.1:1",
        "MOVED 1 127.0.0.1",             /* no port */
        "MOVED 1 127.0.0.1:0",
        "MOVED 1 127.0.0.1:65536",
        "MOVEDX 1 127.0.0.1:1",
        "ASKING 1 127.0.0.1:1",
        "TRYAGAINX",
    };
    rcluster_redirect rd;
    redisReply r;

    for (size_t i = 0; i < sizeof not_redirects / sizeof not_redirects[0]; i++) {
        r = err_reply(not_redirects[i]);
        if (!T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_NONE))
            printf("  reply: %s\n", not_redirects[i]);
    }
    /* Not an error at all, and no reply. */
    memset(&r, 0, sizeof r);
    r.type = REDIS_REPLY_STATUS;
    r.str = (char *)"MOVED 1 127.0.0.1:1";
    r.len = strlen(r.str);
    T_EQ_I64(rcluster_redirect_parse(&r, &rd), RCLUSTER_NONE);
    T_EQ_I64(rcluster_redirect_parse(NULL, &rd), RCLUSTER_NONE);
}

static void test_seeds_are_parsed_strictly(void)
{
    rcluster_opts o = { .timeout_ms = 100, .retry_ms = 100 };
    char err[128];
    rcluster *rc;

    rc = rcluster_new("127.0.0.1:7000,localhost:7001,127.0.0.1:7000", &o, err, sizeof err);
    if (!T_ASSERT(rc != NULL))
        return;
    T_EQ_I64(rc->nnodes, 2);             /* the repeated seed once */
    T_EQ_STR(rc->nodes[1].host, "localhost");
    T_EQ_I64(rc->nodes[1].port, 7001);
    T_EQ_I64(rc->stale, 1);              /* the map is read at the first call */
    rcluster_free(rc);

    static const char *const bad[] = { "", "127.0.0.1", ":7000", "127.0.0.1:", "h:0",
                                       "h:70000", "h:7000,", "h:7000,,h:7001", "h:7x" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        rc = rcluster_new(bad[i], &o, err, sizeof err);
        if (!T_ASSERT(rc == NULL && err[0] != '\0'))
            printf("  seeds: '%s'\n", bad[i]);
        rcluster_free(rc);
    }
}

int main(void)
{
    T_RUN(test_crc16_reference_vector);
    T_RUN(test_keyslot_vectors);
    T_RUN(test_hash_tags_follow_the_specification);
    T_RUN(test_redirections_are_read);
    T_RUN(test_other_replies_are_answers);
    T_RUN(test_seeds_are_parsed_strictly);
    return t_done();
}
