/* payload: the admin API's request bodies, parsed and validated without any
 * I/O (so the fuzzer can drive them). */
#ifndef SECKILL_PAYLOAD_H
#define SECKILL_PAYLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "api_err.h"

#define PAYLOAD_TITLE_MAX 200
/* The largest stock: 15 digits, what a JSON answer prints exactly. */
#define PAYLOAD_COUNT_MAX 999999999999999LL
/* Dead letters one replay moves at most (one Redis script call: it holds
 * Redis for its length), and when the body names no number. */
#define PAYLOAD_REPLAY_MAX 10000
#define PAYLOAD_REPLAY_DEFAULT 1000

typedef struct payload_voucher {
    char title[PAYLOAD_TITLE_MAX + 1];   /* create only */
    int64_t stock;                       /* 0 .. PAYLOAD_COUNT_MAX */
    int64_t begin_time;                  /* Unix seconds; -1 when absent (reset) */
    int64_t end_time;
} payload_voucher;

/* POST /admin/vouchers: {"title","stock","beginTime","endTime"}, all
 * required. Returns API_OK, API_INVALID_JSON (not JSON: bad syntax, bytes
 * after the value, NUL, invalid UTF-8) or API_INVALID_FIELD with a static
 * reason in '*why'. 'body' need not be NUL-terminated; NULL means empty. */
api_err payload_voucher_create(const char *body, size_t len, payload_voucher *out,
                               const char **why);

/* POST /admin/vouchers/{id}/reset: {"stock"} required, times optional. */
api_err payload_voucher_reset(const char *body, size_t len, payload_voucher *out,
                              const char **why);

/* POST /admin/dead-letters/replay: no body, or {"max"} optional, a whole
 * number 1..PAYLOAD_REPLAY_MAX (default PAYLOAD_REPLAY_DEFAULT) in '*max'. */
api_err payload_replay(const char *body, size_t len, int64_t *max, const char **why);

#endif
