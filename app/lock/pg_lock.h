/* pg_lock: per-key locks in Postgres, two ways.
 *
 * The lock table (tb_lock in sql/schema.sql): one row per held key with
 * its owner, hold count, fencing token and expiry. Taking it is one
 * statement, an INSERT ... ON CONFLICT DO UPDATE that succeeds when the key
 * is free, expired (expiry on acquire: no sweeper needed for safety) or
 * already the same owner's (reentry: the count goes up); it returns the
 * grant's token, a fresh value of the sequence tb_lock_token_seq, which
 * only grows. Release deletes or counts down the owner's row only. Every
 * time is the database's clock (clock_timestamp()): one clock for every
 * client, so no client's clock drift matters.
 *
 * Advisory locks (pg_try_advisory_lock): held by the database session that
 * took them, reentrant within it, released by pg_advisory_unlock on that
 * same session or when the session ends (a dropped connection frees them:
 * the server ends the backend as soon as it reads the end of the socket).
 * They have no expiry and no token.
 *
 * Each function runs one statement on the caller's connection, outside any
 * transaction block of its own, and waits for its answer at most 'wait_ms'
 * (pg_wait.h): a server that does not answer by then has the connection
 * shut down. LOCK_ERR: the statement failed or timed out; the caller checks
 * PQstatus() to tell a broken connection (CONNECTION_BAD after a time-out). */
#ifndef SECKILL_PG_LOCK_H
#define SECKILL_PG_LOCK_H

#include <stdint.h>
#include <libpq-fe.h>

#include "lock_status.h"

/* Outcomes (lock_status.h): LOCK_OK; LOCK_BUSY: another owner (or
 * session) holds it; LOCK_NOT_OWNER (release): not held by this owner (or
 * session); LOCK_ERR as above. */

/* The statements, with their parameters ($1 key, $2 owner, $3 lease in
 * ms; advisory: $1 the bigint key), for tools that run them elsewhere
 * (pgbench scripts). */
extern const char pg_lock_sql_acquire[];
extern const char pg_lock_sql_release[];
extern const char pg_lock_sql_sweep[];
extern const char pg_lock_sql_advisory_try[];
extern const char pg_lock_sql_advisory_unlock[];

/* Lock table. 'token' and 'holds' may be NULL. */
lock_status pg_lock_table_acquire(PGconn *pg, int wait_ms, const char *key, const char *owner,
                              long lease_ms, int64_t *token, int *holds);

/* Counts the owner's hold down (the lease starts again while held) or
 * deletes the row. LOCK_NOT_OWNER: no row of this owner, or its lease had
 * ended (the row, if still there, is deleted all the same). 'left' may be
 * NULL. */
lock_status pg_lock_table_release(PGconn *pg, int wait_ms, const char *key, const char *owner,
                              long lease_ms, int *left);

/* Deletes expired rows; their count, or -1. */
long pg_lock_table_sweep(PGconn *pg, int wait_ms);

/* Advisory lock on 'key' for this session. */
lock_status pg_lock_advisory_try(PGconn *pg, int wait_ms, int64_t key);
lock_status pg_lock_advisory_release(PGconn *pg, int wait_ms, int64_t key);

#endif
