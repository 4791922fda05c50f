/* test_multi_lock: MultiLock and RedLock (app/lock/multi_lock.c) against five real,
 * independent redis-server processes (scripts/redis-nodes.sh, started for
 * this program under $TEST_TMP), crashed, restarted empty and paused with
 * signals.
 *
 * Quorums (all nodes / a majority) with a rival holding some nodes, the
 * release of a failed attempt on every node, a node down, a node that
 * stopped answering (per-node timeout, validity), nodes that restarted
 * (reconnected at the next attempt), a node that closes every new
 * connection (it keeps the reconnect pause), a node that answers late (it
 * ran the attempt: released all the same), reentry, release by a
 * non-owner, lease expiry, and the RedLock failure with a node that restarts
 * without persistence (two holders) next to its "delayed restart" fix (one
 * holder); a one-key storm of threads, where MultiLock grants exactly one
 * of them each round. */
#include "t.h"
#include "t_lock.h"
#include "multi_lock.h"
#include "util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <unistd.h>

#define N 5
#define NODE_TIMEOUT_MS 50

static char dir[512];
static char script[600];
static redis_url nodes[N];
static redisContext *raw[N];          /* the test's own look at each node */

static void nodes_cmd(const char *what, int i)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "%s %s '%s' %d >/dev/null", script, what, dir, i + 1);
    if (system(cmd) != 0) {
        fprintf(stderr, "failed: %s\n", cmd);
        exit(2);
    }
}

static redisContext *raw_conn(int i)
{
    struct timeval tv = { 1, 0 };
    if (raw[i] != NULL && raw[i]->err == 0)
        return raw[i];
    if (raw[i] != NULL)
        redisFree(raw[i]);
    raw[i] = redisConnectWithTimeout(nodes[i].host, nodes[i].port, tv);
    if (raw[i] != NULL && !raw[i]->err)
        redisSetTimeout(raw[i], tv);
    return raw[i];
}

/* The hold count of 'owner' on node i (0: none). */
static long count_on(int i, const char *key, const char *owner)
{
    redisContext *c = raw_conn(i);
    redisReply *r;
    long v = -1;
    if (c == NULL || c->err)
        return -1;
    r = redisCommand(c, "HGET %s %s", key, owner);
    if (r != NULL && r->type == REDIS_REPLY_NIL)
        v = 0;
    else if (r != NULL && r->type == REDIS_REPLY_STRING)
        v = atol(r->str);
    if (r != NULL)
        freeReplyObject(r);
    return v;
}

/* Bit i set when node i has 'key' at all. */
static unsigned present(const char *key)
{
    unsigned m = 0;
    for (int i = 0; i < N; i++) {
        redisContext *c = raw_conn(i);
        redisReply *r = c != NULL && !c->err ? redisCommand(c, "EXISTS %s", key) : NULL;
        if (r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1)
            m |= 1u << i;
        if (r != NULL)
            freeReplyObject(r);
    }
    return m;
}

/* A rival's single lock on the nodes of 'mask' (the lock library's, as multi_lock uses). */
static void hold_on(unsigned mask, const char *key, const char *owner, long lease_ms)
{
    for (int i = 0; i < N; i++)
        if (mask & (1u << i))
            T_EQ_I64(lock_try_acquire(raw_conn(i), key, owner, lease_ms, NULL), LOCK_OK);
}

static const char *fresh_key(char *buf, size_t n)
{
    static int k;
    snprintf(buf, n, "lock:order:%d%03d", (int)getpid(), ++k);
    return buf;
}

static multi_lock_set *new_set(void)
{
    return multi_lock_set_new(nodes, N, NODE_TIMEOUT_MS);
}

/* Waits until a restarted node's connection would be retried. */
static void after_retry(void)
{
    usleep(300 * 1000);
}

/* An attempt of A on a fresh key whose nodes 'rival' another owner holds:
 * refused, with these nodes granted (then released: no trace of A's left,
 * the key only where the rival holds it) and these found busy. */
static void refused(multi_lock_set *a, multi_lock_quorum q, unsigned rival, unsigned granted,
                    unsigned busy)
{
    char key[64];
    multi_lock_grant g;

    fresh_key(key, sizeof key);
    hold_on(rival, key, "R", 10000);
    T_EQ_I64(multi_lock_acquire(a, q, key, "A", 10000, &g), LOCK_BUSY);
    T_EQ_I64(g.granted, granted);
    T_EQ_I64(g.busy, busy);
    T_EQ_I64(present(key), rival);
}

