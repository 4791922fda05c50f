/* pg_wait: a Postgres round trip whose wait is bounded by the client.
 *
 * statement_timeout ends a slow statement on the server. A server that
 * cannot answer at all - a stopped or hung backend, a host whose kernel
 * still acknowledges while the database is gone - ends nothing, and
 * libpq's blocking calls (PQexec, PQexecParams, PQgetResult) would wait
 * for it forever: TCP keepalives and tcp_user_timeout only catch a peer
 * whose kernel is gone too. Here the command is sent with libpq's
 * asynchronous calls and each wait for its answer is a poll() with a
 * deadline; when the deadline passes, the connection is shut down
 * (shutdown(2) of its socket), so it reads as CONNECTION_BAD and the call
 * fails. The statement's outcome is unknown then: the server may still
 * run it once it resumes.
 *
 * The bound is the caller's (a number of milliseconds, or a deadline on
 * util_mono_us()): this module reads no setting. */
#ifndef SECKILL_PG_WAIT_H
#define SECKILL_PG_WAIT_H

#include <stdint.h>
#include <libpq-fe.h>

/* Waits until a result can be read from 'pg' without blocking, at most
 * until 'until_us' (util_mono_us()). 0, or -1 when the connection failed,
 * or timed out and was shut down: it is CONNECTION_BAD then. */
int pg_wait_input(PGconn *pg, int64_t until_us);

/* The result of the command just sent (PQsendQuery, PQsendQueryParams,
 * PQsendQueryPrepared, PQsendPrepare), as PQexec gives it (the last one,
 * or the first error), read within 'bound_ms' from now; NULL when the
 * connection failed or timed out (PQerrorMessage says why). */
PGresult *pg_wait_collect(PGconn *pg, int bound_ms);

#endif
