/* stock_redis_load: a voucher's Redis-first state and its names: the
 * voucher's hash, buyers set and landed counter, the orders stream and
 * its group. The state is loaded when the voucher is created or reset
 * (lua/stock_load.lua), rebuilt from Postgres when Redis lost it, and
 * dropped when it holds an older sale than Postgres (lua/stock_retire.lua).
 *
 * Every call works on the caller's connection and leaves it to the caller
 * (c->err set when Redis failed). The scripts are read once by
 * stock_redis_load_start, before serving; read-only after, so any thread
 * may call. */
#ifndef SECKILL_STOCK_REDIS_LOAD_H
#define SECKILL_STOCK_REDIS_LOAD_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#include "conn.h"
#include "rcluster.h"
#include "store.h"
#include "store_voucher.h"

#define STOCK_REDIS_STREAM "seckill:orders"       /* admitted orders, until trimmed once settled */
#define STOCK_REDIS_DEAD "seckill:orders:dead"    /* entries no batch could persist */
#define STOCK_REDIS_GROUP "seckill"               /* the consumers' group */

/* The orders stream that takes a voucher's admitted orders, and its dead
 * letters. On one Redis every voucher shares STOCK_REDIS_STREAM and
 * STOCK_REDIS_DEAD. On a Redis Cluster each voucher has its own,
 * "seckill:v:{<id>}:orders" and "seckill:v:{<id>}:orders:dead", in the
 * voucher's slot: admission stays one script on one master, and a replay
 * one script too. */
typedef struct stock_redis_stream {
    int64_t voucher_id;       /* on a cluster; 0 for the shared stream */
    char orders[72], dead[80];
} stock_redis_stream;

/* The stream of 'voucher_id' (any id on one Redis: the shared one). */
void stock_redis_stream_of(stock_redis_stream *s, int64_t voucher_id);

/* 1 when each voucher has its own stream (a Redis Cluster). */
int stock_redis_per_voucher(void);

/* "seckill:v:{<id>}" followed by 'suffix' ("" for the hash, ":buyers",
 * ":landed"). */
void stock_redis_key(char *buf, size_t n, int64_t voucher_id, const char *suffix);

/* A voucher's keys: its three, and its orders stream's. */
typedef struct stock_redis_keys {
    char hash[64], buyers[72], landed[72];
    stock_redis_stream stream;
} stock_redis_keys;

void stock_redis_keys_fill(stock_redis_keys *k, int64_t voucher_id);

/* An integer reply, or a string holding one; 0 for nil; -1 for NULL or
 * anything else. */
int64_t stock_redis_int(const redisReply *r);

/* Reads stock_load.lua and stock_retire.lua. 0, or -1 with 'err'. */
int stock_redis_load_start(char *err, size_t errlen);

/* The voucher's new sale in Redis, after its creation or reset in
 * Postgres: stock, window and sale (sale_gen) from 'v', no buyers. The
 * previous sale's undrained orders are dropped by the consumers, which
 * compare each order's sale with Postgres's under the voucher row's lock.
 * Redis holding this sale or a newer one already is left as it is. 0, or
 * -1 when Redis failed. */
int stock_redis_load(redisContext *c, const store_voucher *v);

/* The voucher's Redis state rebuilt on 'c' from Postgres (cs's
 * connection, marked broken when it failed), when Redis lost it
 * (stock_load.lua says how): STORE_OK when it exists now; else what
 * stopped it (STORE_NOT_FOUND: no such voucher; STORE_UNAVAILABLE: Redis
 * or Postgres failed, or orders kept landing meanwhile). */
store_status stock_redis_rebuild(conn_set *cs, redisContext *c, int64_t voucher_id);

/* The voucher as Redis holds it (its stock is the admissions' own):
 * STORE_OK, STORE_NOT_FOUND when Redis does not hold it, or
 * STORE_UNAVAILABLE; then rd->kind says whether the node named a
 * redirection (a Redis Cluster's slot that moved or is moving: the
 * caller sends it again there), else RCLUSTER_NONE. */
store_status stock_redis_voucher(redisContext *c, int64_t voucher_id, store_voucher *out,
                                 rcluster_redirect *rd);

/* Drops the voucher's Redis state when it holds an older sale than
 * 'pg_sale' (Postgres's tb_voucher.sale_gen), so that its next buyer
 * rebuilds it from Postgres (lua/stock_retire.lua): for a consumer whose
 * orders Postgres refused as of an older sale. 1 dropped, 0 left as it
 * is, -1 when Redis failed. */
int stock_redis_retire(redisContext *c, int64_t voucher_id, int64_t pg_sale);

#endif
