/* util: small pure helpers shared by every module (parsing, time, memory).
 *
 * A convention of every module, stated here once: a function with
 * something to free or undo has one exit, the label "out:" (goto out),
 * reached by its success and by its failures alike; a status variable set
 * before the label tells them apart. */
#ifndef SECKILL_UTIL_H
#define SECKILL_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Strict positive int64 from a whole string: decimal digits only (no sign,
 * no spaces), value in 1..INT64_MAX. 'len' is the number of bytes to read.
 * Returns 0 and sets *out, or -1. */
int util_parse_id(const char *s, size_t len, int64_t *out);

/* Non-negative int64 with the same strictness (0 allowed). */
int util_parse_u63(const char *s, size_t len, int64_t *out);

/* ISO-8601 date-time -> Unix seconds. Accepts YYYY-MM-DDTHH:MM:SS with an
 * optional fraction and a zone of Z, +HH:MM, +HHMM (no zone means UTC).
 * Returns 0 or -1. */
int util_parse_iso8601(const char *s, int64_t *out);

/* Unix seconds -> "YYYY-MM-DDTHH:MM:SSZ" in 'buf' (at least 21 bytes). */
void util_format_iso8601(int64_t ts, char *buf, size_t n);

/* Wall clock in Unix seconds, and a monotonic clock in microseconds. */
int64_t util_now_s(void);
int64_t util_wall_ms(void);
/* Sleeps 'ms' milliseconds (resumed after a signal). */
void util_sleep_ms(int ms);

int64_t util_mono_us(void);

/* Timed waits. util_deadline: the absolute time 'us' microseconds from now
 * on clock 'clk', for pthread_cond_timedwait on a condition variable that
 * waits on 'clk'. util_cond_init_monotonic: such a variable on
 * CLOCK_MONOTONIC, which no clock step moves (a wait on CLOCK_REALTIME
 * lasts D longer when the wall clock is stepped back by D). 0 or -1. */
void util_deadline(clockid_t clk, int64_t us, struct timespec *out);
int util_cond_init_monotonic(pthread_cond_t *cv);

/* Testing only (TEST_CLOCK_STEP_MS): every CLOCK_REALTIME reading that
 * util_deadline takes is moved 'ms' ahead, as if the wall clock were
 * stepped back by 'ms' right after it was read. 0, the default, in
 * production. Set once before other threads start. */
void util_set_test_clock_step_ms(int64_t ms);

/* Fills 'buf' (37 bytes) with a random RFC 4122 version-4 UUID. */
void util_uuid4(char buf[37]);

/* Compares two NUL-terminated secrets in time independent of where they differ. */
int util_secret_equal(const char *a, const char *b);

/* 1 if 'len' bytes are well-formed UTF-8 (no overlongs, no surrogates). */
int util_utf8_valid(const char *s, size_t len);

/* Names the calling thread (at most 15 bytes: top -H, /proc/<pid>/task/<tid>/comm). */
void util_thread_name(const char *name);

/* Allocation that aborts on failure: our own code never sees NULL. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t m);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

/* A bounded string being built in a caller's buffer 'b' of 'n' bytes: an
 * append that does not fit is cut at the end of the buffer, never runs past
 * it, and the text is NUL-terminated after every append (when n > 0). */
typedef struct util_sbuf {
    char *b;
    size_t n, len;
} util_sbuf;

/* An empty text in 'out' (n bytes, 0 allowed: nothing is ever written). */
util_sbuf util_sbuf_init(char *out, size_t n);
void util_sbuf_mem(util_sbuf *sb, const char *s, size_t k);
void util_sbuf_str(util_sbuf *sb, const char *s);

/* The entries of a comma-separated list, in order, without copying: ""
 * is one empty entry, "a,,b" three, "a," two (the last one empty). */
typedef struct util_list {
    const char *next;        /* NULL: no entry left */
    int last;                /* the entry returned last was the list's last */
} util_list;

void util_list_init(util_list *it, const char *s);
/* The next entry: *s (not NUL-terminated) and *len (0 for an empty one).
 * Returns 1, or 0 when every entry was returned. */
int util_list_next(util_list *it, const char **s, size_t *len);

#endif
