/* pg_wait: a Postgres round trip whose wait is bounded by the client. */
#include "pg_wait.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

int pg_wait_input(PGconn *pg, int64_t until_us)
{
    while (PQisBusy(pg)) {
        struct pollfd pfd = { .fd = PQsocket(pg), .events = POLLIN };
        int64_t left = until_us - util_mono_us();
        int rc;

        if (pfd.fd < 0)
            return -1;
        if (left <= 0) {
            log_warn("postgres: no answer from backend %d in time: closing the connection",
                     PQbackendPID(pg));
            shutdown(pfd.fd, SHUT_RDWR);
            PQconsumeInput(pg);             /* reads the end: the connection is bad now */
            return -1;
        }
        rc = poll(&pfd, 1, (int)((left + 999) / 1000));
        if (rc < 0 && errno != EINTR)
            return -1;
        if (rc > 0 && !PQconsumeInput(pg))
            return -1;
    }
    return 0;
}

PGresult *pg_wait_collect(PGconn *pg, int bound_ms)
{
    int64_t until = util_mono_us() + (int64_t)bound_ms * 1000;
    PGresult *kept = NULL, *r;

    for (;;) {
        if (pg_wait_input(pg, until) != 0) {
            PQclear(kept);
            return NULL;
        }
        if ((r = PQgetResult(pg)) == NULL)
            return kept;
        if (kept != NULL && PQresultStatus(kept) == PGRES_FATAL_ERROR) {
            PQclear(r);
        } else {
            PQclear(kept);
            kept = r;
        }
    }
}
