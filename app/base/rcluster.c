/* rcluster: Redis Cluster routing over hiredis (see rcluster.h). */
#include "rcluster.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

/* Redirections followed back to back before a pause: a slot handed back
 * and forth by a migration must not spin. */
#define RCLUSTER_HOPS 8
#define RCLUSTER_PAUSE_MIN_MS 10
#define RCLUSTER_PAUSE_MAX_MS 200

uint16_t rcluster_crc16(const char *buf, size_t len)
{
    uint16_t crc = 0;

    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)((uint16_t)(uint8_t)buf[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021) : (uint16_t)(crc << 1);
    }
    return crc;
}

int rcluster_keyslot(const char *key, size_t len)
{
    size_t s, e;

    for (s = 0; s < len && key[s] != '{'; s++)
        ;
    if (s < len) {
        for (e = s + 1; e < len && key[e] != '}'; e++)
            ;
        if (e < len && e > s + 1)
            return rcluster_crc16(key + s + 1, e - s - 1) & (RCLUSTER_SLOTS - 1);
    }
    return rcluster_crc16(key, len) & (RCLUSTER_SLOTS - 1);
}

/* "host:port" (the last ':' splits: an IPv6 host holds some) into 'host'
 * and 'port'; an empty host is allowed. 0 or -1. */
static int split_endpoint(const char *s, size_t len, char *host, size_t hostlen, int *port)
{
    const char *colon = NULL;
    int64_t p;

    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    if (colon == NULL || (size_t)(colon - s) >= hostlen)
        return -1;
    if (util_parse_id(colon + 1, len - (size_t)(colon + 1 - s), &p) != 0 || p > 65535)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port = (int)p;
    return 0;
}

static int prefix(const char *s, size_t len, const char *word)
{
    size_t n = strlen(word);
    return len >= n && memcmp(s, word, n) == 0 && (len == n || s[n] == ' ');
}

rcluster_kind rcluster_redirect_parse(const redisReply *r, rcluster_redirect *out)
{
    const char *s, *sp;
    size_t len;
    int64_t slot;
    int ask;

    out->kind = RCLUSTER_NONE;
    out->slot = -1;
    out->host[0] = '\0';
    out->port = 0;
    if (r == NULL || r->type != REDIS_REPLY_ERROR || r->str == NULL)
        return RCLUSTER_NONE;
    s = r->str;
    len = r->len;
    if (prefix(s, len, "TRYAGAIN"))
        return out->kind = RCLUSTER_TRYAGAIN;
    if (prefix(s, len, "CLUSTERDOWN"))
        return out->kind = RCLUSTER_CLUSTERDOWN;
    if (!(ask = prefix(s, len, "ASK")) && !prefix(s, len, "MOVED"))
        return RCLUSTER_NONE;
    if (len <= (size_t)(ask ? 4 : 6))         /* the word alone: no slot, no address */
        return RCLUSTER_NONE;
    s += ask ? 4 : 6;
    len -= ask ? 4 : 6;
    if ((sp = memchr(s, ' ', len)) == NULL ||
        util_parse_u63(s, (size_t)(sp - s), &slot) != 0 || slot >= RCLUSTER_SLOTS)
        return RCLUSTER_NONE;
    len -= (size_t)(sp + 1 - s);
    if (split_endpoint(sp + 1, len, out->host, sizeof out->host, &out->port) != 0) {
        out->host[0] = '\0';
        return RCLUSTER_NONE;
    }
    out->slot = (int)slot;
    return out->kind = ask ? RCLUSTER_ASK : RCLUSTER_MOVED;
}

static char *dup_or_null(const char *s)
{
    return s != NULL && s[0] != '\0' ? xstrdup(s) : NULL;
}

__attribute__((format(printf, 3, 4)))
static void set_err(rcluster *rc, int err, const char *fmt, ...)
{
    va_list ap;

    rc->err = err;
    va_start(ap, fmt);
    vsnprintf(rc->errstr, sizeof rc->errstr, fmt, ap);
    va_end(ap);
}

