/* zk_lock: ZooKeeper's lock recipe with the multi-threaded C client. */
#include "zk_lock.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define THREADED 1                     /* the synchronous API of libzookeeper_mt */
#include <zookeeper/zookeeper.h>

#define ZK_LOCK_PATH 512
#define ZK_LOCK_BUCKETS 256
#define ZK_LOCK_ORPHANS 64
#define ZK_LOCK_SEQ_DIGITS 10      /* ZooKeeper appends %010d to a sequential node */

/* One hold of this process: taken in 'session', counted for reentry. */
typedef struct hold {
    struct hold *next;
    char key[256];
    char owner[128];
    char path[ZK_LOCK_PATH];
    int64_t token, seq, session;
    int count;
} hold;

/* A node that may exist and must go: a full path, or (a lost create's
 * reply) every child of 'path' whose name starts with 'prefix'. */
typedef struct orphan {
    char path[ZK_LOCK_PATH];
    char prefix[64];
    int64_t session;
} orphan;

struct zk_lock_client {
    char hosts[1024];
    char root[256];
    int timeout_ms;
    /* zh is used under the read lock and replaced under the write lock. */
    pthread_rwlock_t rw;
    zhandle_t *zh;
    /* Everything below: under mu. */
    pthread_mutex_t mu;
    pthread_cond_t cond;      /* a session state change */
    int state;                /* the last session state the watcher saw */
    int expired;              /* zh's session expired: replace it before use */
    int64_t session;          /* zh's session id once connected */
    uint64_t attempt;         /* makes each attempt's node name unique in its session */
    int drop_next_create;
    hold *table[ZK_LOCK_BUCKETS];
    orphan orphans[ZK_LOCK_ORPHANS];
    int norphans;
    zk_lock_counts counts;
};

/*---- sessions ----*/

static void session_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    zk_lock_client *c = ctx;

    (void)path;
    if (type != ZOO_SESSION_EVENT)
        return;
    pthread_mutex_lock(&c->mu);
    if (zh == c->zh) {
        c->state = state;
        if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE)
            c->expired = 1;
        if (state == ZOO_CONNECTED_STATE) {
            const clientid_t *id = zoo_client_id(zh);
            c->session = id != NULL ? id->client_id : 0;
        }
        pthread_cond_broadcast(&c->cond);
    }
    pthread_mutex_unlock(&c->mu);
}

