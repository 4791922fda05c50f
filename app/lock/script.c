/* script: the Lua scripts, loaded from files once, run with EVALSHA and
 * re-sent with EVAL when the server no longer knows them. */
#include "script.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "util.h"

/* File base names under the script dir, indexed by enum script_id. */
static const char *const script_names[SCRIPT_COUNT] = {
    [SCRIPT_LOCK_ACQUIRE] = "lock_acquire",
    [SCRIPT_LOCK_RELEASE] = "lock_release",
    [SCRIPT_LOCK_RENEW] = "lock_renew",
};

/* Written only by script_load_all, before any thread runs; read-only after. */
static script_file scripts[SCRIPT_COUNT];

/* Set once before threads start (script_set_observer). */
static script_observe_fn observer;

void script_set_observer(script_observe_fn fn)
{
    observer = fn;
}

void script_observe(int64_t latency_us, int ok)
{
    if (observer != NULL)
        observer(latency_us, ok);
}

/*---- SHA-1 (FIPS 180-4, sections 4.1.1, 4.2.1, 5.1.1, 5.3.1, 6.1) ----*/

static uint32_t sha1_rotl(uint32_t x, unsigned n)
{
    return (x << n) | (x >> (32 - n));
}

static uint32_t sha1_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
           ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Processes one 512-bit block (6.1.2). */
static void sha1_block(uint32_t h[5], const unsigned char *block)
{
    uint32_t w[80];
    for (int t = 0; t < 16; t++)
        w[t] = sha1_be32(block + 4 * t);
    for (int t = 16; t < 80; t++)
        w[t] = sha1_rotl(w[t - 3] ^ w[t - 8] ^ w[t - 14] ^ w[t - 16], 1);

    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int t = 0; t < 80; t++) {
        uint32_t f, k;
        if (t < 20) {
            f = (b & c) ^ (~b & d);              /* Ch */
            k = 0x5a827999u;
        } else if (t < 40) {
            f = b ^ c ^ d;                       /* Parity */
            k = 0x6ed9eba1u;
        } else if (t < 60) {
            f = (b & c) ^ (b & d) ^ (c & d);     /* Maj */
            k = 0x8f1bbcdcu;
        } else {
            f = b ^ c ^ d;                       /* Parity */
            k = 0xca62c1d6u;
        }
        uint32_t tmp = sha1_rotl(a, 5) + f + e + k + w[t];
        e = d;
        d = c;
        c = sha1_rotl(b, 30);
        b = a;
        a = tmp;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

void script_sha1_hex(const void *data, size_t len, char out[41])
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = data;
    uint32_t h[5] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u, 0xc3d2e1f0u};
    size_t full = len / 64;

    for (size_t i = 0; i < full; i++)
        sha1_block(h, p + 64 * i);

    /* Padding (5.1.1): 0x80, zeros, then the message length in bits as a
     * 64-bit big-endian number; one or two final blocks. */
    unsigned char tail[128] = {0};
    size_t rest = len - 64 * full;
    if (rest > 0)
        memcpy(tail, p + 64 * full, rest);
    tail[rest] = 0x80;
    size_t tail_len = rest < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8u;
    for (int i = 0; i < 8; i++)
        tail[tail_len - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t off = 0; off < tail_len; off += 64)
        sha1_block(h, tail + off);

    for (int i = 0; i < 5; i++) {
        for (int j = 0; j < 8; j++)
            out[8 * i + j] = hex[(h[i] >> (28 - 4 * j)) & 0xfu];
    }
    out[40] = '\0';
}

/*---- Loading ----*/

/* Reads the whole file at 'path' into a fresh NUL-terminated buffer.
 * Returns 0, or -1 with errno set. */
static int read_file(const char *path, char **out, size_t *outlen)
{
    int rc = -1;
    FILE *f = fopen(path, "rb");
    size_t cap = 4096, len = 0;
    char *buf = NULL;

    if (f == NULL)
        goto out;
    buf = xmalloc(cap);
    for (;;) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (len + 1 < cap) {
            if (ferror(f)) {
                errno = EIO;
                goto out;
            }
            break;
        }
        cap *= 2;
        buf = xrealloc(buf, cap);
    }
    buf[len] = '\0';
    *out = buf;
    *outlen = len;
    buf = NULL;
    rc = 0;
out:
    free(buf);
    if (f != NULL)
        fclose(f);
    return rc;
}

