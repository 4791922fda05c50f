/* unit_bgthread: the lifecycle of a background thread (bgthread.h): its
 * states, its name, a sleep that a stop ends at once, the wake function
 * of a thread that blocks elsewhere, a stop that waits for another's join,
 * a start after a stop. No I/O. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "bgthread.h"
#include "t.h"
#include "util.h"

static int64_t ms_since(int64_t t0_us)
{
    return (util_mono_us() - t0_us) / 1000;
}

/* Sleeps 10 s at a time until stopped; counts its rounds and its name. */
typedef struct sleeper {
    _Atomic int rounds;
    _Atomic int short_sleeps;         /* 20 ms sleeps that ran out, not stopped */
    char name[16];
} sleeper;

static void sleeper_main(bgthread *self, void *arg)
{
    sleeper *s = arg;

    pthread_getname_np(pthread_self(), s->name, sizeof s->name);
    if (!bgthread_sleep(self, 20))
        atomic_fetch_add(&s->short_sleeps, 1);
    while (!bgthread_sleep(self, 10000))
        atomic_fetch_add(&s->rounds, 1);
}

static void test_states_name_and_a_prompt_stop(void)
{
    static bgthread t = BGTHREAD_INIT;
    sleeper s = { 0 };
    int64_t t0;

    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_IDLE);
    T_EQ_I64(bgthread_started(&t), 0);
    bgthread_stop(&t);                                 /* never started: nothing to do */
    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_IDLE);
    if (!T_EQ_I64(bgthread_start(&t, "sk-unit", sleeper_main, &s, NULL), 0))
        return;
    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_RUNNING);
    T_EQ_I64(bgthread_started(&t), 1);
    t0 = util_mono_us();
    while (atomic_load(&s.short_sleeps) == 0 && ms_since(t0) < 5000)
        usleep(1000);
    T_EQ_I64(atomic_load(&s.short_sleeps), 1);         /* a sleep runs its time out */
    t0 = util_mono_us();
    bgthread_stop(&t);
    T_ASSERT(ms_since(t0) < 2000);                     /* not the 10 s sleep */
    T_EQ_I64(atomic_load(&s.rounds), 0);
    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_STOPPED);
    T_EQ_I64(bgthread_started(&t), 0);
    T_EQ_STR(s.name, "sk-unit");
    bgthread_stop(&t);                                 /* idempotent */
    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_STOPPED);

    /* Started again after a stop: a fresh run, stopping again at once. */
    memset(&s, 0, sizeof s);
    if (!T_EQ_I64(bgthread_start(&t, "sk-unit-2", sleeper_main, &s, NULL), 0))
        return;
    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_RUNNING);
    t0 = util_mono_us();
    bgthread_stop(&t);
    T_ASSERT(ms_since(t0) < 2000);
    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_STOPPED);
    T_EQ_STR(s.name, "sk-unit-2");
}

/* Blocks in poll() on an eventfd: only the wake function gets it out. */
typedef struct poller {
    int efd;
    _Atomic int wakes;
    _Atomic int polls;
} poller;

static void poller_main(bgthread *self, void *arg)
{
    poller *p = arg;

    while (!bgthread_stopping(self)) {
        struct pollfd pfd = { .fd = p->efd, .events = POLLIN };
        uint64_t v;
        atomic_fetch_add(&p->polls, 1);
        if (poll(&pfd, 1, 60000) > 0 && read(p->efd, &v, sizeof v) < 0 && errno != EAGAIN)
            break;
    }
}

static void poller_wake(void *arg)
{
    poller *p = arg;
    uint64_t one = 1;

    atomic_fetch_add(&p->wakes, 1);
    if (write(p->efd, &one, sizeof one) < 0)
        return;
}

static void test_the_wake_function_reaches_a_thread_blocked_elsewhere(void)
{
    static bgthread t = BGTHREAD_INIT;
    poller p = { .efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) };
    int64_t t0;

    if (!T_ASSERT(p.efd >= 0))
        return;
    if (!T_EQ_I64(bgthread_start(&t, "sk-unit-poll", poller_main, &p, poller_wake), 0))
        goto out;
    t0 = util_mono_us();
    while (atomic_load(&p.polls) == 0 && ms_since(t0) < 5000)
        usleep(1000);
    t0 = util_mono_us();
    bgthread_stop(&t);
    T_ASSERT(ms_since(t0) < 2000);                     /* not the 60 s poll */
    T_EQ_I64(atomic_load(&p.wakes), 1);
    T_EQ_I64(bgthread_state_get(&t), BGTHREAD_STOPPED);
out:
    close(p.efd);
}

/* Two threads stop the same bgthread: both return after the join. */
static bgthread shared = BGTHREAD_INIT;

static void slow_main(bgthread *self, void *arg)
{
    (void)arg;
    while (!bgthread_sleep(self, 10000))
        ;
    usleep(200 * 1000);                                /* a slow way out */
}

static void *second_stopper(void *arg)
{
    _Atomic int *state_after = arg;

    bgthread_stop(&shared);
    atomic_store(state_after, (int)bgthread_state_get(&shared));
    return NULL;
}

static void test_a_second_stop_waits_for_the_join(void)
{
    _Atomic int state_after = 0;
    pthread_t other;

    if (!T_EQ_I64(bgthread_start(&shared, "sk-unit-slow", slow_main, NULL, NULL), 0))
        return;
    if (!T_ASSERT(pthread_create(&other, NULL, second_stopper, &state_after) == 0)) {
        bgthread_stop(&shared);
        return;
    }
    bgthread_stop(&shared);
    pthread_join(other, NULL);
    T_EQ_I64(atomic_load(&state_after), BGTHREAD_STOPPED);
    T_EQ_I64(bgthread_state_get(&shared), BGTHREAD_STOPPED);
}

/* A sleep of 0 (or less) only says whether the thread is stopping. */
static void zero_main(bgthread *self, void *arg)
{
    _Atomic int *answers = arg;

    atomic_store(answers, bgthread_sleep(self, 0) * 10 + bgthread_sleep(self, -5));
    while (!bgthread_sleep(self, 10000))
        ;
}

static void test_a_zero_sleep_does_not_wait(void)
{
    static bgthread t = BGTHREAD_INIT;
    _Atomic int answers = -1;
    int64_t t0 = util_mono_us();

    if (!T_EQ_I64(bgthread_start(&t, "sk-unit-zero", zero_main, &answers, NULL), 0))
        return;
    while (atomic_load(&answers) == -1 && ms_since(t0) < 5000)
        usleep(1000);
    T_EQ_I64(atomic_load(&answers), 0);
    T_ASSERT(ms_since(t0) < 2000);
    bgthread_stop(&t);
}

int main(void)
{
    T_RUN(test_states_name_and_a_prompt_stop);
    T_RUN(test_the_wake_function_reaches_a_thread_blocked_elsewhere);
    T_RUN(test_a_second_stop_waits_for_the_join);
    T_RUN(test_a_zero_sleep_does_not_wait);
    return t_done();
}