static void deadline_after(struct timespec *ts, long ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* A new handle (the caller holds the write lock, or is zk_lock_open). */
static int open_handle(zk_lock_client *c)
{
    zhandle_t *zh;

    pthread_mutex_lock(&c->mu);
    c->zh = NULL;                       /* events of the old handle are ignored from now */
    c->state = 0;
    c->expired = 0;
    c->session = 0;
    pthread_mutex_unlock(&c->mu);
    /* The watcher may run before zookeeper_init returns: it compares zh
     * with c->zh, which is set under mu right below, so an early event is
     * re-read from zoo_state() then. */
    zh = zookeeper_init(c->hosts, session_watcher, c->timeout_ms, NULL, c, 0);
    if (zh == NULL)
        return -1;
    pthread_mutex_lock(&c->mu);
    c->zh = zh;
    c->state = zoo_state(zh);
    if (c->state == ZOO_CONNECTED_STATE) {
        const clientid_t *id = zoo_client_id(zh);
        c->session = id != NULL ? id->client_id : 0;
    }
    c->counts.sessions++;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

/* Waits up to 'ms' for a connected session. 1 when connected. */
static int wait_connected(zk_lock_client *c, long ms)
{
    struct timespec ts;
    int ok;

    deadline_after(&ts, ms);
    pthread_mutex_lock(&c->mu);
    while (c->state != ZOO_CONNECTED_STATE && !c->expired)
        if (pthread_cond_timedwait(&c->cond, &c->mu, &ts) == ETIMEDOUT)
            break;
    ok = c->state == ZOO_CONNECTED_STATE;
    pthread_mutex_unlock(&c->mu);
    return ok;
}

/* Holds taken in 'session' (under mu). They stay in the table until their
 * release, which reports them lost. */
static int session_holds(zk_lock_client *c, int64_t session)
{
    int n = 0;
    for (int b = 0; b < ZK_LOCK_BUCKETS; b++)
        for (const hold *h = c->table[b]; h != NULL; h = h->next)
            n += h->session == session;
    return n;
}

/* Takes the read lock on a handle whose session has not expired: an
 * expired one is replaced first (a new session; the old one's holds are
 * gone). Returns the handle; the caller unlocks c->rw. */
static zhandle_t *use_handle(zk_lock_client *c)
{
    int expired;

    pthread_rwlock_rdlock(&c->rw);
    pthread_mutex_lock(&c->mu);
    expired = c->expired || c->zh == NULL;
    pthread_mutex_unlock(&c->mu);
    if (!expired)
        return c->zh;
    pthread_rwlock_unlock(&c->rw);
    pthread_rwlock_wrlock(&c->rw);
    pthread_mutex_lock(&c->mu);
    expired = c->expired || c->zh == NULL;
    if (expired) {
        int64_t old = c->session;
        zhandle_t *zh = c->zh;
        int lost = session_holds(c, old);
        c->norphans = 0;                   /* ephemeral: gone with the session */
        pthread_mutex_unlock(&c->mu);
        log_warn("zookeeper: session 0x%" PRIx64 " expired (%d lock(s) held in it are lost): "
                 "opening a new one", (uint64_t)old, lost);
        if (zh != NULL)
            zookeeper_close(zh);
        if (open_handle(c) != 0)
            log_error("zookeeper: cannot create a handle for %s: %s", c->hosts, strerror(errno));
    } else {
        pthread_mutex_unlock(&c->mu);
    }
    pthread_rwlock_unlock(&c->rw);
    pthread_rwlock_rdlock(&c->rw);
    return c->zh;                          /* may be NULL: the caller reports an error */
}

/* The current session id when connected, else 0 (under the read lock). */
static int64_t live_session(zk_lock_client *c)
{
    int64_t s;

    pthread_mutex_lock(&c->mu);
    s = c->state == ZOO_CONNECTED_STATE && !c->expired ? c->session : 0;
    pthread_mutex_unlock(&c->mu);
    return s;
}

static int ensure_path(zhandle_t *zh, const char *path, int mode)
{
    int rc = zoo_create(zh, path, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, mode, NULL, 0);
    return rc == ZOK || rc == ZNODEEXISTS ? ZOK : rc;
}

/* Creates every component of 'path' (persistent). */
static int ensure_root(zhandle_t *zh, const char *path)
{
    char buf[256];
    int rc = ZOK;

    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; rc == ZOK; p++) {
        if (*p == '/' || *p == '\0') {
            char save = *p;
            *p = '\0';
            rc = ensure_path(zh, buf, 0);
            *p = save;
            if (save == '\0')
                break;
        }
    }
    return rc;
}

zk_lock_client *zk_lock_open(const char *hosts, const char *root, int session_timeout_ms,
                     int connect_wait_ms, char *err, size_t errlen)
{
    zk_lock_client *c = xcalloc(1, sizeof *c);
    int rc, ok = 0;

    if (strlen(hosts) >= sizeof c->hosts || strlen(root) >= sizeof c->root || root[0] != '/') {
        snprintf(err, errlen, "invalid ZooKeeper hosts or root");
        free(c);
        return NULL;
    }
    snprintf(c->hosts, sizeof c->hosts, "%s", hosts);
    snprintf(c->root, sizeof c->root, "%s", root);
    c->timeout_ms = session_timeout_ms;
    pthread_rwlock_init(&c->rw, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cond, NULL);
    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
    if (open_handle(c) != 0) {
        snprintf(err, errlen, "cannot create a ZooKeeper handle for '%s': %s", hosts,
                 strerror(errno));
        goto out;
    }
    if (!wait_connected(c, connect_wait_ms)) {
        snprintf(err, errlen, "no ZooKeeper server of '%s' answered within %d ms", hosts,
                 connect_wait_ms);
        goto out;
    }
    if ((rc = ensure_root(c->zh, c->root)) != ZOK) {
        snprintf(err, errlen, "cannot create %s in ZooKeeper: %s", c->root, zerror(rc));
        goto out;
    }
    ok = 1;
out:
    if (!ok) {
        zk_lock_close(c);
        c = NULL;
    }
    return c;
}

void zk_lock_close(zk_lock_client *c)
{
    if (c == NULL)
        return;
    if (c->zh != NULL)
        zookeeper_close(c->zh);
    for (int b = 0; b < ZK_LOCK_BUCKETS; b++)
        while (c->table[b] != NULL) {
            hold *h = c->table[b];
            c->table[b] = h->next;
            free(h);
        }
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->mu);
    pthread_rwlock_destroy(&c->rw);
    free(c);
}

