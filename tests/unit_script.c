/* unit_script: SHA-1 (script_sha1_hex) against FIPS 180 example messages
 * and lengths around the padding boundaries, script_load_all on lua/
 * (every script read, a missing directory refused), and script_file_load's
 * refusals (an empty file, a directory name too long for a path). No Redis:
 * EVALSHA's digests are checked here, the scripts themselves by test_lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "script.h"
#include "t.h"

static void sha1_of(const void *data, size_t len, char out[41])
{
    memset(out, 'x', 41);
    script_sha1_hex(data, len, out);
}

static void test_sha1_fips_examples(void)
{
    char h[41];
    sha1_of("abc", 3, h);
    T_EQ_STR(h, "a9993e364706816aba3e25717850c26c9cd0d89d");
    sha1_of("", 0, h);
    T_EQ_STR(h, "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    static const char two[] = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha1_of(two, strlen(two), h);
    T_EQ_STR(h, "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    static const char four[] = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmn"
                               "hijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    sha1_of(four, strlen(four), h);
    T_EQ_STR(h, "a49b2446a02c645bf419f995b67091253a04a259");
}

static void test_sha1_million_a(void)
{
    char h[41];
    char *m = malloc(1000000);
    if (!T_ASSERT(m != NULL))
        return;
    memset(m, 'a', 1000000);
    sha1_of(m, 1000000, h);
    free(m);
    T_EQ_STR(h, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
}

/* One or two padding blocks: 55 bytes is the last length with one. */
static void test_sha1_padding_boundaries(void)
{
    static const struct { size_t len; const char *sha; } v[] = {
        { 55, "ddf57317ef34bfee3b6df83d359098930eb278bc" },
        { 56, "a0d492bb0fc889d0eca3bc137066ab6f4f74f369" },
        { 63, "c55856749bef509bdfe6bfebfc7bf4e793e82132" },
        { 64, "bede92be29c3874e1b54ddc77988d606fc857a8e" },
        { 65, "b05a80522b053d6dc7e0a517d0e70212c7dad11f" },
        { 119, "504e27376a6e0f0dba8295b85cb25dc4dfa17d23" },
        { 120, "82134b02fb3f702491be9bed581eeab59334acb2" },
        { 127, "34d5e582029e9b9b85b2febe31da3db7cdabaaea" },
        { 128, "a09133e6730ffe899efb70204cb5646cd5dc24ee" },
    };
    unsigned char buf[128];
    char h[41];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)((i * 7 + 3) & 0xff);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!T_EQ_STR((sha1_of(buf, v[i].len, h), h), v[i].sha))
            printf("    length %zu\n", v[i].len);
}

static int is_sha(const char *s)
{
    if (s == NULL || strlen(s) != 40)
        return 0;
    for (; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return 0;
    return 1;
}

static void test_load_all_reads_every_script(void)
{
    char err[256] = "";
    if (!T_EQ_I64(script_load_all(t_lua_dir(), err, sizeof err), 0)) {
        printf("    %s\n", err);
        return;
    }
    T_EQ_STR(script_name(SCRIPT_LOCK_ACQUIRE), "lock_acquire");
    for (int i = 0; i < SCRIPT_COUNT; i++) {
        if (!T_ASSERT(is_sha(script_sha((enum script_id)i))))
            printf("    script %s\n", script_name((enum script_id)i));
    }
    T_ASSERT(strcmp(script_sha(SCRIPT_LOCK_ACQUIRE), script_sha(SCRIPT_LOCK_RELEASE)) != 0);
}

static void test_load_all_refuses_a_missing_directory(void)
{
    char err[256] = "";
    char before[41];
    snprintf(before, sizeof before, "%s", script_sha(SCRIPT_LOCK_ACQUIRE));
    T_EQ_I64(script_load_all("/nonexistent/seckill-lua", err, sizeof err), -1);
    T_ASSERT(strstr(err, "/nonexistent/seckill-lua") != NULL);
    /* All or nothing: what was loaded stays. */
    T_EQ_STR(script_sha(SCRIPT_LOCK_ACQUIRE), before);
}

/* An empty script file is refused by name (it would run as a no-op), and
 * so is a directory whose path does not fit; the script given keeps what
 * it held. */
static void test_file_load_refuses_empty_and_too_long(void)
{
    char dir[512], path[600], err[512] = "", big[5000];
    script_file s = { 0 };
    FILE *f;

    snprintf(dir, sizeof dir, "%s/unit_script.XXXXXX",
             getenv("TEST_TMP") ? getenv("TEST_TMP") : "/tmp");
    if (!T_ASSERT(mkdtemp(dir) != NULL))
        return;
    snprintf(path, sizeof path, "%s/ok.lua", dir);
    if (T_ASSERT((f = fopen(path, "w")) != NULL)) {
        fputs("return 1\n", f);
        fclose(f);
    }
    snprintf(path, sizeof path, "%s/empty.lua", dir);
    if (T_ASSERT((f = fopen(path, "w")) != NULL))
        fclose(f);

    if (T_EQ_I64(script_file_load(&s, dir, "ok", err, sizeof err), 0))
        T_EQ_I64(s.len, 9);
    T_EQ_I64(script_file_load(&s, dir, "empty", err, sizeof err), -1);
    T_ASSERT(strstr(err, "empty.lua is empty") != NULL);
    T_EQ_I64(s.len, 9);
    memset(big, 'd', sizeof big - 1);
    big[0] = '/';
    big[sizeof big - 1] = '\0';
    T_EQ_I64(script_file_load(&s, big, "ok", err, sizeof err), -1);
    T_ASSERT(strncmp(err, "script dir too long: /ddd", 25) == 0);
    T_EQ_I64(s.len, 9);
    free(s.src);
    unlink(path);
    snprintf(path, sizeof path, "%s/ok.lua", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    T_RUN(test_sha1_fips_examples);
    T_RUN(test_sha1_million_a);
    T_RUN(test_sha1_padding_boundaries);
    T_RUN(test_load_all_reads_every_script);
    T_RUN(test_load_all_refuses_a_missing_directory);
    T_RUN(test_file_load_refuses_empty_and_too_long);
    return t_done();
}
