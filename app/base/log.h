/* log: leveled lines on stderr, one write per line so threads do not interleave. */
#ifndef SECKILL_LOG_H
#define SECKILL_LOG_H

#include <stdint.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Set once at start, before any thread runs. */
void log_set_level(enum log_level lvl);
int log_enabled(enum log_level lvl);
int log_parse_level(const char *s, enum log_level *out);

/* 1: one JSON object per line (LOG_FORMAT=json); 0: plain text. */
void log_set_json(int on);

void log_msg(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One line per answered request, at level info. Ids of 0 are left out. */
typedef struct log_access_line {
    const char *method, *path, *instance, *request_id, *error;   /* error may be NULL */
    int status;
    double latency_ms;
    int64_t user_id, voucher_id, order_id;
} log_access_line;

void log_access(const log_access_line *a);

#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...)  do { if (log_enabled(LOG_INFO)) log_msg(LOG_INFO, __VA_ARGS__); } while (0)
#define log_debug(...) do { if (log_enabled(LOG_DEBUG)) log_msg(LOG_DEBUG, __VA_ARGS__); } while (0)

#endif