static void test_quorums_and_release_of_a_failed_attempt(void)
{
    multi_lock_set *a = new_set(), *b = new_set();
    char key[64];
    multi_lock_grant g;

    fresh_key(key, sizeof key);
    /* free: both take all five nodes */
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(g.granted, 0x1f);
    T_EQ_I64(multi_lock_acquire(b, MULTI_LOCK_MAJORITY, key, "B", 10000, &g), LOCK_BUSY);
    T_EQ_I64(g.busy, 0x07);             /* no majority left after three: 4 and 5 not asked */
    T_EQ_I64(multi_lock_release(a, key, "A", 10000, 0x1f, 0, NULL), 5);
    T_EQ_I64(present(key), 0);

    /* a rival holds nodes 1 and 2: a majority (3, 4, 5) is still free */
    hold_on(0x03, key, "R", 10000);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(g.granted, 0x1c);
    T_EQ_I64(g.busy, 0x03);
    T_EQ_I64(multi_lock_release(a, key, "A", 10000, ~g.busy, 0, NULL), 3);
    T_EQ_I64(present(key), 0x03);

    /* ... but not all of them: MultiLock stops at node 1 and leaves nothing of A's */
    refused(a, MULTI_LOCK_ALL, 0x03, 0, 0x01);
    /* MultiLock with a rival on node 5 only: A gets 1 to 4, then gives them back */
    refused(a, MULTI_LOCK_ALL, 0x10, 0x0f, 0x10);
    /* the rival holds a majority (1, 2, 3): RedLock stops once no majority is
     * left, before 4 and 5 */
    refused(a, MULTI_LOCK_MAJORITY, 0x07, 0, 0x07);
    /* the rival holds 2, 4 and 5: A gets 1 and 3, a minority, released again */
    refused(a, MULTI_LOCK_MAJORITY, 0x1a, 0x05, 0x1a);
    multi_lock_set_free(a);
    multi_lock_set_free(b);
}

static void test_reentry_and_not_owner(void)
{
    multi_lock_set *a = new_set(), *b = new_set();
    char key[64];
    multi_lock_grant g;
    int not_owner = -1;

    fresh_key(key, sizeof key);
    for (int q = 0; q < 2; q++) {
        multi_lock_quorum quorum = q == 0 ? MULTI_LOCK_ALL : MULTI_LOCK_MAJORITY;
        T_EQ_I64(multi_lock_acquire(a, quorum, key, "A", 10000, &g), LOCK_OK);
        T_EQ_I64(multi_lock_acquire(a, quorum, key, "A", 10000, &g), LOCK_OK);    /* reentry */
        for (int i = 0; i < N; i++)
            T_EQ_I64(count_on(i, key, "A"), 2);
        /* a non-owner's release changes nothing */
        T_EQ_I64(multi_lock_release(b, key, "B", 10000, 0x1f, 0, &not_owner), 0);
        T_EQ_I64(not_owner, 5);
        T_EQ_I64(multi_lock_release(a, key, "A", 10000, 0x1f, 0, NULL), 5);
        T_EQ_I64(multi_lock_acquire(b, quorum, key, "B", 10000, &g), LOCK_BUSY);   /* still held once */
        T_EQ_I64(multi_lock_release(a, key, "A", 10000, 0x1f, 0, NULL), 5);
        T_EQ_I64(present(key), 0);
        T_EQ_I64(multi_lock_acquire(b, quorum, key, "B", 10000, &g), LOCK_OK);
        T_EQ_I64(multi_lock_release(b, key, "B", 10000, 0x1f, 0, NULL), 5);
    }
    /* No watchdog renews a hold on several masters: a lease is required. */
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 0, &g), LOCK_ERR);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", -1, &g), LOCK_ERR);
    T_EQ_I64(present(key), 0);
    multi_lock_set_free(a);
    multi_lock_set_free(b);
}

