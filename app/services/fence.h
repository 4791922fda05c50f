/* fence: the sweep of tb_lock_fence, where Postgres keeps the highest
 * fencing token it accepted per lock key. Without it the table keeps one
 * row per user who ever bought. A thread of its own, on a Postgres
 * connection of its own: once per horizon, one pass over the table's
 * keys, a page at a time, deleting the rows whose token is more than two
 * horizons old (store_fence_sweep). Safe only because every order write
 * refuses a token older than one horizon: a stale holder whose row was
 * forgotten is refused by the age of its token. Every instance sweeps;
 * overlapping passes are harmless. */
#ifndef SECKILL_FENCE_H
#define SECKILL_FENCE_H

/* Starts the sweeper for 'horizon_ms' (> 0), over the keys that begin with
 * 'key_prefix' (copied): the rows of the lock whose tokens are clock
 * readings. Other lock services' rows hold counters, which have no age.
 * Returns 0, or -1 (logged here: a start function logs its own failure). */
int fence_start(long horizon_ms, const char *key_prefix);

/* Stops it, within one page of the sweep. Idempotent. */
void fence_stop(void);

#endif
