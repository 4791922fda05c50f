/* bgthread: start, sleep, stop and join of a background thread, with one
 * checked state (bgthread.h). */
#include "bgthread.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BIT(st) (1u << (st))

static const char *state_name(int st)
{
    static const char *const names[] = {
        [BGTHREAD_IDLE] = "idle", [BGTHREAD_RUNNING] = "running",
        [BGTHREAD_STOPPING] = "stopping", [BGTHREAD_STOPPED] = "stopped",
    };
    return st >= BGTHREAD_IDLE && st <= BGTHREAD_STOPPED ? names[st] : "not initialised";
}

/* A misuse (a start of a running thread, a thread stopping itself, an
 * object never set to BGTHREAD_INIT): a bug. Stops the process with it. */
static void misuse(const bgthread *t, int st, const char *what)
{
    log_error("bgthread %s: %s while %s", t->name[0] ? t->name : "(unnamed)", what,
              state_name(st));
    abort();
}

/* The one way the state changes: from one of 'from' (a mask of BIT()) to
 * 'to'. t->mu held. */
static void move(bgthread *t, unsigned from, bgthread_state to, const char *what)
{
    int st = atomic_load_explicit(&t->state, memory_order_relaxed);

    if (st < BGTHREAD_IDLE || st > BGTHREAD_STOPPED || !(from & BIT(st)))
        misuse(t, st, what);
    atomic_store_explicit(&t->state, (int)to, memory_order_release);
}

static void *trampoline(void *arg)
{
    bgthread *t = arg;

    util_thread_name(t->name);
    t->fn(t, t->arg);
    return NULL;
}

int bgthread_start(bgthread *t, const char *name, bgthread_fn fn, void *arg,
                   bgthread_wake_fn wake)
{
    int rc = -1, st;

    pthread_mutex_lock(&t->mu);
    st = atomic_load_explicit(&t->state, memory_order_relaxed);
    if (st != BGTHREAD_IDLE && st != BGTHREAD_STOPPED)
        misuse(t, st, "start");
    snprintf(t->name, sizeof t->name, "%s", name);
    if (!t->cv_made) {
        if (util_cond_init_monotonic(&t->cv) != 0)
            goto out;
        t->cv_made = 1;
    }
    t->fn = fn;
    t->arg = arg;
    t->wake = wake;
    /* The state turns RUNNING before the thread runs: its first look at
     * bgthread_stopping must not see the state of its last run. A stop
     * waits for mu, so it never sees RUNNING without a thread. */
    move(t, BIT(BGTHREAD_IDLE) | BIT(BGTHREAD_STOPPED), BGTHREAD_RUNNING, "start");
    errno = pthread_create(&t->thread, NULL, trampoline, t);
    if (errno != 0) {
        move(t, BIT(BGTHREAD_RUNNING), (bgthread_state)st, "a failed start");   /* where it was */
        goto out;
    }
    rc = 0;
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

int bgthread_start_logged(bgthread *t, const char *name, bgthread_fn fn, void *arg,
                          bgthread_wake_fn wake, const char *what)
{
    if (bgthread_start(t, name, fn, arg, wake) == 0)
        return 0;
    log_error("cannot start the %s thread", what);
    return -1;
}

void bgthread_stop(bgthread *t)
{
    int st, rc;

    pthread_mutex_lock(&t->mu);
    st = atomic_load_explicit(&t->state, memory_order_relaxed);
    if (st == BGTHREAD_IDLE || st == BGTHREAD_STOPPED) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    if (pthread_equal(pthread_self(), t->thread))
        misuse(t, st, "a stop from the thread itself");
    if (st == BGTHREAD_STOPPING) {
        /* Another thread stops it: returns once that one joined it. */
        while (atomic_load_explicit(&t->state, memory_order_relaxed) == BGTHREAD_STOPPING)
            pthread_cond_wait(&t->cv, &t->mu);
        pthread_mutex_unlock(&t->mu);
        return;
    }
    move(t, BIT(BGTHREAD_RUNNING), BGTHREAD_STOPPING, "stop");
    pthread_cond_broadcast(&t->cv);          /* its bgthread_sleep */
    pthread_mutex_unlock(&t->mu);
    if (t->wake != NULL)
        t->wake(t->arg);                     /* where else it blocks */
    rc = pthread_join(t->thread, NULL);
    pthread_mutex_lock(&t->mu);
    if (rc != 0)
        misuse(t, atomic_load_explicit(&t->state, memory_order_relaxed), strerror(rc));
    move(t, BIT(BGTHREAD_STOPPING), BGTHREAD_STOPPED, "joined");
    pthread_cond_broadcast(&t->cv);          /* other stops waiting for the join */
    pthread_mutex_unlock(&t->mu);
}

int bgthread_sleep(bgthread *t, long ms)
{
    struct timespec until;
    int stopping;

    util_deadline(CLOCK_MONOTONIC, ms > 0 ? (int64_t)ms * 1000 : 0, &until);
    pthread_mutex_lock(&t->mu);
    while (atomic_load_explicit(&t->state, memory_order_relaxed) == BGTHREAD_RUNNING && ms > 0 &&
           pthread_cond_timedwait(&t->cv, &t->mu, &until) != ETIMEDOUT)
        ;
    stopping = atomic_load_explicit(&t->state, memory_order_relaxed) != BGTHREAD_RUNNING;
    pthread_mutex_unlock(&t->mu);
    return stopping;
}

int bgthread_stopping(bgthread *t)
{
    return atomic_load_explicit(&t->state, memory_order_acquire) != BGTHREAD_RUNNING;
}

bgthread_state bgthread_state_get(bgthread *t)
{
    return (bgthread_state)atomic_load_explicit(&t->state, memory_order_acquire);
}

int bgthread_started(bgthread *t)
{
    int st = atomic_load_explicit(&t->state, memory_order_acquire);

    return st == BGTHREAD_RUNNING || st == BGTHREAD_STOPPING;
}