int64_t zk_lock_session_id(zk_lock_client *c)
{
    int64_t s;

    pthread_mutex_lock(&c->mu);
    s = c->session;
    pthread_mutex_unlock(&c->mu);
    return s;
}

int zk_lock_session_timeout(zk_lock_client *c)
{
    int t;

    pthread_rwlock_rdlock(&c->rw);
    t = c->zh != NULL ? zoo_recv_timeout(c->zh) : 0;
    pthread_rwlock_unlock(&c->rw);
    return t;
}

void zk_lock_counts_get(zk_lock_client *c, zk_lock_counts *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->counts;
    pthread_mutex_unlock(&c->mu);
}

void zk_lock_test_drop_next_create_reply(zk_lock_client *c)
{
    pthread_mutex_lock(&c->mu);
    c->drop_next_create = 1;
    pthread_mutex_unlock(&c->mu);
}

/*---- the hold table (under mu) ----*/

static unsigned bucket_of(const char *key)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % ZK_LOCK_BUCKETS;
}

static hold **find_hold(zk_lock_client *c, const char *key, const char *owner)
{
    hold **pp = &c->table[bucket_of(key)];
    for (; *pp != NULL; pp = &(*pp)->next)
        if (strcmp((*pp)->key, key) == 0 && strcmp((*pp)->owner, owner) == 0)
            return pp;
    return NULL;
}

static void add_orphan(zk_lock_client *c, const char *path, const char *prefix, int64_t session)
{
    orphan *o;

    pthread_mutex_lock(&c->mu);
    if (c->norphans == ZK_LOCK_ORPHANS) {
        log_warn("zookeeper: too many nodes to clean up: %s left to its session", path);
    } else {
        o = &c->orphans[c->norphans++];
        snprintf(o->path, sizeof o->path, "%s", path);
        snprintf(o->prefix, sizeof o->prefix, "%s", prefix != NULL ? prefix : "");
        o->session = session;
    }
    pthread_mutex_unlock(&c->mu);
}

/*---- the recipe ----*/