static void test_validity_and_lease_expiry(void)
{
    multi_lock_set *a = new_set(), *b = new_set();
    char key[64];
    multi_lock_grant g;
    int64_t t0;

    fresh_key(key, sizeof key);
    T_EQ_I64(multi_lock_drift_ms(10000), 102);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(g.validity_ms, 10000 - (g.elapsed_us + 999) / 1000 - 102);
    T_ASSERT(g.validity_ms > 10000 / 2 && g.validity_ms <= 9897);  /* the attempt's time is counted */
    multi_lock_release(a, key, "A", 10000, 0x1f, 0, NULL);
    /* a 300 ms lease: another owner gets it once the lease is over, not
     * before (counted from before A asked for it), and long before a 10 s
     * one would be */
    t0 = util_mono_us();
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 300, &g), LOCK_OK);
    T_EQ_I64(multi_lock_acquire(b, MULTI_LOCK_MAJORITY, key, "B", 300, &g), LOCK_BUSY);
    while (multi_lock_acquire(b, MULTI_LOCK_MAJORITY, key, "B", 300, &g) != LOCK_OK &&
           util_mono_us() - t0 < 10000000)
        usleep(10 * 1000);
    T_ASSERT(util_mono_us() - t0 >= 295000 && util_mono_us() - t0 < 5000000);
    multi_lock_release(b, key, "B", 300, 0x1f, 0, NULL);
    multi_lock_set_free(a);
    multi_lock_set_free(b);
}

static void test_a_node_down(void)
{
    multi_lock_set *a = new_set();
    char key[64];
    multi_lock_grant g;

    fresh_key(key, sizeof key);
    nodes_cmd("kill", 4);
    /* MultiLock: unavailable (an error, not busy), and nothing left behind */
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g), LOCK_ERR);
    T_EQ_I64(g.failed, 0x10);
    T_EQ_I64(present(key) & 0x0f, 0);
    /* RedLock: four of five */
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(g.granted, 0x0f);
    T_EQ_I64(multi_lock_release(a, key, "A", 10000, ~g.busy, 0, NULL), 4);
    /* three down: no majority, an error; the two grants undone */
    nodes_cmd("kill", 3);
    nodes_cmd("kill", 2);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 10000, &g), LOCK_ERR);
    T_EQ_I64(g.granted, 0x03);
    T_EQ_I64(present(key) & 0x03, 0);
    for (int i = 2; i < N; i++)
        nodes_cmd("start-node", i);
    after_retry();
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(g.granted, 0x1f);
    multi_lock_release(a, key, "A", 10000, 0x1f, 0, NULL);
    multi_lock_set_free(a);
}

static void test_a_silent_node_costs_one_node_timeout(void)
{
    multi_lock_set *a = new_set();
    char key[64];
    multi_lock_grant g;

    fresh_key(key, sizeof key);
    nodes_cmd("pause", 0);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(g.failed, 0x01);
    printf("# one node silent: attempt took %lld us, validity %lld ms\n",
           (long long)g.elapsed_us, (long long)g.validity_ms);
    T_ASSERT(g.elapsed_us >= NODE_TIMEOUT_MS * 1000 && g.elapsed_us < 4 * NODE_TIMEOUT_MS * 1000);
    multi_lock_release(a, key, "A", 10000, ~g.busy, 0, NULL);
    after_retry();
    /* a lease the silent node's timeout eats: no validity left, released everywhere */
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "B", NODE_TIMEOUT_MS + 2, &g), LOCK_ERR);
    T_EQ_I64(g.granted, 0x1e);
    T_ASSERT(g.validity_ms <= 0);
    for (int i = 1; i < N; i++)                /* the test's look at node 1 would wait too */
        T_EQ_I64(count_on(i, key, "B"), 0);
    nodes_cmd("resume", 0);
    usleep(100 * 1000);
    multi_lock_set_free(a);
}

/* Nodes that restarted: the set's open connections to them are dead. Each
 * attempt finds one (MultiLock stops at the first failed node), and the
 * next reconnects at once, so the lock is back within one attempt per node,
 * not one reconnect pause per node. A node that stops answering still
 * costs one node timeout, not one per attempt. */
