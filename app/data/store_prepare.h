/* store_prepare: a fresh Postgres session made ready for every store
 * module: its set-up (store.h) and each module's prepared statements. The
 * session hook of the workers' and consumers' connections
 * (conn_set_pg_init). */
#ifndef SECKILL_STORE_PREPARE_H
#define SECKILL_STORE_PREPARE_H

#include <libpq-fe.h>

/* Sets the session up and prepares every statement of the store modules,
 * whose statements then keep generic plans (plan_cache_mode =
 * force_generic_plan). Returns 0 or -1 (logged). */
int store_prepare(PGconn *pg);

#endif