/* "<a>/<b>" into out: 0, or -1 when it does not fit. */
static int join_path(char *out, size_t n, const char *a, const char *b)
{
    int w = snprintf(out, n, "%s/%s", a, b);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

static int64_t seq_of(const char *name)
{
    size_t n = strlen(name);
    return n >= ZK_LOCK_SEQ_DIGITS ? strtoll(name + n - ZK_LOCK_SEQ_DIGITS, NULL, 10) : -1;
}

static int lost_reply(int rc)
{
    return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT;
}

/* Finds the child of 'parent' whose name starts with 'prefix' (a lost
 * create's node) and writes its full path. ZOK, ZNONODE (not there), or
 * the error. */
static int find_by_prefix(zhandle_t *zh, const char *parent, const char *prefix, char *out,
                          size_t outlen)
{
    struct String_vector kids = { 0, NULL };
    int rc = zoo_get_children(zh, parent, 0, &kids);

    if (rc == ZNONODE)
        return ZNONODE;
    if (rc != ZOK)
        return rc;
    rc = ZNONODE;
    for (int i = 0; i < kids.count; i++) {
        if (strncmp(kids.data[i], prefix, strlen(prefix)) == 0) {
            rc = join_path(out, outlen, parent, kids.data[i]) == 0 ? ZOK : ZBADARGUMENTS;
            break;
        }
    }
    deallocate_String_vector(&kids);
    return rc;
}

/* Deletes the nodes remembered for later. Called connected, under rw. */
static void clean_orphans(zk_lock_client *c, zhandle_t *zh, int64_t session)
{
    orphan list[ZK_LOCK_ORPHANS];
    int n;

    pthread_mutex_lock(&c->mu);
    n = c->norphans;
    memcpy(list, c->orphans, sizeof list[0] * (size_t)n);
    c->norphans = 0;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++) {
        char path[ZK_LOCK_PATH];
        int rc;
        if (list[i].session != session)
            continue;                       /* that session ended: its nodes went with it */
        snprintf(path, sizeof path, "%s", list[i].path);
        rc = ZOK;
        if (list[i].prefix[0] != '\0')
            rc = find_by_prefix(zh, list[i].path, list[i].prefix, path, sizeof path);
        if (rc == ZOK)
            rc = zoo_delete(zh, path, -1);
        if (rc == ZOK) {
            log_warn("zookeeper: deleted %s, left behind by a lost reply", path);
            pthread_mutex_lock(&c->mu);
            c->counts.orphans++;
            pthread_mutex_unlock(&c->mu);
        } else if (rc != ZNONODE) {
            add_orphan(c, list[i].path, list[i].prefix, list[i].session);
        }
    }
}

/* A watch on the predecessor: the watcher may fire after the waiter gave
 * up, so the waiter is on the heap and the last of the two frees it. */
typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    int fired;
    atomic_int refs;
} waiter;

static void waiter_put(waiter *w)
{
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        pthread_cond_destroy(&w->cond);
        pthread_mutex_destroy(&w->mu);
        free(w);
    }
}

static void pred_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    waiter *w = ctx;

    (void)zh;
    (void)type;
    (void)state;
    (void)path;
    pthread_mutex_lock(&w->mu);
    w->fired = 1;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
    waiter_put(w);
}

/* The predecessor of sequence 'mine' among 'parent''s children: ZOK with
 * its path in 'pred', ZNONODE when 'mine' is the lowest (held), or the
 * error. */
static int predecessor(zhandle_t *zh, const char *parent, int64_t mine, char *pred,
                       size_t predlen)
{
    struct String_vector kids = { 0, NULL };
    int64_t best = -1;
    int rc = zoo_get_children(zh, parent, 0, &kids), at = -1;

    if (rc != ZOK)
        return rc;
    for (int i = 0; i < kids.count; i++) {
        int64_t s = seq_of(kids.data[i]);
        if (s >= 0 && s < mine && s > best) {
            best = s;
            at = i;
        }
    }
    rc = at < 0 ? ZNONODE : join_path(pred, predlen, parent, kids.data[at]) == 0 ? ZOK
                                                                                  : ZBADARGUMENTS;
    deallocate_String_vector(&kids);
    return rc;
}

/* Waits for 'pred' to go, until 'deadline' (CLOCK_REALTIME). 1: it went
 * (or the session changed: look again), 0: timed out, -1: error. */
static int wait_gone(zhandle_t *zh, const char *pred, const struct timespec *deadline)
{
    waiter *w = xcalloc(1, sizeof *w);
    int rc, fired;

    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cond, NULL);
    atomic_init(&w->refs, 2);
    rc = zoo_wexists(zh, pred, pred_watcher, w, NULL);
    if (rc != ZOK) {
        waiter_put(w);                      /* no watch was set: the watcher's ref too */
        waiter_put(w);
        return rc == ZNONODE ? 1 : -1;
    }
    pthread_mutex_lock(&w->mu);
    while (!w->fired)
        if (pthread_cond_timedwait(&w->cond, &w->mu, deadline) == ETIMEDOUT)
            break;
    fired = w->fired;
    pthread_mutex_unlock(&w->mu);
    waiter_put(w);
    return fired;
}