static void test_restarted_nodes_are_reconnected_at_once(void)
{
    multi_lock_set *a = new_set();
    char key[64];
    multi_lock_grant g;
    int failures = 0;
    int64_t t0;
    lock_status st = LOCK_ERR;

    fresh_key(key, sizeof key);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(multi_lock_release(a, key, "A", 10000, 0x1f, 0, NULL), N);
    for (int i = 0; i < N; i++) {
        nodes_cmd("kill", i);
        nodes_cmd("start-node", i);
        redisFree(raw[i]);                /* the test's own look: dead too */
        raw[i] = NULL;
    }
    t0 = util_mono_us();
    while (failures <= 10 * N && (st = multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g)) != LOCK_OK)
        failures++;
    printf("# %d nodes restarted: %d failed attempts, granted after %lld us\n", N, failures,
           (long long)(util_mono_us() - t0));
    T_EQ_I64(st, LOCK_OK);
    T_ASSERT(failures <= N);
    T_EQ_I64(multi_lock_release(a, key, "A", 10000, 0x1f, 0, NULL), N);
    /* a silent node: the first attempt waits for it, the next does not */
    nodes_cmd("pause", 0);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g), LOCK_ERR);
    T_ASSERT(g.elapsed_us >= NODE_TIMEOUT_MS * 1000);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g), LOCK_ERR);
    T_EQ_I64(g.failed, 0x01);
    T_ASSERT(g.elapsed_us < NODE_TIMEOUT_MS * 1000);
    nodes_cmd("resume", 0);
    usleep(100 * 1000);
    multi_lock_set_free(a);
}

/* A "node" that accepts connections and closes each at once (a Redis at
 * maxclients, a proxy in front of a dead one): counted, never answered. */
static int closer_fd = -1;
static atomic_int closer_accepts;

static void *closer_main(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(closer_fd, NULL, NULL);
        if (fd < 0)
            return NULL;
        atomic_fetch_add(&closer_accepts, 1);
        close(fd);
    }
}

/* A stand-in for node 'node': a loopback listener in '*fd' served by
 * 'serve' on thread '*th'; 'set' gets the nodes with that one replaced.
 * 0, or -1 (asserted). */
static int stand_in(int node, int *fd, void *(*serve)(void *), pthread_t *th, redis_url *set)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof sa;

    *fd = socket(AF_INET, SOCK_STREAM, 0);
    if (!T_ASSERT(*fd >= 0 && bind(*fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
                  listen(*fd, 16) == 0 && getsockname(*fd, (struct sockaddr *)&sa, &len) == 0))
        return -1;
    if (!T_ASSERT(pthread_create(th, NULL, serve, NULL) == 0))
        return -1;
    memcpy(set, nodes, sizeof nodes);
    set[node].port = ntohs(sa.sin_port);
    return 0;
}

/* Such a node costs one connect per RETRY_MS, not one per attempt: a
 * connection it closed never answered, so it keeps the pause. */
static void test_a_node_that_closes_new_connections_keeps_the_pause(void)
{
    redis_url with_closer[N];
    multi_lock_set *a;
    pthread_t th;
    char key[64];
    multi_lock_grant g;

    if (stand_in(0, &closer_fd, closer_main, &th, with_closer) != 0)
        return;
    a = multi_lock_set_new(with_closer, N, NODE_TIMEOUT_MS);
    fresh_key(key, sizeof key);
    for (int i = 0; i < 20; i++)
        T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g), LOCK_ERR);
    printf("# a node closing every connection: %d connects in 20 attempts\n",
           atomic_load(&closer_accepts));
    T_EQ_I64(atomic_load(&closer_accepts), 1);
    multi_lock_set_free(a);
    shutdown(closer_fd, SHUT_RDWR);
    close(closer_fd);
    pthread_join(th, NULL);
}

/* A node whose answers come late: a proxy in front of node 2 that passes
 * each request on at once and each answer LATE_MS later, past the node
 * timeout. The node runs the attempt; the client gives up before it hears. */
#define LATE_MS (3 * NODE_TIMEOUT_MS)
static int late_fd = -1;

/* One proxied connection: two sockets, each read by one pipe thread; the
 * second thread to finish closes both. */
typedef struct late_pair {
    int fd[2];
    atomic_int left;
} late_pair;

typedef struct late_pipe {
    late_pair *pair;
    int from, to, delay_ms;
} late_pipe;

static void *late_pipe_main(void *arg)
{
    late_pipe p = *(late_pipe *)arg;
    char buf[16384];
    ssize_t n;

    free(arg);
    while ((n = read(p.from, buf, sizeof buf)) > 0) {
        if (p.delay_ms > 0)
            usleep((useconds_t)p.delay_ms * 1000);
        if (send(p.to, buf, (size_t)n, MSG_NOSIGNAL) != n)
            break;
    }
    shutdown(p.to, SHUT_RDWR);               /* wakes the other thread's read */
    shutdown(p.from, SHUT_RDWR);
    if (atomic_fetch_sub(&p.pair->left, 1) == 1) {
        close(p.pair->fd[0]);
        close(p.pair->fd[1]);
        free(p.pair);
    }
    return NULL;
}

