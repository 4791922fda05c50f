/* bgthread: the one lifecycle of every background thread: started under a
 * name, asked to stop, woken, joined; its sleeps end at once when it is
 * asked to stop.
 *
 * A bgthread is an object of the module that owns the thread, set to
 * BGTHREAD_INIT. It is in one state at a time, and every change is one
 * checked move here (a move that is not allowed stops the process with a
 * message):
 *
 *   IDLE --start--> RUNNING --stop--> STOPPING --joined--> STOPPED
 *                      ^                                      |
 *                      '----------------start-----------------'
 *
 * A start that fails leaves it where it was. Ownership: the owner keeps
 * the object for as long as the thread may run; the thread function's
 * 'arg' stays the owner's (or the thread's, if the owner hands it over).
 * Threading: the owner serialises its starts (never two at once, never a
 * start while the thread runs); a stop may come from any thread but the
 * bgthread's own, at any time, also during another stop (it then waits
 * for the join). bgthread_sleep and bgthread_stopping are the thread's own.
 *
 * A thread that blocks elsewhere than in bgthread_sleep (a poll on a
 * socket, a condition variable of its own) is given a wake function, which
 * bgthread_stop runs after the state became STOPPING and before the join:
 * it writes the thread's eventfd, or signals its condition variable under
 * its mutex, so that the thread sees bgthread_stopping() at once. A thread
 * blocked in a network call with a timeout of its own sees it when the
 * call returns. */
#ifndef SECKILL_BGTHREAD_H
#define SECKILL_BGTHREAD_H

#include <pthread.h>

typedef enum bgthread_state {
    BGTHREAD_IDLE = 1,        /* never started */
    BGTHREAD_RUNNING,         /* started, no stop asked */
    BGTHREAD_STOPPING,        /* asked to stop, not yet joined */
    BGTHREAD_STOPPED          /* joined; may be started again */
} bgthread_state;

typedef struct bgthread bgthread;

/* The thread's body: returns once bgthread_stopping(self) (or a sleep)
 * says so. */
typedef void (*bgthread_fn)(bgthread *self, void *arg);

/* Wakes the thread from where it blocks (see above). Must not block long,
 * nor call back into this bgthread. */
typedef void (*bgthread_wake_fn)(void *arg);

struct bgthread {
    /* bgthread.c's own: read through the functions below. */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* on CLOCK_MONOTONIC, made by the first start */
    int cv_made;
    _Atomic int state;        /* bgthread_state; changed under mu */
    pthread_t thread;
    char name[16];
    bgthread_fn fn;
    bgthread_wake_fn wake;
    void *arg;
};

#define BGTHREAD_INIT { .mu = PTHREAD_MUTEX_INITIALIZER, .state = BGTHREAD_IDLE }

/* Starts fn(t, arg) on a new thread named 'name' (at most 15 bytes:
 * top -H, /proc/<pid>/task/<tid>/comm); 'wake' (may be NULL) as above,
 * called with 'arg'. From IDLE or STOPPED. Returns 0, or -1 when no
 * thread could be made (nothing logged: the caller says what did not
 * start). */
int bgthread_start(bgthread *t, const char *name, bgthread_fn fn, void *arg,
                   bgthread_wake_fn wake);

/* bgthread_start, and when no thread could be made the error line
 * "cannot start the <what> thread". 0 or -1. */
int bgthread_start_logged(bgthread *t, const char *name, bgthread_fn fn, void *arg,
                          bgthread_wake_fn wake, const char *what);

/* Asks the thread to stop (RUNNING -> STOPPING), wakes it (its sleep, and
 * the wake function), joins it (-> STOPPED). Returns once it is joined,
 * also when another thread is stopping it. Nothing to do when it never
 * started or is stopped already. */
void bgthread_stop(bgthread *t);

/* The thread's own: sleeps up to 'ms' on the monotonic clock (a wall-clock
 * step moves no sleep), or until asked to stop. Returns 1 when it is
 * stopping, 0 when the time is up. */
int bgthread_sleep(bgthread *t, long ms);

/* The thread's own: 1 once it is asked to stop. */
int bgthread_stopping(bgthread *t);

/* The state now, for any thread. */
bgthread_state bgthread_state_get(bgthread *t);

/* 1 from its start until it is joined (RUNNING or STOPPING). */
int bgthread_started(bgthread *t);

#endif
