/* test_zk_lock: the ZooKeeper lock recipe (app/lock/zk_lock.c) against a real ZooKeeper
 * (one started for this program by scripts/zk.sh, or ZK_HOSTS).
 *
 * Mutual exclusion and tokens, reentry, release by a non-owner, the
 * waiters' order (each watches its predecessor), a create whose reply is
 * lost (ZOOKEEPER-1262) for a free and for a busy lock, session expiry
 * (holds lost, a new session, the next holder's token higher), the czxid
 * token across a re-created parent (where the sequence number restarts),
 * a holder process killed with SIGKILL (freed after the session timeout),
 * and an unreachable server or a bad root at open. */
#include "t.h"
#include "t_zk.h"
#include "zk_lock.h"

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROOT "/seckill-test/locks"
#define TIMEOUT_MS 2000      /* session timeout asked by the test clients */

static zk_lock_client *open_client(void)
{
    char err[512];
    zk_lock_client *c = zk_lock_open(t_zk_hosts, ROOT, TIMEOUT_MS, 10000, err, sizeof err);
    if (c == NULL)
        printf("# zk_lock_open: %s\n", err);
    return c;
}

/* A fresh key per case, so that no case sees another's nodes. */
static const char *fresh_key(char *buf, size_t n)
{
    static int k;
    snprintf(buf, n, "lock:order:%d%03d", (int)getpid(), ++k);
    return buf;
}

static void test_exclusion_and_tokens(void)
{
    zk_lock_client *a = open_client(), *b = open_client();
    char key[64];
    zk_lock_grant g1, g2;

    if (!T_ASSERT(a != NULL && b != NULL))
        goto out;
    fresh_key(key, sizeof key);
    T_EQ_I64(zk_lock_acquire(a, key, "A", 0, &g1), LOCK_OK);
    T_ASSERT(g1.token > 0);
    T_EQ_I64(g1.count, 1);
    T_EQ_I64(g1.session, zk_lock_session_id(a));
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, &g2), LOCK_BUSY);
    T_EQ_I64(zk_lock_acquire(a, key, "A2", 0, &g2), LOCK_BUSY);    /* another owner, same process */
    T_EQ_I64(zk_lock_release(a, key, "A", NULL), LOCK_OK);
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, &g2), LOCK_OK);
    T_ASSERT(g2.token > g1.token);                              /* the fence's order */
    T_EQ_I64(zk_lock_release(b, key, "B", NULL), LOCK_OK);
    /* a busy attempt leaves no node behind */
    zhandle_t *raw = t_zk_raw(NULL);
    char parent[128];
    snprintf(parent, sizeof parent, ROOT "/%s", key);
    if (T_ASSERT(raw != NULL)) {
        T_EQ_I64(t_zk_children(raw, parent), 0);
        zookeeper_close(raw);
    }
out:
    zk_lock_close(a);
    zk_lock_close(b);
}

static void test_reentry_and_not_owner(void)
{
    zk_lock_client *a = open_client(), *b = open_client();
    char key[64];
    zk_lock_grant g1, g2;
    int left = -1;

    if (!T_ASSERT(a != NULL && b != NULL))
        goto out;
    fresh_key(key, sizeof key);
    T_EQ_I64(zk_lock_acquire(a, key, "A", 0, &g1), LOCK_OK);
    T_EQ_I64(zk_lock_acquire(a, key, "A", 0, &g2), LOCK_OK);       /* reentry */
    T_EQ_I64(g2.count, 2);
    T_EQ_I64(g2.token, g1.token);                               /* the same node */
    /* release by a non-owner: refused, nothing changes */
    T_EQ_I64(zk_lock_release(b, key, "A", NULL), LOCK_NOT_OWNER);  /* another process */
    T_EQ_I64(zk_lock_release(a, key, "B", NULL), LOCK_NOT_OWNER);  /* another owner here */
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_BUSY);
    T_EQ_I64(zk_lock_release(a, key, "A", &left), LOCK_OK);
    T_EQ_I64(left, 1);
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_BUSY);    /* still held once */
    T_EQ_I64(zk_lock_release(a, key, "A", &left), LOCK_OK);
    T_EQ_I64(left, 0);
    T_EQ_I64(zk_lock_release(a, key, "A", NULL), LOCK_NOT_OWNER);  /* once too often */
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_OK);
    T_EQ_I64(zk_lock_release(b, key, "B", NULL), LOCK_OK);
out:
    zk_lock_close(a);
    zk_lock_close(b);
}