static void late_pipe_start(late_pair *pair, int from, int to, int delay_ms)
{
    late_pipe *p = xmalloc(sizeof *p);
    pthread_t th;

    p->pair = pair;
    p->from = from;
    p->to = to;
    p->delay_ms = delay_ms;
    if (pthread_create(&th, NULL, late_pipe_main, p) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        exit(2);
    }
    pthread_detach(th);
}

static void *late_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct sockaddr_in sa = { .sin_family = AF_INET,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                                  .sin_port = htons((uint16_t)nodes[1].port) };
        int fd = accept(late_fd, NULL, NULL), up;
        if (fd < 0)
            return NULL;
        up = socket(AF_INET, SOCK_STREAM, 0);
        if (up < 0 || connect(up, (struct sockaddr *)&sa, sizeof sa) != 0) {
            close(fd);
            if (up >= 0)
                close(up);
            continue;
        }
        late_pair *pair = xmalloc(sizeof *pair);
        pair->fd[0] = fd;
        pair->fd[1] = up;
        atomic_init(&pair->left, 2);
        late_pipe_start(pair, fd, up, 0);          /* requests: at once */
        late_pipe_start(pair, up, fd, LATE_MS);    /* answers: late */
    }
}

/* A failed attempt is undone on a node that ran it but answered late (the
 * node's connection is in its reconnect pause then: the release reaches it
 * on a new one), and so is a RedLock hold granted without that node. */
static void test_a_node_that_answers_late_keeps_no_hold(void)
{
    redis_url with_late[N];
    multi_lock_set *a;
    pthread_t th;
    char key[64];
    multi_lock_grant g;

    if (stand_in(1, &late_fd, late_main, &th, with_late) != 0)
        return;
    a = multi_lock_set_new(with_late, N, NODE_TIMEOUT_MS);
    /* node 2 knows both scripts: a NOSCRIPT answer, late, would run nothing */
    fresh_key(key, sizeof key);
    hold_on(0x02, key, "W", 10000);
    T_EQ_I64(lock_release(raw_conn(1), key, "W", 10000, NULL), LOCK_OK);

    /* MultiLock: node 1 granted, node 2 late: failed, undone on both */
    fresh_key(key, sizeof key);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_ALL, key, "A", 10000, &g), LOCK_ERR);
    T_EQ_I64(g.granted, 0x01);
    T_EQ_I64(g.failed, 0x02);
    T_EQ_I64(g.unanswered, 0x02);
    usleep(2 * LATE_MS * 1000);
    T_EQ_I64(count_on(1, key, "A"), 0);
    T_EQ_I64(present(key), 0);

    /* RedLock: held without node 2, which ran it: released there too */
    after_retry();
    fresh_key(key, sizeof key);
    T_EQ_I64(multi_lock_acquire(a, MULTI_LOCK_MAJORITY, key, "A", 10000, &g), LOCK_OK);
    T_EQ_I64(g.granted, 0x1d);
    T_EQ_I64(g.unanswered, 0x02);
    T_EQ_I64(count_on(1, key, "A"), 1);      /* it did grant it (asked directly) */
    multi_lock_release(a, key, "A", 10000, ~g.busy, g.unanswered, NULL);
    usleep(2 * LATE_MS * 1000);
    T_EQ_I64(count_on(1, key, "A"), 0);
    T_EQ_I64(present(key), 0);

    multi_lock_set_free(a);
    shutdown(late_fd, SHUT_RDWR);
    close(late_fd);
    pthread_join(th, NULL);
}

/* Client 1 takes KEY on nodes 1, 2, 3 (4 and 5 paused for it, and refusing
 * its attempt once resumed: past its deadline); node 3 is killed, and
 * started again at once without persistence when RESTART; then 1 and 2 are
 * paused, unreachable for the next client. */
static void client_1_holds_then_node_3_fails(multi_lock_set *c1, const char *key, long lease,
                                             int restart)
{
    multi_lock_grant g1;

    nodes_cmd("pause", 3);
    nodes_cmd("pause", 4);
    T_EQ_I64(multi_lock_acquire(c1, MULTI_LOCK_MAJORITY, key, "client-1", lease, &g1), LOCK_OK);
    T_EQ_I64(g1.granted, 0x07);
    usleep(250 * 1000);                   /* past the attempt's deadline: 4 and 5 refuse it */
    nodes_cmd("resume", 3);
    nodes_cmd("resume", 4);
    nodes_cmd("kill", 2);
    if (restart)
        nodes_cmd("start-node", 2);       /* at once, empty */
    nodes_cmd("pause", 0);
    nodes_cmd("pause", 1);
    after_retry();
}

