/* t_zk: a throwaway ZooKeeper for one C test program (scripts/zk.sh), and a
 * raw handle to look at what a lock left in it.
 *
 *   t_zk_start("test_zk_lock")  ZK_HOSTS when set (an existing server), else a
 *                           server of its own under $TEST_TMP (or /tmp),
 *                           started once for the program; returns ZK_HOSTS
 *   t_zk_stop()             stops the server it started
 *   t_zk_raw()              a connected zhandle_t on it (the test's own session) */
#ifndef SECKILL_T_ZK_H
#define SECKILL_T_ZK_H

#define THREADED 1
#include <zookeeper/zookeeper.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t_proc.h"

static char t_zk_hosts[256];
static char t_zk_dir[512];

static inline const char *t_zk_start(const char *name)
{
    const char *env = getenv("ZK_HOSTS");
    const char *tmp = getenv("TEST_TMP");
    char script[600], cmd[1400], line[256];
    FILE *p;

    if (env != NULL && env[0] != '\0') {
        snprintf(t_zk_hosts, sizeof t_zk_hosts, "%s", env);
        return t_zk_hosts;
    }
    t_proc_script("zk.sh", script, sizeof script);
    snprintf(t_zk_dir, sizeof t_zk_dir, "%s/zk-%s-%d", tmp != NULL && tmp[0] ? tmp : "/tmp",
             name, (int)getpid());
    snprintf(cmd, sizeof cmd, "%s start '%s'", script, t_zk_dir);
    if ((p = popen(cmd, "r")) == NULL) {
        fprintf(stderr, "cannot run %s\n", cmd);
        exit(2);
    }
    while (fgets(line, sizeof line, p) != NULL)
        if (strncmp(line, "ZK_HOSTS=", 9) == 0) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(t_zk_hosts, sizeof t_zk_hosts, "%s", line + 9);
        }
    if (pclose(p) != 0 || t_zk_hosts[0] == '\0') {
        fprintf(stderr, "%s failed: no ZooKeeper\n", cmd);
        exit(2);
    }
    /* run.sh kills what is registered here if this program dies first */
    {
        char pidf[600];
        snprintf(pidf, sizeof pidf, "%s/zk.pid", t_zk_dir);
        t_proc_register(pidf);
    }
    return t_zk_hosts;
}

/* Runs scripts/zk.sh CMD on the server this program started (stop,
 * restart); 0 or -1. */
static inline int t_zk_ctl(const char *what)
{
    char script[600], cmd[1400];
    if (t_zk_dir[0] == '\0')
        return -1;
    t_proc_script("zk.sh", script, sizeof script);
    snprintf(cmd, sizeof cmd, "%s %s '%s' >/dev/null", script, what, t_zk_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static inline void t_zk_stop(void)
{
    if (t_zk_dir[0] != '\0')
        t_zk_ctl("stop");
}

static pthread_mutex_t t_zk_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t t_zk_cv = PTHREAD_COND_INITIALIZER;
static int t_zk_state;

static inline void t_zk_watch(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh; (void)type; (void)path; (void)ctx;
    pthread_mutex_lock(&t_zk_mu);
    t_zk_state = state;
    pthread_cond_broadcast(&t_zk_cv);
    pthread_mutex_unlock(&t_zk_mu);
}

/* A handle of its own, connected (or NULL after 10 s); with 'id' (may be
 * NULL) the session to attach to: closing that handle ends the session. */
static inline zhandle_t *t_zk_raw(const clientid_t *id)
{
    zhandle_t *zh;
    struct timespec ts;
    int ok;

    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);
    pthread_mutex_lock(&t_zk_mu);
    t_zk_state = 0;
    pthread_mutex_unlock(&t_zk_mu);
    zh = zookeeper_init(t_zk_hosts, t_zk_watch, 10000, id, NULL, 0);
    if (zh == NULL)
        return NULL;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&t_zk_mu);
    while (zoo_state(zh) != ZOO_CONNECTED_STATE && t_zk_state != ZOO_EXPIRED_SESSION_STATE)
        if (pthread_cond_timedwait(&t_zk_cv, &t_zk_mu, &ts) == ETIMEDOUT)
            break;
    ok = zoo_state(zh) == ZOO_CONNECTED_STATE;
    pthread_mutex_unlock(&t_zk_mu);
    if (!ok) {
        zookeeper_close(zh);
        return NULL;
    }
    return zh;
}

/* Children of 'path' (-1: error, 0 when it does not exist). */
static inline int t_zk_children(zhandle_t *zh, const char *path)
{
    struct String_vector v = { 0, NULL };
    int rc = zoo_get_children(zh, path, 0, &v), n;
    if (rc == ZNONODE)
        return 0;
    if (rc != ZOK)
        return -1;
    n = v.count;
    deallocate_String_vector(&v);
    return n;
}

#endif
