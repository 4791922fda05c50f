/* t_proc: what the C test helpers that start servers through a script
 * (t_zk.h: scripts/zk.sh, t_cluster.h: scripts/redis-cluster.sh) share.
 *
 *   t_proc_script("zk.sh", buf, n)   the repository's script: $SQL_DIR/../scripts,
 *                                    or ./scripts
 *   t_proc_register("dir/x.pid")     the process named by that pid file
 *                                    registered in $TEST_TMP/pids with its start
 *                                    time: tests/run.sh stops it if the program
 *                                    dies first, and never a process that took
 *                                    its pid over */
#ifndef SECKILL_T_PROC_H
#define SECKILL_T_PROC_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline void t_proc_script(const char *name, char *out, size_t n)
{
    const char *sql = getenv("SQL_DIR");
    if (sql != NULL && sql[0] != '\0')
        snprintf(out, n, "%s/../scripts/%s", sql, name);
    else
        snprintf(out, n, "scripts/%s", name);
}

/* Process pid's start time, field 22 of /proc/pid/stat (after the command
 * name, which may hold spaces); 0, or -1 when it is gone. */
static inline int t_proc_start_time(long pid, char *out, size_t n)
{
    char path[64], buf[1024], *p;
    size_t len;
    FILE *f;
    int field;

    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    if ((f = fopen(path, "r")) == NULL)
        return -1;
    len = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[len] = '\0';
    if ((p = strrchr(buf, ')')) == NULL)
        return -1;
    p++;
    for (field = 2; field < 21 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    if (p == NULL)
        return -1;
    p++;
    snprintf(out, n, "%.*s", (int)strcspn(p, " \n"), p);
    return out[0] != '\0' ? 0 : -1;
}

static inline void t_proc_register(const char *pidfile)
{
    const char *tmp = getenv("TEST_TMP");
    char reg[800], start[32];
    FILE *f, *r;
    long pid = 0;

    if (tmp == NULL || tmp[0] == '\0' || (f = fopen(pidfile, "r")) == NULL)
        return;
    if (fscanf(f, "%ld", &pid) == 1 && pid > 0 &&
        t_proc_start_time(pid, start, sizeof start) == 0) {
        snprintf(reg, sizeof reg, "%s/pids/%ld", tmp, pid);
        if ((r = fopen(reg, "w")) != NULL) {
            fprintf(r, "%s\n", start);
            fclose(r);
        }
    }
    fclose(f);
}

#endif