/* The index of node host:port, added when new; -1 when the table is full. */
static int node_index(rcluster *rc, const char *host, int port)
{
    for (int i = 0; i < rc->nnodes; i++)
        if (rc->nodes[i].port == port && strcmp(rc->nodes[i].host, host) == 0)
            return i;
    if (rc->nnodes == RCLUSTER_MAX_NODES) {
        set_err(rc, RCLUSTER_ERR_NODES, "more than %d cluster nodes", RCLUSTER_MAX_NODES);
        return -1;
    }
    snprintf(rc->nodes[rc->nnodes].host, sizeof rc->nodes[0].host, "%s", host);
    rc->nodes[rc->nnodes].port = port;
    rc->nodes[rc->nnodes].c = NULL;
    return rc->nnodes++;
}

rcluster *rcluster_new(const char *seeds, const rcluster_opts *opts, char *errbuf, size_t n)
{
    rcluster *rc = xcalloc(1, sizeof *rc);
    const char *p = seeds;

    rc->opts = *opts;
    rc->username = dup_or_null(opts->username);
    rc->password = dup_or_null(opts->password);
    rc->opts.username = rc->username;
    rc->opts.password = rc->password;
    rc->stale = 1;
    while (p != NULL) {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        char host[256];
        int port;

        if (split_endpoint(p, len, host, sizeof host, &port) != 0 || host[0] == '\0') {
            snprintf(errbuf, n, "'%.*s' is not host:port", (int)(len > 64 ? 64 : len), p);
            goto fail;
        }
        if (node_index(rc, host, port) < 0) {
            snprintf(errbuf, n, "%s", rc->errstr);
            goto fail;
        }
        p = end != NULL ? end + 1 : NULL;
    }
    if (rc->nnodes == 0) {
        snprintf(errbuf, n, "no seed node (host:port,...)");
        goto fail;
    }
    return rc;
fail:
    rcluster_free(rc);
    return NULL;
}

static void node_drop(rcluster *rc, int i)
{
    if (rc->nodes[i].c != NULL) {
        redisFree(rc->nodes[i].c);
        rc->nodes[i].c = NULL;
    }
}

void rcluster_reset(rcluster *rc)
{
    for (int i = 0; i < rc->nnodes; i++)
        node_drop(rc, i);
    rc->stale = 1;
}

void rcluster_free(rcluster *rc)
{
    if (rc == NULL)
        return;
    rcluster_reset(rc);
    free(rc->username);
    free(rc->password);
    free(rc);
}

/* AUTH with the handle's credentials, when it has some. 0 or -1. */
static int node_auth(rcluster *rc, redisContext *c, const char *host, int port)
{
    redisReply *r;
    int ok;

    if (rc->password == NULL)
        return 0;
    r = rc->username != NULL ? redisCommand(c, "AUTH %s %s", rc->username, rc->password)
                             : redisCommand(c, "AUTH %s", rc->password);
    ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    if (!ok)
        set_err(rc, RCLUSTER_ERR_CONNECT, "AUTH refused by %s:%d", host, port);
    if (r != NULL)
        freeReplyObject(r);
    return ok ? 0 : -1;
}

/* Node i's connection, opened when it has none. NULL with the error set. */
static redisContext *node_connect(rcluster *rc, int i)
{
    rcluster_node *nd = &rc->nodes[i];
    struct timeval tv = { rc->opts.timeout_ms / 1000, (rc->opts.timeout_ms % 1000) * 1000 };
    redisContext *c;

    if (nd->c != NULL)
        return nd->c;
    c = redisConnectWithTimeout(nd->host, nd->port, tv);
    if (c == NULL || c->err) {
        /* hiredis's reason too: "Connection timed out" tells a caller's
         * circuit breaker from a refusal. */
        set_err(rc, RCLUSTER_ERR_CONNECT, "cannot connect to %s:%d: %s", nd->host, nd->port,
                c != NULL ? c->errstr : "out of memory");
        goto fail;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK) {
        set_err(rc, RCLUSTER_ERR_CONNECT, "cannot set a timeout on %s:%d", nd->host, nd->port);
        goto fail;
    }
    if (node_auth(rc, c, nd->host, nd->port) != 0)
        goto fail;
    if (rc->opts.on_connect != NULL && rc->opts.on_connect(c, rc->opts.on_connect_arg) != 0) {
        set_err(rc, RCLUSTER_ERR_CONNECT, "set-up of %s:%d failed: %s", nd->host, nd->port,
                c->err ? c->errstr : "refused");
        goto fail;
    }
    nd->c = c;
    return c;
fail:
    if (c != NULL)
        redisFree(c);
    return NULL;
}