/* The RedLock algorithm's known failure: client 1 holds nodes 1, 2, 3
 * (4 and 5 unreachable for it: paused); node 3 crashes and restarts
 * without persistence; client 2 (1 and 2 unreachable for it) takes 3, 4, 5
 * while client 1's lease still runs: two holders. */
static void test_restart_without_persistence_gives_two_holders(void)
{
    multi_lock_set *c1 = new_set(), *c2 = new_set();
    char key[64];
    multi_lock_grant g2;
    const long lease = 3000;

    fresh_key(key, sizeof key);
    client_1_holds_then_node_3_fails(c1, key, lease, 1);
    T_EQ_I64(multi_lock_acquire(c2, MULTI_LOCK_MAJORITY, key, "client-2", lease, &g2), LOCK_OK);
    T_EQ_I64(g2.granted, 0x1c);
    T_ASSERT(g2.elapsed_us / 1000 < lease);   /* within client 1's lease: both hold it */
    nodes_cmd("resume", 0);
    nodes_cmd("resume", 1);
    usleep(50 * 1000);
    T_EQ_I64(count_on(0, key, "client-1") + count_on(1, key, "client-1"), 2);
    multi_lock_release(c1, key, "client-1", lease, 0x1f, 0, NULL);
    multi_lock_release(c2, key, "client-2", lease, 0x1f, 0, NULL);
    multi_lock_set_free(c1);
    multi_lock_set_free(c2);
}

/* Delayed restart: node 3 is down while client 1's lease lasts, so
 * client 2, asking within that lease, reaches only 4 and 5. */
static void test_delayed_restart_keeps_one_holder(void)
{
    multi_lock_set *c1 = new_set(), *c2 = new_set();
    char key[64];
    multi_lock_grant g2;
    const long lease = 3000;

    fresh_key(key, sizeof key);
    client_1_holds_then_node_3_fails(c1, key, lease, 0);   /* node 3 stays down */
    T_EQ_I64(multi_lock_acquire(c2, MULTI_LOCK_MAJORITY, key, "client-2", lease, &g2), LOCK_ERR);
    T_EQ_I64(g2.granted, 0);              /* 1, 2, 3 failed: no majority left, 4 and 5 not asked */
    T_EQ_I64(count_on(3, key, "client-2") + count_on(4, key, "client-2"), 0);
    nodes_cmd("resume", 0);
    nodes_cmd("resume", 1);
    usleep((useconds_t)(lease + multi_lock_drift_ms(lease)) * 1000);
    nodes_cmd("start-node", 2);           /* the delayed restart */
    after_retry();
    T_EQ_I64(multi_lock_acquire(c2, MULTI_LOCK_MAJORITY, key, "client-2", lease, &g2), LOCK_OK);
    multi_lock_release(c2, key, "client-2", lease, 0x1f, 0, NULL);
    multi_lock_set_free(c1);
    multi_lock_set_free(c2);
}

/* A storm on one key: STORM_THREADS threads, each with its own set, try the
 * same fresh key at once, STORM_ROUNDS times. MultiLock must grant exactly
 * one of them each round: more would be two holders; none is the split
 * where each contender got some nodes and every one of them lost. */
#define STORM_THREADS 8
#define STORM_ROUNDS 40

static pthread_barrier_t storm_go, storm_done;
static char storm_key[64];
static multi_lock_quorum storm_q;
static int storm_won[STORM_THREADS];

static void *storm_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    multi_lock_set *s = multi_lock_set_new(nodes, N, 1000);   /* no timeout under load */
    char owner[16];
    multi_lock_grant g;

    snprintf(owner, sizeof owner, "T%d", t);
    for (int r = 0; r < 2 * STORM_ROUNDS; r++) {
        pthread_barrier_wait(&storm_go);
        storm_won[t] = multi_lock_acquire(s, storm_q, storm_key, owner, 10000, &g) == LOCK_OK;
        pthread_barrier_wait(&storm_done);
    }
    multi_lock_set_free(s);
    return NULL;
}

