/* t_cluster: a throwaway Redis Cluster for one C test program
 * (scripts/redis-cluster.sh: 3 masters and 3 replicas on 127.0.0.1).
 *
 *   t_cluster_start("test_x")  REDIS_CLUSTER_NODES when set (an existing
 *                           cluster), else a cluster of its own under
 *                           $TEST_TMP (or /tmp), started once for the
 *                           program; returns "127.0.0.1:P1,127.0.0.1:P2,..."
 *   t_cluster_ctl("kill 1")  scripts/redis-cluster.sh kill DIR 1 on that
 *                           cluster (stop [I], kill I, start-node I, pause I,
 *                           resume I); 0 or -1
 *   t_cluster_out("master-of 0", buf, n)  the same, its first line of output
 *                           in buf (role I, port I, pid I, master-of SLOT)
 *   t_cluster_stop()        stops the cluster it started
 *
 * Each node it starts (start, start-node) is registered with tests/run.sh,
 * which stops it if this program dies first. */
#ifndef SECKILL_T_CLUSTER_H
#define SECKILL_T_CLUSTER_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t_proc.h"

static char t_cluster_nodes[1024];
static char t_cluster_dir[512];

/* Registers node i (its pid file's process) in $TEST_TMP/pids: run.sh kills
 * it if this program dies first. */
static inline void t_cluster_register(int i)
{
    char pidf[600];

    if (t_cluster_dir[0] == '\0')
        return;
    snprintf(pidf, sizeof pidf, "%s/node-%d/redis.pid", t_cluster_dir, i);
    t_proc_register(pidf);
}

static inline const char *t_cluster_start(const char *name)
{
    const char *env = getenv("REDIS_CLUSTER_NODES");
    const char *tmp = getenv("TEST_TMP");
    char script[600], cmd[1400], line[1024];
    const char *c;
    int i, count;
    FILE *p;

    if (env != NULL && env[0] != '\0') {
        snprintf(t_cluster_nodes, sizeof t_cluster_nodes, "%s", env);
        return t_cluster_nodes;
    }
    if (t_cluster_nodes[0] != '\0')
        return t_cluster_nodes;
    t_proc_script("redis-cluster.sh", script, sizeof script);
    snprintf(t_cluster_dir, sizeof t_cluster_dir, "%s/cluster-%s-%d",
             tmp != NULL && tmp[0] ? tmp : "/tmp", name, (int)getpid());
    snprintf(cmd, sizeof cmd, "%s start '%s'", script, t_cluster_dir);
    if ((p = popen(cmd, "r")) == NULL) {
        fprintf(stderr, "cannot run %s\n", cmd);
        exit(2);
    }
    while (fgets(line, sizeof line, p) != NULL)
        if (strncmp(line, "REDIS_CLUSTER_NODES=", 20) == 0) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(t_cluster_nodes, sizeof t_cluster_nodes, "%s", line + 20);
        }
    if (pclose(p) != 0 || t_cluster_nodes[0] == '\0') {
        fprintf(stderr, "%s failed: no Redis Cluster\n", cmd);
        t_cluster_nodes[0] = '\0';
        exit(2);
    }
    /* run.sh kills what is registered here if this program dies first */
    for (count = 1, c = t_cluster_nodes; *c != '\0'; c++)
        if (*c == ',')
            count++;
    for (i = 1; i <= count; i++)
        t_cluster_register(i);
    return t_cluster_nodes;
}

/* "kill 1" -> "SCRIPT kill 'DIR' 1" (the script wants DIR second). */
static inline int t_cluster_cmd(const char *what, char *out, size_t n)
{
    char script[600];
    size_t verb = strcspn(what, " ");
    const char *rest = what + verb;

    if (t_cluster_dir[0] == '\0')
        return -1;
    while (*rest == ' ')
        rest++;
    t_proc_script("redis-cluster.sh", script, sizeof script);
    snprintf(out, n, "%s %.*s '%s' %s", script, (int)verb, what, t_cluster_dir, rest);
    return 0;
}

/* Registers node I again after "start-node I" (a new process). */
static inline void t_cluster_after(const char *what)
{
    if (strncmp(what, "start-node ", 11) == 0)
        t_cluster_register(atoi(what + 11));
}

/* Runs scripts/redis-cluster.sh WHAT (a command and its argument, e.g.
 * "kill 1") on the cluster this program started; 0 or -1. */
static inline int t_cluster_ctl(const char *what)
{
    char cmd[1400];
    size_t len;
    int rc;

    if (t_cluster_cmd(what, cmd, sizeof cmd - 16) != 0)
        return -1;
    len = strlen(cmd);
    snprintf(cmd + len, sizeof cmd - len, " >/dev/null");
    rc = system(cmd) == 0 ? 0 : -1;
    if (rc == 0)
        t_cluster_after(what);
    return rc;
}

/* The same, the first line of its output (without the newline) in out;
 * 0, or -1 when it fails or prints nothing. */
static inline int t_cluster_out(const char *what, char *out, size_t n)
{
    char cmd[1400], line[1024];
    int got = 0;
    FILE *p;

    if (n > 0)
        out[0] = '\0';
    if (t_cluster_cmd(what, cmd, sizeof cmd) != 0)
        return -1;
    if ((p = popen(cmd, "r")) == NULL)
        return -1;
    while (fgets(line, sizeof line, p) != NULL)
        if (!got) {
            line[strcspn(line, "\n")] = '\0';
            if (n > 0)
                snprintf(out, n, "%s", line);
            got = 1;
        }
    if (pclose(p) != 0 || !got)
        return -1;
    t_cluster_after(what);
    return 0;
}

static inline void t_cluster_stop(void)
{
    if (t_cluster_dir[0] != '\0')
        t_cluster_ctl("stop");
}

#endif