/* One range of a CLUSTER SLOTS reply into 'map': [start, end, [host, port,
 * id, ...], replicas...]. 'asked' is the node that answered (its host
 * stands for an empty one). Returns the slots it set, or -1 when the range
 * is malformed or names more nodes than the handle holds. */
static int map_range(rcluster *rc, const redisReply *e, int asked, uint8_t *map)
{
    const redisReply *m;
    const char *host;
    int i;

    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER || e->element[2]->type != REDIS_REPLY_ARRAY)
        return -1;
    m = e->element[2];
    if (m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
        m->element[1]->type != REDIS_REPLY_INTEGER)
        return -1;
    if (e->element[0]->integer < 0 || e->element[1]->integer >= RCLUSTER_SLOTS ||
        e->element[0]->integer > e->element[1]->integer || m->element[1]->integer <= 0 ||
        m->element[1]->integer > 65535)
        return -1;
    host = m->element[0]->str;
    if (strcmp(host, "?") == 0)             /* an endpoint nobody knows: no master */
        return 0;
    if (host[0] == '\0')
        host = rc->nodes[asked].host;
    if ((i = node_index(rc, host, (int)m->element[1]->integer)) < 0)
        return -1;
    for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
        map[s] = (uint8_t)(i + 1);
    return (int)(e->element[1]->integer - e->element[0]->integer + 1);
}

/* The map as node i answers CLUSTER SLOTS. 0, or -1 (error set; the node
 * dropped when its connection failed). */
static int refresh_from(rcluster *rc, int i)
{
    uint8_t map[RCLUSTER_SLOTS];
    redisContext *c = node_connect(rc, i);
    redisReply *r = NULL;
    int covered = 0, rc_ = -1;

    if (c == NULL)
        goto out;
    if ((r = redisCommand(c, "CLUSTER SLOTS")) == NULL) {
        set_err(rc, RCLUSTER_ERR_CONNECT, "CLUSTER SLOTS: lost connection to %s:%d",
                rc->nodes[i].host, rc->nodes[i].port);
        node_drop(rc, i);
        goto out;
    }
    if (r->type != REDIS_REPLY_ARRAY) {
        set_err(rc, RCLUSTER_ERR_MAP, "CLUSTER SLOTS refused by %s:%d", rc->nodes[i].host,
                rc->nodes[i].port);
        goto out;
    }
    memset(map, 0, sizeof map);
    for (size_t k = 0; k < r->elements; k++) {
        int got = map_range(rc, r->element[k], i, map);
        if (got < 0) {
            if (rc->err != RCLUSTER_ERR_NODES)
                set_err(rc, RCLUSTER_ERR_MAP, "CLUSTER SLOTS of %s:%d: a malformed range",
                        rc->nodes[i].host, rc->nodes[i].port);
            goto out;
        }
        covered += got;
    }
    if (covered == 0) {
        set_err(rc, RCLUSTER_ERR_MAP, "%s:%d serves no slot (not a cluster yet?)",
                rc->nodes[i].host, rc->nodes[i].port);
        goto out;
    }
    memcpy(rc->slot, map, sizeof map);
    rc->stale = 0;
    rc->refreshes++;
    rc_ = 0;
out:
    if (r != NULL)
        freeReplyObject(r);
    return rc_;
}