typedef struct waiter_arg {
    zk_lock_client *c;
    const char *key, *owner;
    lock_status st;
    double at_ms;
} waiter_arg;

static void *waiter_main(void *p)
{
    waiter_arg *w = p;
    w->st = zk_lock_acquire(w->c, w->key, w->owner, 8000, NULL);
    w->at_ms = t_now_ms();
    return NULL;
}

/* Waiters queue in order and each is woken by its predecessor's release. */
static void test_waiters_in_order(void)
{
    zk_lock_client *a = open_client(), *b = open_client(), *c = open_client();
    char key[64];
    pthread_t tb, tc;
    waiter_arg wb = { b, key, "B", LOCK_ERR, 0 }, wc = { c, key, "C", LOCK_ERR, 0 };
    double released;

    if (!T_ASSERT(a != NULL && b != NULL && c != NULL))
        goto out;
    fresh_key(key, sizeof key);
    T_EQ_I64(zk_lock_acquire(a, key, "A", 0, NULL), LOCK_OK);
    pthread_create(&tb, NULL, waiter_main, &wb);
    t_sleep_ms(300);                                            /* B queues first */
    pthread_create(&tc, NULL, waiter_main, &wc);
    t_sleep_ms(300);
    released = t_now_ms();
    T_EQ_I64(zk_lock_release(a, key, "A", NULL), LOCK_OK);
    pthread_join(tb, NULL);
    T_EQ_I64(wb.st, LOCK_OK);
    T_ASSERT(wb.at_ms - released < 1000);                       /* woken, not polling */
    t_sleep_ms(300);
    T_ASSERT(wc.at_ms == 0);                                    /* C still waits behind B */
    T_EQ_I64(zk_lock_release(b, key, "B", NULL), LOCK_OK);
    pthread_join(tc, NULL);
    T_EQ_I64(wc.st, LOCK_OK);
    T_EQ_I64(zk_lock_release(c, key, "C", NULL), LOCK_OK);
out:
    zk_lock_close(a);
    zk_lock_close(b);
    zk_lock_close(c);
}

/* ZOOKEEPER-1262: the create succeeded, its reply was lost. */
static void test_lost_create_reply(void)
{
    zk_lock_client *a = open_client(), *b = open_client();
    zhandle_t *raw = t_zk_raw(NULL);
    char key[64], parent[128];
    zk_lock_grant g;
    zk_lock_counts n;

    if (!T_ASSERT(a != NULL && b != NULL && raw != NULL))
        goto out;
    fresh_key(key, sizeof key);
    snprintf(parent, sizeof parent, ROOT "/%s", key);
    /* a free lock: the node is found by its name and the lock is held */
    zk_lock_test_drop_next_create_reply(a);
    T_EQ_I64(zk_lock_acquire(a, key, "A", 0, &g), LOCK_OK);
    zk_lock_counts_get(a, &n);
    T_EQ_I64(n.recovered, 1);
    T_ASSERT(g.token > 0);
    T_EQ_I64(t_zk_children(raw, parent), 1);
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_BUSY);
    /* a busy lock: the lost node is found, and deleted, not left queued */
    zk_lock_test_drop_next_create_reply(b);
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_BUSY);
    zk_lock_counts_get(b, &n);
    T_EQ_I64(n.recovered, 1);
    T_EQ_I64(t_zk_children(raw, parent), 1);                    /* only A's */
    T_EQ_I64(zk_lock_release(a, key, "A", NULL), LOCK_OK);
    T_EQ_I64(t_zk_children(raw, parent), 0);
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_OK);       /* nothing blocks it */
    T_EQ_I64(zk_lock_release(b, key, "B", NULL), LOCK_OK);
out:
    if (raw != NULL)
        zookeeper_close(raw);
    zk_lock_close(a);
    zk_lock_close(b);
}

/* Child mode for test_session_expiry: hold 'key', report, then on each
 * line of stdin report the release ("release") or a new attempt. */
static int paused_holder(const char *key)
{
    zk_lock_client *c = open_client();
    zk_lock_grant g;
    zk_lock_counts n;
    char line[64];
    double t0;
    lock_status st = LOCK_ERR;

    if (c == NULL || zk_lock_acquire(c, key, "A", 0, &g) != LOCK_OK)
        return 1;
    printf("held %lld\n", (long long)g.token);
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL)
        return 1;
    printf("release %d\n", (int)zk_lock_release(c, key, "A", NULL));
    fflush(stdout);
    t0 = t_now_ms();
    while (t_now_ms() - t0 < 10000 && (st = zk_lock_acquire(c, key, "A", 0, NULL)) == LOCK_ERR)
        t_sleep_ms(50);
    zk_lock_counts_get(c, &n);
    printf("again %d %llu\n", (int)st, (unsigned long long)n.sessions);
    fflush(stdout);
    zk_lock_close(c);
    return 0;
}

