/* voucher_cache: the process's cache of vouchers and their sold-out flags, so that a
 * request for a sold-out or unknown-window voucher touches no database (and
 * is refused on the event thread, see http.h).
 *
 * Entries live at most VOUCHER_CACHE_TTL_MS and all of them are dropped when the
 * process-wide generation moves (a reset on any instance, see broadcast.h). The
 * cache never decides a sale: a "not sold out" entry still goes to the
 * transaction; a sold-out flag is only set from the database's answer, and
 * stock only grows again through a reset, which clears it. */
#ifndef SECKILL_VOUCHER_CACHE_H
#define SECKILL_VOUCHER_CACHE_H

#include <stdint.h>

#include "store_voucher.h"

#define VOUCHER_CACHE_TTL_MS 1000

/* 1 and fills 'out' on a fresh hit; 0 on a miss. */
int voucher_cache_get(int64_t voucher_id, store_voucher *out);

/* The generation now: read it before asking Postgres, and pass it to the
 * calls below, which ignore an answer older than a reset. */
uint64_t voucher_cache_generation(void);

/* Remembers 'v', as read from Postgres since generation 'gen'. */
void voucher_cache_put(const store_voucher *v, uint64_t gen);

/* A transaction begun in generation 'gen' found no stock: later requests
 * are refused from memory. */
void voucher_cache_mark_sold_out(int64_t voucher_id, uint64_t gen);

/* A user's order for a voucher is known to exist (committed, or found by
 * the database): a later attempt of that user is refused from memory, with
 * no lock and no query - a crowd of repeat clicks costs an event thread
 * only. Only a reset deletes orders, and it clears this too. Bounded: a
 * pair lives VOUCHER_CACHE_TTL_MS like a voucher (a reset whose broadcast went
 * astray cannot refuse a buyer for longer) and may be overwritten sooner;
 * the database then answers again. */
void voucher_cache_mark_ordered(int64_t voucher_id, int64_t user_id, uint64_t gen);
int voucher_cache_ordered(int64_t voucher_id, int64_t user_id);

/* Drops every entry (lazily, at the next lookup). */
void voucher_cache_invalidate_all(void);

#endif