int script_file_load(script_file *s, const char *dir, const char *name, char *err,
                     size_t errlen)
{
    char path[4096];
    script_file loaded = { .name = name };
    int n = snprintf(path, sizeof path, "%s/%s.lua", dir, name);

    if (n < 0 || (size_t)n >= sizeof path) {
        snprintf(err, errlen, "script dir too long: %s", dir);
        return -1;
    }
    if (read_file(path, &loaded.src, &loaded.len) != 0) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return -1;
    }
    if (loaded.len == 0) {
        snprintf(err, errlen, "%s is empty", path);
        free(loaded.src);
        return -1;
    }
    script_sha1_hex(loaded.src, loaded.len, loaded.sha);
    free(s->src);
    *s = loaded;
    log_debug("script %s sha1 %s (%zu bytes)", name, s->sha, s->len);
    return 0;
}

int script_load_all(const char *dir, char *err, size_t errlen)
{
    script_file loaded[SCRIPT_COUNT] = {{0}};
    int rc = -1;

    for (int i = 0; i < SCRIPT_COUNT; i++)
        if (script_file_load(&loaded[i], dir, script_names[i], err, errlen) != 0)
            goto out;
    /* All or nothing: replace the table only when every file was read. */
    for (int i = 0; i < SCRIPT_COUNT; i++) {
        free(scripts[i].src);
        scripts[i] = loaded[i];
        loaded[i].src = NULL;
    }
    rc = 0;
out:
    for (int i = 0; i < SCRIPT_COUNT; i++)
        free(loaded[i].src);
    return rc;
}

const char *script_name(enum script_id id)
{
    if ((int)id < 0 || id >= SCRIPT_COUNT)
        return "?";
    return script_names[id];
}

const char *script_sha(enum script_id id)
{
    if ((int)id < 0 || id >= SCRIPT_COUNT)
        return "";
    return scripts[id].sha;
}

/* The library's own script 'id'; a bad id is a bug in the caller. */
static const script_file *lib_script(enum script_id id)
{
    if ((int)id < 0 || id >= SCRIPT_COUNT) {
        log_error("script: bad script id %d", (int)id);
        abort();
    }
    return &scripts[id];
}

/*---- Running ----*/

/* Room for the usual calls without touching the heap. */
#define SCRIPT_STACK_ARGS 16

/* Fills v/l with "EVALSHA <sha> <nkeys> args..."; returns the count, and
 * heap arrays in *v / *l when the stack ones are too small. */
static int build_argv(const script_file *s, int nkeys, int argc, const char **argv,
                      const size_t *argvlen, char *nkeys_buf, size_t nkeys_len,
                      const char ***v, size_t **l)
{
    int total = argc + 3;

    /* Misuse is a bug in our code, not a runtime condition: stop loudly
     * rather than hand a fake connection failure to the caller. */
    if (s->src == NULL || nkeys < 0 || argc < nkeys || (argc > 0 && argv == NULL)) {
        log_error("script: bad call (script %s loaded=%d nkeys=%d argc=%d)",
                  s->name ? s->name : "?", s->src != NULL, nkeys, argc);
        abort();
    }
    if (total > SCRIPT_STACK_ARGS) {
        *v = xmalloc(sizeof **v * (size_t)total);
        *l = xmalloc(sizeof **l * (size_t)total);
    }
    snprintf(nkeys_buf, nkeys_len, "%d", nkeys);
    (*v)[0] = "EVALSHA";
    (*l)[0] = 7;
    (*v)[1] = s->sha;
    (*l)[1] = 40;
    (*v)[2] = nkeys_buf;
    (*l)[2] = strlen(nkeys_buf);
    for (int i = 0; i < argc; i++) {
        (*v)[3 + i] = argv[i];
        (*l)[3 + i] = argvlen != NULL ? argvlen[i] : strlen(argv[i]);
    }
    return total;
}

int script_is_noscript(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_ERROR && r->str != NULL &&
           strncmp(r->str, "NOSCRIPT", 8) == 0;
}

redisReply *script_demoted(redisContext *c, redisReply *r)
{
    if (r == NULL || r->type != REDIS_REPLY_ERROR || r->str == NULL ||
        strncmp(r->str, "READONLY", 8) != 0)
        return r;
    log_warn("redis: %s: the server is a replica now; dropping the connection", r->str);
    c->err = REDIS_ERR_OTHER;
    snprintf(c->errstr, sizeof c->errstr, "%s", r->str);
    freeReplyObject(r);
    return NULL;
}

/* Appends the call to c's output buffer (no I/O): EVALSHA, or with 'eval'
 * EVAL with the script's source. 0, or -1 when hiredis cannot format it. */
