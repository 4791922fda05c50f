/* t_lock: helpers shared by the lock tests that run the lock runtime
 * (subscriber and renewal threads) and child processes. Include after t.h.
 *
 *   tl_setup()        config from the environment, scripts, lock runtime
 *   tl_spawn()        this test binary again, as a child with other args
 *   tl_read_line()    a line from a child's stdout, with a timeout
 *   tl_owner()        a lock owner id "<instance uuid>:<n>"
 *   tl_int()          an integer reply (-100 on anything else)
 *   tl_numsub()       PUBSUB NUMSUB of one channel
 *   tl_percentile()   nearest-rank percentile of a sample */
#ifndef SECKILL_T_LOCK_H
#define SECKILL_T_LOCK_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>
#include <hiredis/hiredis.h>

#include "config.h"
#include "lock.h"
#include "log.h"
#include "script.h"

/* Loads g_cfg from the environment (REDIS_URL, LUA_DIR, WATCHDOG_TIMEOUT_MS,
 * ...) and the scripts, and starts the lock runtime the way a program that
 * uses the lock library would: with its own connect function (t_redis_open)
 * and settings. Exits 2 when it cannot. */
static inline void tl_setup(const char *argv0)
{
    char err[256];
    char *args[] = { (char *)argv0, NULL };

    setenv("LOG_LEVEL", "warn", 0);
    if (config_load(1, args) != 0) {
        fprintf(stderr, "config_load failed\n");
        exit(2);
    }
    log_set_level((enum log_level)g_cfg.log_level);
    if (script_load_all(t_lua_dir(), err, sizeof err) != 0) {
        fprintf(stderr, "script_load_all: %s\n", err);
        exit(2);
    }
    lock_options o = {
        .connect = t_redis_open,
        .command_timeout_ms = g_cfg.redis_timeout_ms,
        .watchdog_timeout_ms = g_cfg.watchdog_timeout_ms,
    };
    if (lock_runtime_start(&o) != 0) {
        fprintf(stderr, "lock_runtime_start failed\n");
        exit(2);
    }
}

/* Runs this binary again with 'args' (args[0] is its name, NULL-terminated),
 * its stdout on a pipe returned in '*out' (close it), stdin /dev/null.
 * Returns the pid, or -1. exec, not a bare fork: the child starts its own
 * threads instead of inheriting a copy of ours mid-flight. */
static inline pid_t tl_spawn(char *const args[], int *out)
{
    int p[2];
    pid_t pid;

    if (pipe(p) != 0)
        return -1;
    pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        close(p[1]);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(p[1]);
    *out = p[0];
    return pid;
}

/* Reads one line (without the newline) within 'timeout_ms'. 0 or -1. */
static inline int tl_read_line(int fd, char *buf, size_t n, long timeout_ms)
{
    size_t len = 0;
    double end = t_now_ms() + (double)timeout_ms;

    while (len + 1 < n) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        long left = (long)(end - t_now_ms());
        if (left <= 0 || poll(&p, 1, (int)left) <= 0)
            return -1;
        ssize_t got = read(fd, buf + len, 1);
        if (got <= 0)
            return -1;
        if (buf[len] == '\n') {
            buf[len] = '\0';
            return 0;
        }
        len++;
    }
    return -1;
}

static inline void tl_owner(char *buf, size_t n, int id)
{
    snprintf(buf, n, "%s:%d", g_cfg.instance_uuid, id);
}

static inline long long tl_int(redisContext *c, const char *fmt, const char *arg)
{
    long long v = -100;
    redisReply *r = redisCommand(c, fmt, arg);

    if (r != NULL && r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    freeReplyObject(r);
    return v;
}

static inline long long tl_numsub(redisContext *c, const char *channel)
{
    long long v = -100;
    redisReply *r = redisCommand(c, "PUBSUB NUMSUB %s", channel);

    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        v = r->element[1]->integer;
    freeReplyObject(r);
    return v;
}

static inline int tl_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile 'p' (0..100) of v[0..n-1]; sorts v. */
static inline double tl_percentile(double *v, size_t n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, tl_cmp_double);
    size_t rank = (size_t)((p / 100.0) * (double)n + 0.999999);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return v[rank - 1];
}

#endif
