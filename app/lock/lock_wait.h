/* lock_wait: waiting for a lock's release message over pub/sub.
 *
 * One subscriber thread per process, started by the first waiter, owns one
 * Redis connection in SUBSCRIBE mode (hiredis contexts are not thread-safe, so no other thread touches
 * it). Waiting threads register under a mutex; the first waiter of a channel
 * makes the thread SUBSCRIBE, the last one to leave makes it UNSUBSCRIBE
 * (reference counting per channel, like Redisson's PublishSubscribe).
 *
 * On an unlock message "0" one waiter of the channel in this process is
 * woken (Redisson's semaphore release); any other payload wakes them all.
 * A wake-up that arrives while the waiter is not blocked is banked and
 * returned by its next lock_wait_wait, so a release between a failed attempt
 * and the wait is never lost.
 *
 * If the connection breaks, waiters keep waiting with their own timeouts
 * (bounded by the holder's TTL), the thread reconnects with back-off and
 * re-subscribes, and every waiter of a re-subscribed channel is woken once,
 * since messages sent meanwhile were lost. */
#ifndef SECKILL_LOCK_WAIT_H
#define SECKILL_LOCK_WAIT_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

typedef struct lock_wait_waiter lock_wait_waiter;

/* Opens the subscriber's connection (see lock_options.connect). */
typedef redisContext *(*lock_wait_connect_fn)(char *err, size_t errlen);
/* 1 when that connection should be opened again (lock_options.stale). */
typedef int (*lock_wait_stale_fn)(const redisContext *c);

/* Lets the subscriber thread run: the first lock_wait_join starts it, and
 * it connects in the background with 'connect'; a connection 'stale' (may
 * be NULL) refuses is re-opened, its channels subscribed again. Before
 * this (and after lock_wait_stop) waiters work on timeouts alone. Returns
 * 0, or -1 (logged). */
int lock_wait_start(lock_wait_connect_fn connect, lock_wait_stale_fn stale);

/* Stops and joins the thread (if it started) and closes its connection.
 * Waiters still registered keep working on timeouts alone; later joins do
 * not start it again. Idempotent. */
void lock_wait_stop(void);

/* 1 while the subscriber thread runs (tests: it starts only on demand). */
int lock_wait_running(void);

/* Registers the calling thread as a waiter on 'channel' and waits up to
 * 'timeout_ms' for the subscription to be confirmed by Redis. Returns the
 * waiter, owned by the caller until lock_wait_leave (never NULL). '*confirmed'
 * is 1 when the subscription is active: every release published after this
 * call returned will wake this waiter. With 0 (subscriber down or slow) the
 * waiter still works and is woken when the subscription comes up. */
lock_wait_waiter *lock_wait_join(const char *channel, long timeout_ms, int *confirmed);

/* Blocks up to 'timeout_ms' for a wake-up. Returns 1 when woken (an unlock
 * message, banked or new, or a re-subscription: retry the lock now), 0 on
 * timeout. '*msg_us' (may be NULL) gets the util_mono_us() time at which
 * the subscriber received the message, or 0 when there was none. */
int lock_wait_wait(lock_wait_waiter *w, long timeout_ms, int64_t *msg_us);

/* Unregisters and frees 'w'; the last waiter of a channel unsubscribes it.
 * 'pass_on' = 1 when the caller leaves without having used its last
 * wake-up (it gave up or failed): the wake-up goes to another waiter of the
 * channel, so a release is never swallowed. A banked, unused wake-up is
 * passed on in any case. */
void lock_wait_leave(lock_wait_waiter *w, int pass_on);

/* Diagnostics (tests, /stats): channels known to this process (subscribed,
 * pending, or being unsubscribed), and process-wide counters. */
int lock_wait_channel_count(void);

typedef struct lock_wait_counters {
    uint64_t messages;     /* unlock messages received on subscribed channels */
    uint64_t wakeups;      /* waiters woken by a message */
    uint64_t reconnects;   /* subscriber connections re-opened after a failure */
} lock_wait_counters;

void lock_wait_counters_get(lock_wait_counters *out);

#endif