static int append_call(redisContext *c, const script_file *s, int eval, int nkeys, int argc,
                       const char **argv, const size_t *argvlen)
{
    const char *stack_v[SCRIPT_STACK_ARGS];
    size_t stack_l[SCRIPT_STACK_ARGS];
    const char **v = stack_v;
    size_t *l = stack_l;
    char nkeys_buf[16];
    int total, rc;

    total = build_argv(s, nkeys, argc, argv, argvlen, nkeys_buf, sizeof nkeys_buf, &v, &l);
    if (eval) {
        v[0] = "EVAL";
        l[0] = 4;
        v[1] = s->src;
        l[1] = s->len;
    }
    rc = redisAppendCommandArgv(c, total, v, l);
    if (v != stack_v) {
        free(v);
        free(l);
    }
    return rc == REDIS_OK ? 0 : -1;
}

int script_file_append(redisContext *c, const script_file *s, int nkeys, int argc,
                       const char **argv, const size_t *argvlen)
{
    return append_call(c, s, 0, nkeys, argc, argv, argvlen);
}

redisReply *script_file_recv(redisContext *c, const script_file *s, int nkeys, int argc,
                             const char **argv, const size_t *argvlen, int fallback)
{
    void *reply = NULL;
    redisReply *r;

    if (redisGetReply(c, &reply) != REDIS_OK) {
        freeReplyObject(reply);
        return NULL;
    }
    if ((r = script_demoted(c, reply)) == NULL)
        return NULL;
    if (!fallback || !script_is_noscript(r))
        return r;
    /* Cache emptied (restart, failover, SCRIPT FLUSH). EVAL runs the
     * script and caches it again, so later EVALSHA calls hit. */
    freeReplyObject(r);
    log_info("script %s: NOSCRIPT, re-sending with EVAL", s->name);
    return script_file_eval(c, s, nkeys, argc, argv, argvlen);
}

redisReply *script_file_eval(redisContext *c, const script_file *s, int nkeys, int argc,
                             const char **argv, const size_t *argvlen)
{
    void *reply = NULL;

    if (append_call(c, s, 1, nkeys, argc, argv, argvlen) != 0)
        return NULL;
    if (redisGetReply(c, &reply) != REDIS_OK) {
        freeReplyObject(reply);
        return NULL;
    }
    return script_demoted(c, reply);
}

int script_cache(redisContext *c)
{
    int sent = 0, rc = 0;

    for (int i = 0; i < SCRIPT_COUNT; i++) {
        const char *argv[3] = { "SCRIPT", "LOAD", scripts[i].src };
        size_t lens[3] = { 6, 4, scripts[i].len };
        if (scripts[i].src == NULL)
            continue;
        if (redisAppendCommandArgv(c, 3, argv, lens) != REDIS_OK)
            return -1;
        sent++;
    }
    for (int i = 0; i < sent; i++) {
        void *reply = NULL;
        redisReply *r;
        if (redisGetReply(c, &reply) != REDIS_OK) {
            freeReplyObject(reply);
            return -1;                      /* the connection failed: c->err */
        }
        r = reply;
        if (r == NULL || r->type != REDIS_REPLY_STRING)
            rc = -1;
        freeReplyObject(r);
    }
    return rc;
}

int script_cache_on_connect(redisContext *c, void *arg)
{
    (void)arg;
    return script_cache(c);
}

redisReply *script_file_run(redisContext *c, const script_file *s, int nkeys, int argc,
                            const char **argv, const size_t *argvlen)
{
    int64_t t0 = util_mono_us();
    redisReply *r = NULL;

    if (script_file_append(c, s, nkeys, argc, argv, argvlen) == 0)
        r = script_file_recv(c, s, nkeys, argc, argv, argvlen, 1);
    script_observe(util_mono_us() - t0, r != NULL);
    return r;
}

int script_append(redisContext *c, enum script_id id, int nkeys,
                  int argc, const char **argv, const size_t *argvlen)
{
    return script_file_append(c, lib_script(id), nkeys, argc, argv, argvlen);
}

redisReply *script_recv(redisContext *c, enum script_id id, int nkeys,
                        int argc, const char **argv, const size_t *argvlen, int fallback)
{
    return script_file_recv(c, lib_script(id), nkeys, argc, argv, argvlen, fallback);
}

redisReply *script_run(redisContext *c, enum script_id id, int nkeys,
                       int argc, const char **argv, const size_t *argvlen)
{
    return script_file_run(c, lib_script(id), nkeys, argc, argv, argvlen);
}