static void fill(zk_lock_grant *g, const hold *h)
{
    if (g != NULL) {
        g->token = h->token;
        g->seq = h->seq;
        g->session = h->session;
        g->count = h->count;
    }
}

/* Creates our node: ZOK with its path and stat, or the error. A lost reply
 * is looked for by name; not found for lack of a connection, it is
 * remembered for deletion. */
static int create_node(zk_lock_client *c, zhandle_t *zh, const char *parent, int64_t session,
                       char *path, size_t pathlen, struct Stat *st)
{
    char name[ZK_LOCK_PATH], prefix[64];
    int rc, drop, tries = 0;

    pthread_mutex_lock(&c->mu);
    snprintf(prefix, sizeof prefix, "%016" PRIx64 "-%" PRIu64 "-", (uint64_t)session,
             ++c->attempt);
    pthread_mutex_unlock(&c->mu);
    if (join_path(name, sizeof name, parent, prefix) != 0)
        return ZBADARGUMENTS;
    do {
        rc = zoo_create2(zh, name, NULL, -1, &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL,
                         path, (int)pathlen, st);
        /* The parent is a container: missing at first, and removed by the
         * server after its last child left. */
        if (rc == ZNONODE) {
            int prc = ensure_path(zh, parent, ZOO_CONTAINER);
            if (prc == ZNONODE)             /* the root itself went */
                prc = ensure_root(zh, c->root);
            if (prc != ZOK && prc != ZNONODE) {
                rc = prc;
                break;
            }
        }
    } while (rc == ZNONODE && ++tries < 3);
    pthread_mutex_lock(&c->mu);
    drop = rc == ZOK && c->drop_next_create;
    if (drop)
        c->drop_next_create = 0;
    pthread_mutex_unlock(&c->mu);
    if (drop) {
        log_warn("zookeeper: test hook: the reply of the create of %s is dropped", path);
        rc = ZCONNECTIONLOSS;
    }
    if (!lost_reply(rc))
        return rc;
    /* ZOOKEEPER-1262: the node may exist. Our name prefix finds it. */
    rc = find_by_prefix(zh, parent, prefix, path, pathlen);
    if (rc == ZOK) {
        rc = zoo_exists(zh, path, 0, st);
        if (rc == ZOK) {
            log_warn("zookeeper: found %s, created though its reply was lost", path);
            pthread_mutex_lock(&c->mu);
            c->counts.recovered++;
            pthread_mutex_unlock(&c->mu);
            return ZOK;
        }
    }
    if (rc != ZNONODE)
        add_orphan(c, parent, prefix, session);
    return rc == ZNONODE ? ZCONNECTIONLOSS : rc;
}

static void note(zk_lock_client *c, uint64_t *counter)
{
    pthread_mutex_lock(&c->mu);
    (*counter)++;
    pthread_mutex_unlock(&c->mu);
}