/* Rounds of the storm with 'q'; returns the rounds nobody won. */
static int storm_rounds(multi_lock_set *m, multi_lock_quorum q)
{
    int none = 0;

    storm_q = q;
    for (int r = 0; r < STORM_ROUNDS; r++) {
        int winners = 0;
        fresh_key(storm_key, sizeof storm_key);
        pthread_barrier_wait(&storm_go);
        pthread_barrier_wait(&storm_done);
        for (int t = 0; t < STORM_THREADS; t++) {
            char owner[16];
            if (!storm_won[t])
                continue;
            winners++;
            snprintf(owner, sizeof owner, "T%d", t);
            multi_lock_release(m, storm_key, owner, 10000, 0x1f, 0, NULL);
        }
        T_ASSERT(winners <= 1);
        none += winners == 0;
    }
    return none;
}

static void test_a_storm_on_one_key_has_one_winner_per_round(void)
{
    multi_lock_set *m = multi_lock_set_new(nodes, N, 1000);
    pthread_t th[STORM_THREADS];
    int none_all, none_majority;

    pthread_barrier_init(&storm_go, NULL, STORM_THREADS + 1);
    pthread_barrier_init(&storm_done, NULL, STORM_THREADS + 1);
    for (int t = 0; t < STORM_THREADS; t++)
        pthread_create(&th[t], NULL, storm_thread, (void *)(intptr_t)t);
    none_all = storm_rounds(m, MULTI_LOCK_ALL);
    none_majority = storm_rounds(m, MULTI_LOCK_MAJORITY);
    for (int t = 0; t < STORM_THREADS; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&storm_go);
    pthread_barrier_destroy(&storm_done);
    printf("# %d threads x %d rounds on one key: rounds with no winner: MultiLock %d, "
           "RedLock %d\n", STORM_THREADS, STORM_ROUNDS, none_all, none_majority);
    T_EQ_I64(none_all, 0);
    multi_lock_set_free(m);
}

static void start_nodes(void)
{
    const char *tmp = getenv("TEST_TMP");
    const char *sql = getenv("SQL_DIR");
    char cmd[1400], line[2048];
    FILE *p;
    int n = 0;

    if (sql != NULL && sql[0] != '\0')
        snprintf(script, sizeof script, "%s/../scripts/redis-nodes.sh", sql);
    else
        snprintf(script, sizeof script, "scripts/redis-nodes.sh");
    snprintf(dir, sizeof dir, "%s/mlock-%d", tmp != NULL && tmp[0] ? tmp : "/tmp", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s start '%s' %d", script, dir, N);
    if ((p = popen(cmd, "r")) == NULL)
        exit(2);
    while (fgets(line, sizeof line, p) != NULL) {
        char *s = strstr(line, "LOCK_REDIS_NODES=");
        if (s == NULL)
            continue;
        for (s = strstr(s, "redis://"); s != NULL && n < N; s = strstr(s + 1, "redis://")) {
            snprintf(nodes[n].host, sizeof nodes[n].host, "127.0.0.1");
            nodes[n].port = atoi(strchr(s + 8, ':') + 1);
            n++;
        }
    }
    if (pclose(p) != 0 || n != N) {
        fprintf(stderr, "%s failed (%d nodes)\n", cmd, n);
        exit(2);
    }
}

static void stop_nodes(void)
{
    char cmd[1400];
    for (int i = 0; i < N; i++)
        if (raw[i] != NULL)
            redisFree(raw[i]);
    snprintf(cmd, sizeof cmd, "%s stop '%s'", script, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "%s failed\n", cmd);
}

int main(int argc, char **argv)
{
    (void)argc;
    tl_setup(argv[0]);
    start_nodes();
    T_RUN(test_quorums_and_release_of_a_failed_attempt);
    T_RUN(test_reentry_and_not_owner);
    T_RUN(test_validity_and_lease_expiry);
    T_RUN(test_a_node_down);
    T_RUN(test_a_silent_node_costs_one_node_timeout);
    T_RUN(test_restarted_nodes_are_reconnected_at_once);
    T_RUN(test_a_node_that_closes_new_connections_keeps_the_pause);
    T_RUN(test_a_node_that_answers_late_keeps_no_hold);
    T_RUN(test_restart_without_persistence_gives_two_holders);
    T_RUN(test_delayed_restart_keeps_one_holder);
    T_RUN(test_a_storm_on_one_key_has_one_winner_per_round);
    stop_nodes();
    lock_runtime_stop();
    return t_done();
}