int rcluster_refresh(rcluster *rc)
{
    uint8_t tried[RCLUSTER_MAX_NODES] = { 0 };

    /* The masters of the map first (the likeliest to be up and current),
     * then every other node known, the seeds among them. */
    for (int s = 0; s < RCLUSTER_SLOTS; s++) {
        int i = rc->slot[s] - 1;
        if (i < 0 || tried[i])
            continue;
        tried[i] = 1;
        if (refresh_from(rc, i) == 0)
            return 0;
    }
    for (int i = 0; i < rc->nnodes; i++) {
        if (tried[i])
            continue;
        tried[i] = 1;
        if (refresh_from(rc, i) == 0)
            return 0;
    }
    rc->stale = 1;
    return -1;
}

redisContext *rcluster_slot_context(rcluster *rc, int slot)
{
    redisContext *c;
    int i;

    if ((rc->stale || rc->slot[slot] == 0) && rcluster_refresh(rc) != 0)
        return NULL;
    if ((i = rc->slot[slot] - 1) < 0) {
        set_err(rc, RCLUSTER_ERR_MAP, "no master serves slot %d", slot);
        rc->stale = 1;
        return NULL;
    }
    if ((c = node_connect(rc, i)) == NULL)
        rc->stale = 1;                      /* its replica may be the master by now */
    return c;
}

static void pause_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ASKING on node i's connection: 0, or -1 (the node dropped). */
static int asking(rcluster *rc, int i, redisContext *c)
{
    redisReply *r = redisCommand(c, "ASKING");
    int ok = r != NULL && r->type == REDIS_REPLY_STATUS;

    if (r == NULL)
        node_drop(rc, i);
    if (r != NULL)
        freeReplyObject(r);
    if (!ok)
        set_err(rc, RCLUSTER_ERR_CONNECT, "ASKING refused by %s:%d", rc->nodes[i].host,
                rc->nodes[i].port);
    return ok ? 0 : -1;
}

/* The node whose connection 'c' is, or -1. */
static int node_of(const rcluster *rc, const redisContext *c)
{
    for (int i = 0; i < rc->nnodes; i++)
        if (c != NULL && rc->nodes[i].c == c)
            return i;
    return -1;
}

redisContext *rcluster_redirected(rcluster *rc, const rcluster_redirect *rd,
                                  const redisContext *from)
{
    redisContext *c = NULL;
    int from_i = node_of(rc, from), to;

    switch (rd->kind) {
    case RCLUSTER_MOVED:
    case RCLUSTER_ASK:
        /* ":port" names the node that answered. */
        if (rd->host[0] == '\0' && from_i < 0) {
            set_err(rc, RCLUSTER_ERR_MAP, "a redirection without a host, from an unknown node");
            rc->stale = 1;
            break;
        }
        to = node_index(rc, rd->host[0] ? rd->host : rc->nodes[from_i].host, rd->port);
        if (to < 0)
            break;
        rc->redirects++;
        if (rd->kind == RCLUSTER_MOVED) {
            /* The retry goes there now; the rest of the map (a
             * migration or a failover moves more than one slot) is read
             * again at the next use. */
            rc->slot[rd->slot] = (uint8_t)(to + 1);
            rc->stale = 1;
            c = node_connect(rc, to);
        } else if ((c = node_connect(rc, to)) != NULL && asking(rc, to, c) != 0) {
            c = NULL;
        }
        break;
    case RCLUSTER_TRYAGAIN:
    case RCLUSTER_CLUSTERDOWN:
        rc->stale = 1;
        set_err(rc, RCLUSTER_ERR_BUDGET, "%s", rd->kind == RCLUSTER_TRYAGAIN
                                                  ? "TRYAGAIN: a slot in migration"
                                                  : "CLUSTERDOWN: the cluster is down");
        break;
    case RCLUSTER_NONE:
        set_err(rc, RCLUSTER_ERR_MAP, "not a redirection");
        break;
    }
    return c;
}

redisContext *rcluster_slot_take(rcluster *rc, int slot)
{
    redisContext *c = rcluster_slot_context(rc, slot);
    int i = node_of(rc, c);

    if (i >= 0)
        rc->nodes[i].c = NULL;
    return c;
}