lock_status zk_lock_acquire(zk_lock_client *c, const char *key, const char *owner, long wait_ms,
                        zk_lock_grant *g)
{
    zhandle_t *zh = use_handle(c);
    char parent[ZK_LOCK_PATH], path[ZK_LOCK_PATH], pred[ZK_LOCK_PATH];
    struct Stat st;
    struct timespec deadline;
    int64_t session, seq;
    lock_status out = LOCK_ERR;
    hold **pp, *h;
    int rc;

    if (zh == NULL || (session = live_session(c)) == 0)
        goto out;                           /* not connected: fail now rather than queue */
    pthread_mutex_lock(&c->mu);
    pp = find_hold(c, key, owner);
    if (pp != NULL && (*pp)->session == session) {
        (*pp)->count++;                     /* reentry */
        fill(g, *pp);
        c->counts.acquired++;
        pthread_mutex_unlock(&c->mu);
        out = LOCK_OK;
        goto out;
    }
    if (pp != NULL) {                       /* a hold of an ended session */
        h = *pp;
        *pp = h->next;
        free(h);
    }
    pthread_mutex_unlock(&c->mu);
    clean_orphans(c, zh, session);

    if (join_path(parent, sizeof parent, c->root, key) != 0)
        goto out;
    if (create_node(c, zh, parent, session, path, sizeof path, &st) != ZOK)
        goto out;
    seq = seq_of(path);
    deadline_after(&deadline, wait_ms > 0 ? wait_ms : 0);
    for (;;) {
        rc = predecessor(zh, parent, seq, pred, sizeof pred);
        if (rc == ZNONODE) {
            out = LOCK_OK;
            break;
        }
        if (rc != ZOK || wait_ms <= 0)
            break;
        rc = wait_gone(zh, pred, &deadline);
        if (rc <= 0 || live_session(c) != session)
            break;
    }
    if (out != LOCK_OK) {
        /* Busy (or failed): our node must not stay in the queue. */
        int drc = zoo_delete(zh, path, -1);
        if (lost_reply(drc))
            add_orphan(c, path, NULL, session);
        if (rc == 0) {                      /* a predecessor, and no (more) waiting */
            out = LOCK_BUSY;
            note(c, &c->counts.contended);
        }
        goto out;
    }
    h = xcalloc(1, sizeof *h);
    snprintf(h->key, sizeof h->key, "%s", key);
    snprintf(h->owner, sizeof h->owner, "%s", owner);
    snprintf(h->path, sizeof h->path, "%s", path);
    h->token = st.czxid;
    h->seq = seq;
    h->session = session;
    h->count = 1;
    pthread_mutex_lock(&c->mu);
    h->next = c->table[bucket_of(key)];
    c->table[bucket_of(key)] = h;
    c->counts.acquired++;
    fill(g, h);
    pthread_mutex_unlock(&c->mu);
out:
    pthread_rwlock_unlock(&c->rw);
    return out;
}

lock_status zk_lock_release(zk_lock_client *c, const char *key, const char *owner, int *left)
{
    zhandle_t *zh;
    hold **pp, *h;
    lock_status out;
    int rc;

    if (left != NULL)
        *left = 0;
    pthread_rwlock_rdlock(&c->rw);
    zh = c->zh;
    pthread_mutex_lock(&c->mu);
    pp = find_hold(c, key, owner);
    if (pp == NULL) {
        c->counts.not_owner++;
        pthread_mutex_unlock(&c->mu);
        pthread_rwlock_unlock(&c->rw);
        return LOCK_NOT_OWNER;
    }
    h = *pp;
    if (h->session == c->session && !c->expired && h->count > 1) {
        h->count--;
        if (left != NULL)
            *left = h->count;
        pthread_mutex_unlock(&c->mu);
        pthread_rwlock_unlock(&c->rw);
        return LOCK_OK;
    }
    *pp = h->next;
    if (h->session != c->session || c->expired) {
        c->counts.lost++;
        pthread_mutex_unlock(&c->mu);
        pthread_rwlock_unlock(&c->rw);
        free(h);
        return LOCK_LOST;
    }
    pthread_mutex_unlock(&c->mu);
    rc = zh != NULL ? zoo_delete(zh, h->path, -1) : ZINVALIDSTATE;
    if (lost_reply(rc)) {
        /* The connection broke: wait a little for it to come back (then
         * delete again) or for the news that the session is gone. */
        int back, gone;
        wait_connected(c, c->timeout_ms / 3);
        pthread_mutex_lock(&c->mu);
        back = !c->expired && c->state == ZOO_CONNECTED_STATE && c->session == h->session;
        gone = c->expired || (c->state == ZOO_CONNECTED_STATE && c->session != h->session);
        pthread_mutex_unlock(&c->mu);
        rc = back ? zoo_delete(zh, h->path, -1) : gone ? ZSESSIONEXPIRED : rc;
    }
    if (rc == ZOK) {
        out = LOCK_OK;
        note(c, &c->counts.released);
    } else if (rc == ZNONODE || rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE) {
        out = LOCK_LOST;                    /* gone with its session */
        note(c, &c->counts.lost);
    } else {
        out = LOCK_ERR;                     /* deleted at a later call, or with the session */
        add_orphan(c, h->path, NULL, h->session);
    }
    pthread_rwlock_unlock(&c->rw);
    free(h);
    return out;
}