static const char *self_path;

/* Starts this program in a child mode with a pipe each way. */
static pid_t spawn_child(const char *mode, const char *key, FILE **to, FILE **from)
{
    int in[2], out[2];
    pid_t pid;

    if (pipe(in) != 0 || pipe(out) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        execl(self_path, self_path, mode, key, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    *to = fdopen(in[1], "w");
    *from = fdopen(out[0], "r");
    return pid;
}

/* A holder paused past its session timeout (a GC pause, SIGSTOP here):
 * the server ends its session and deletes its node; the next holder's
 * token is higher (its late write is fenced off); on waking, its release
 * reports the hold lost, and its next attempt runs in a new session. */
static void test_session_expiry(void)
{
    zk_lock_client *b = open_client();
    char key[64], line[128] = "";
    long long ta = 0;
    int st = -1;
    unsigned long long sessions = 0;
    FILE *to = NULL, *from = NULL;
    zk_lock_grant gb;
    lock_status bst = LOCK_ERR;
    pid_t pid;
    double t0;

    if (!T_ASSERT(b != NULL))
        return;
    fresh_key(key, sizeof key);
    pid = spawn_child("--hold-paused", key, &to, &from);
    if (!T_ASSERT(pid > 0 && to != NULL && from != NULL))
        goto out;
    T_ASSERT(fgets(line, sizeof line, from) != NULL && sscanf(line, "held %lld", &ta) == 1);
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_BUSY);
    kill(pid, SIGSTOP);
    t0 = t_now_ms();
    while (t_now_ms() - t0 < 4 * TIMEOUT_MS && (bst = zk_lock_acquire(b, key, "B", 0, &gb)) != LOCK_OK)
        t_sleep_ms(50);
    T_EQ_I64(bst, LOCK_OK);                                     /* A's node went with its session */
    T_ASSERT(gb.token > ta);                                    /* A's late write is fenced off */
    kill(pid, SIGCONT);
    fputs("release\n", to);
    fflush(to);
    T_ASSERT(fgets(line, sizeof line, from) != NULL && sscanf(line, "release %d", &st) == 1);
    T_EQ_I64(st, LOCK_LOST);
    T_ASSERT(fgets(line, sizeof line, from) != NULL &&
             sscanf(line, "again %d %llu", &st, &sessions) == 2);
    T_EQ_I64(st, LOCK_BUSY);                                    /* a new session, queued behind B */
    T_EQ_I64(sessions, 2);
    T_EQ_I64(zk_lock_release(b, key, "B", NULL), LOCK_OK);
out:
    if (to != NULL)
        fclose(to);
    if (from != NULL)
        fclose(from);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    zk_lock_close(b);
}

/* The sequence number restarts with a re-created parent; the czxid does
 * not, so the czxid is the token. */
static void test_token_is_czxid(void)
{
    zk_lock_client *a = open_client();
    zhandle_t *raw = t_zk_raw(NULL);
    char key[64], parent[128];
    zk_lock_grant g1, g2;

    if (!T_ASSERT(a != NULL && raw != NULL))
        goto out;
    fresh_key(key, sizeof key);
    snprintf(parent, sizeof parent, ROOT "/%s", key);
    T_EQ_I64(zk_lock_acquire(a, key, "A", 0, &g1), LOCK_OK);
    T_EQ_I64(zk_lock_release(a, key, "A", NULL), LOCK_OK);
    T_EQ_I64(zoo_delete(raw, parent, -1), ZOK);                 /* what the container reaper does */
    T_EQ_I64(zk_lock_acquire(a, key, "A", 0, &g2), LOCK_OK);
    T_EQ_I64(g2.seq, g1.seq);                                   /* the sequence restarted ... */
    T_ASSERT(g2.token > g1.token);                              /* ... the czxid went on */
    T_EQ_I64(zk_lock_release(a, key, "A", NULL), LOCK_OK);
out:
    if (raw != NULL)
        zookeeper_close(raw);
    zk_lock_close(a);
}

/* Child mode: take 'key', say so on stdout, then sleep until killed. */
static int hold_forever(const char *key)
{
    zk_lock_client *c = open_client();
    if (c == NULL || zk_lock_acquire(c, key, "child", 0, NULL) != LOCK_OK)
        return 1;
    printf("held\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* A holder killed with SIGKILL: its socket closes at once, but the server
 * keeps the session, and the lock, until the session timeout. */
static void test_holder_killed(void)
{
    const char *self = self_path;
    zk_lock_client *b = open_client();
    char key[64], cmd[600], line[32] = "";
    FILE *p;
    pid_t pid = 0;
    double killed, got;
    int timeout;

    if (!T_ASSERT(b != NULL))
        return;
    fresh_key(key, sizeof key);
    snprintf(cmd, sizeof cmd, "exec '%s' --hold '%s' & echo $!", self, key);
    p = popen(cmd, "r");
    if (!T_ASSERT(p != NULL && fscanf(p, "%d", &pid) == 1 && pid > 0))
        goto out;
    T_ASSERT(fgets(line, sizeof line, p) != NULL);              /* the rest of the pid line */
    T_ASSERT(fgets(line, sizeof line, p) != NULL && strcmp(line, "held\n") == 0);
    T_EQ_I64(zk_lock_acquire(b, key, "B", 0, NULL), LOCK_BUSY);
    timeout = zk_lock_session_timeout(b);
    kill(pid, SIGKILL);
    killed = t_now_ms();
    T_EQ_I64(zk_lock_acquire(b, key, "B", 3 * TIMEOUT_MS, NULL), LOCK_OK);  /* waits on the watch */
    got = t_now_ms() - killed;
    printf("# holder killed: lock free after %.0f ms (session timeout %d ms)\n", got, timeout);
    T_ASSERT(got > timeout / 2.0);                              /* not at once ... */
    T_ASSERT(got < timeout + 1500);                             /* ... but at the timeout */
    T_EQ_I64(zk_lock_release(b, key, "B", NULL), LOCK_OK);
out:
    if (p != NULL)
        pclose(p);
    zk_lock_close(b);
}

static void test_unreachable(void)
{
    char err[512] = "";
    double t0 = t_now_ms();
    zk_lock_client *c = zk_lock_open("127.0.0.1:1", ROOT, TIMEOUT_MS, 1000, err, sizeof err);
    T_ASSERT(c == NULL);
    T_ASSERT(strstr(err, "no ZooKeeper server of '127.0.0.1:1' answered within 1000 ms") != NULL);
    T_ASSERT(t_now_ms() - t0 < 3000);
    zk_lock_close(c);
}

/* A root that is not an absolute path is refused before connecting; one
 * ZooKeeper refuses to create (an empty path element) after. */
static void test_open_refuses_a_bad_root(void)
{
    char err[512] = "";
    zk_lock_client *c = zk_lock_open(t_zk_hosts, "seckill-no-slash", TIMEOUT_MS, 10000, err, sizeof err);
    T_ASSERT(c == NULL);
    T_EQ_STR(err, "invalid ZooKeeper hosts or root");
    zk_lock_close(c);
    err[0] = '\0';
    c = zk_lock_open(t_zk_hosts, "/seckill-test//empty", TIMEOUT_MS, 10000, err, sizeof err);
    T_ASSERT(c == NULL);
    if (!T_ASSERT(strstr(err, "cannot create /seckill-test//empty in ZooKeeper") != NULL))
        printf("    %s\n", err);
    zk_lock_close(c);
}

int main(int argc, char **argv)
{
    self_path = argv[0];
    if (argc == 3 && strncmp(argv[1], "--hold", 6) == 0) {
        if (getenv("ZK_HOSTS") == NULL)
            return 2;
        snprintf(t_zk_hosts, sizeof t_zk_hosts, "%s", getenv("ZK_HOSTS"));
        return strcmp(argv[1], "--hold") == 0 ? hold_forever(argv[2]) : paused_holder(argv[2]);
    }
    t_zk_start("test_zk_lock");
    setenv("ZK_HOSTS", t_zk_hosts, 1);                          /* for the child */
    T_RUN(test_unreachable);
    T_RUN(test_open_refuses_a_bad_root);
    T_RUN(test_exclusion_and_tokens);
    T_RUN(test_reentry_and_not_owner);
    T_RUN(test_waiters_in_order);
    T_RUN(test_lost_create_reply);
    T_RUN(test_token_is_czxid);
    T_RUN(test_session_expiry);
    T_RUN(test_holder_killed);
    t_zk_stop();
    return t_done();
}