int rcluster_master_slots(rcluster *rc, int *slots, int max)
{
    unsigned char seen[RCLUSTER_MAX_NODES] = { 0 };
    int n = 0;

    if (rc->stale && rcluster_refresh(rc) != 0)
        return -1;
    for (int slot = 0; slot < RCLUSTER_SLOTS && n < max; slot++) {
        int i = rc->slot[slot] - 1;
        if (i >= 0 && !seen[i]) {
            seen[i] = 1;
            slots[n++] = slot;
        }
    }
    return n;
}

int rcluster_slot_node(const rcluster *rc, int slot)
{
    return slot >= 0 && slot < RCLUSTER_SLOTS ? rc->slot[slot] - 1 : -1;
}

redisReply *rcluster_call(rcluster *rc, int slot, rcluster_send_fn send, void *arg)
{
    int64_t deadline = util_mono_us() + (int64_t)rc->opts.retry_ms * 1000;
    redisReply *last = NULL;
    int ask = -1, hops = 0, wait_ms = RCLUSTER_PAUSE_MIN_MS;
    int64_t left_us;

    rc->err = RCLUSTER_OK;
    rc->errstr[0] = '\0';
    for (;;) {
        rcluster_redirect rd;
        redisContext *c;
        redisReply *r;
        int i = ask;

        ask = -1;
        if (i >= 0) {
            c = node_connect(rc, i);
            if (c != NULL && asking(rc, i, c) != 0)
                c = NULL;
        } else {
            c = rcluster_slot_context(rc, slot);
            i = rc->slot[slot] - 1;
        }
        if (c != NULL) {
            if ((r = send(c, arg)) == NULL) {
                set_err(rc, RCLUSTER_ERR_CONNECT, "lost connection to %s:%d", rc->nodes[i].host,
                        rc->nodes[i].port);
                node_drop(rc, i);
                rc->stale = 1;
            } else {
                if (last != NULL)
                    freeReplyObject(last);
                last = r;
                switch (rcluster_redirect_parse(r, &rd)) {
                case RCLUSTER_NONE:
                    rc->err = RCLUSTER_OK;
                    rc->errstr[0] = '\0';
                    return r;
                case RCLUSTER_MOVED:
                case RCLUSTER_ASK: {
                    int to = node_index(rc, rd.host[0] ? rd.host : rc->nodes[i].host, rd.port);
                    rc->redirects++;
                    if (to < 0)
                        goto out;
                    if (rd.kind == RCLUSTER_MOVED) {
                        /* This slot now; the rest of the map at the next
                         * call (a migration moves slots one by one). */
                        rc->slot[rd.slot] = (uint8_t)(to + 1);
                        rc->stale = rd.slot != slot;
                    } else {
                        ask = to;
                    }
                    if (++hops < RCLUSTER_HOPS)
                        continue;
                    break;
                }
                case RCLUSTER_TRYAGAIN:
                    break;
                case RCLUSTER_CLUSTERDOWN:
                    rc->stale = 1;
                    break;
                }
            }
        }
        /* A pause, then again, while the budget lasts (the last pause
         * ends with it, and one more try follows). */
        left_us = deadline - util_mono_us();
        if (left_us <= 0)
            break;
        pause_ms(left_us < (int64_t)wait_ms * 1000 ? (int)(left_us / 1000) + 1 : wait_ms);
        wait_ms = wait_ms * 2 > RCLUSTER_PAUSE_MAX_MS ? RCLUSTER_PAUSE_MAX_MS : wait_ms * 2;
        hops = 0;
    }
    if (last != NULL)
        set_err(rc, RCLUSTER_ERR_BUDGET, "slot %d: still redirected when the budget ran out", slot);
out:
    return last;
}

struct argv_call {
    int argc;
    const char **argv;
    const size_t *argvlen;
};

static redisReply *send_argv(redisContext *c, void *arg)
{
    struct argv_call *a = arg;
    return redisCommandArgv(c, a->argc, a->argv, a->argvlen);
}

redisReply *rcluster_command_argv(rcluster *rc, int key, int argc, const char **argv,
                                  const size_t *argvlen)
{
    struct argv_call a = { argc, argv, argvlen };
    size_t len = argvlen != NULL ? argvlen[key] : strlen(argv[key]);

    return rcluster_call(rc, rcluster_keyslot(argv[key], len), send_argv, &a);
}
