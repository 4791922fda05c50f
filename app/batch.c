/* batch: leader/follower group commit per voucher. */
#include "batch.h"
#include "config.h"
#include "idw.h"
#include "log.h"
#include "rec.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH_LIMIT 1000      /* BATCH_MAX's upper bound (config.c) */

typedef struct waiter {
    store_order *order;
    batch_unlock *unlock;     /* may be NULL */
    batch_done_fn done;
    void *arg;
    struct waiter *next;
} waiter;

typedef struct queue {
    int64_t voucher_id;       /* 0: free slot */
    waiter *head, *tail;
    int n;
    int leader;               /* a leader is gathering or settling */
    pthread_cond_t full;      /* the leader's wake-up: BATCH_MAX reached */
} queue;

/* The batching state is shared by the workers of this process by design:
 * that is what lets their buyers share a commit. One mutex guards it. */
#define NQUEUES 32
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static queue queues[NQUEUES];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    for (int i = 0; i < NQUEUES; i++)
        pthread_cond_init(&queues[i].full, NULL);
}

/* The voucher's queue, or NULL when every slot is busy with other vouchers. */
static queue *queue_of(int64_t voucher_id)
{
    queue *free_slot = NULL;

    for (int i = 0; i < NQUEUES; i++) {
        if (queues[i].voucher_id == voucher_id)
            return &queues[i];
        if (free_slot == NULL && queues[i].n == 0 && !queues[i].leader)
            free_slot = &queues[i];
    }
    if (free_slot != NULL)
        free_slot->voucher_id = voucher_id;
    return free_slot;
}

/* Releases the batch's user locks in one round trip on the leader's
 * connection, after the commit and before anyone is answered. A failure
 * leaves each buyer's completion to retry its own. */
static void unlock_all(conn_set *cs, waiter **batch, int n)
{
    lock_release_item items[BATCH_LIMIT];
    batch_unlock *owner[BATCH_LIMIT];
    redisContext *c;
    int k = 0;

    for (int i = 0; i < n; i++) {
        if (batch[i]->unlock == NULL ||
            (batch[i]->unlock->acquire && batch[i]->unlock->taken != LOCK_OK))
            continue;
        owner[k] = batch[i]->unlock;
        items[k++] = batch[i]->unlock->item;
    }
    if (k == 0 || (c = conn_redis(cs)) == NULL)
        return;
    lock_release_many(c, items, (size_t)k);
    for (int i = 0; i < k; i++) {
        owner[i]->item.st = items[i].st;
        owner[i]->done = 1;
    }
    if (c->err)
        conn_redis_broken(cs);
}

/* Takes the locks the leader was asked to take, and their order ids, for
 * the whole batch in one round trip: every INCR, then every acquire.
 * Returns how many waiters go on to the statement (moved to the front of
 * 'w'); the others are in 'refused' with their result in 'why'. */
static int lock_all(conn_set *cs, waiter **w, int n, waiter **refused, store_status *why,
                    int *nrefused)
{
    lock_acquire_op ops[BATCH_LIMIT];
    idw_op iops[BATCH_LIMIT];
    lock_grant g[BATCH_LIMIT];
    lock_status st[BATCH_LIMIT];
    int idx[BATCH_LIMIT], k = 0, kept = 0;
    int64_t now = (int64_t)time(NULL);
    redisContext *c = NULL;

    for (int i = 0; i < n; i++)
        if (w[i]->unlock != NULL && w[i]->unlock->acquire)
            idx[k++] = i;
    if (k > 0 && (c = conn_redis(cs)) != NULL) {
        for (int j = 0; j < k; j++)
            idw_send(c, g_cfg.id_prefix, now, &iops[j]);
        for (int j = 0; j < k; j++) {
            lock_release_item *it = &w[idx[j]]->unlock->item;
            lock_acquire_send(c, &ops[j], it->key, it->owner, it->lease_ms);
        }
        for (int j = 0; j < k; j++)
            w[idx[j]]->unlock->id_failed =
                idw_recv(c, &iops[j], &w[idx[j]]->order->order_id) != IDW_OK;
        lock_acquire_recv_many(c, ops, (size_t)k, g, st);
        if (c->err)
            conn_redis_broken(cs);
    } else {
        for (int j = 0; j < k; j++)
            st[j] = LOCK_ERR;
    }
    for (int j = 0; j < k; j++) {
        batch_unlock *u = w[idx[j]]->unlock;
        u->taken = st[j];
        if (st[j] == LOCK_OK)
            w[idx[j]]->order->fence_token = g[j].token;
    }
    for (int i = 0; i < n; i++) {
        batch_unlock *u = w[i]->unlock;
        store_status r = STORE_OK;
        if (u != NULL && u->acquire)
            r = u->taken == LOCK_BUSY ? STORE_DUPLICATE
                : u->taken != LOCK_OK || u->id_failed ? STORE_UNAVAILABLE : STORE_OK;
        if (r == STORE_OK) {
            w[kept++] = w[i];
        } else {
            refused[*nrefused] = w[i];
            why[(*nrefused)++] = r;
        }
    }
    return kept;
}

/* Settles up to BATCH_MAX waiters taken from the head of 'q' and answers
 * them (mu held on entry and exit; released while Postgres, Redis and the
 * answers run). */
static void settle(conn_set *cs, queue *q)
{
    waiter *taken[BATCH_LIMIT], *batch[BATCH_LIMIT], *refused[BATCH_LIMIT];
    store_order orders[BATCH_LIMIT];
    store_status results[BATCH_LIMIT], why[BATCH_LIMIT];
    int nt = 0, n = 0, nr = 0;
    PGconn *pg;
    store_status st;

    while (q->head != NULL && nt < g_cfg.batch_max) {
        taken[nt++] = q->head;
        q->head = q->head->next;
        q->n--;
    }
    if (q->head == NULL)
        q->tail = NULL;
    pthread_mutex_unlock(&mu);

    nt = lock_all(cs, taken, nt, refused, why, &nr);
    for (int t = 0; t < nt; t++) {
        waiter *w = taken[t];
        /* The same user twice in one batch means a concurrent request of that
         * user (its lock lapsed): the later one is the duplicate. */
        int dup = 0;
        for (int i = 0; i < n && !dup; i++)
            dup = orders[i].user_id == w->order->user_id;
        if (dup) {
            refused[nr] = w;
            why[nr++] = STORE_DUPLICATE;
            continue;
        }
        batch[n] = w;
        orders[n] = *w->order;
        n++;
    }

    if (n > 0) {
        rec_batch(n);
        pg = conn_pg(cs);
        st = pg == NULL ? STORE_UNAVAILABLE : store_order_batch(pg, orders, (size_t)n, results);
        if (st == STORE_DUPLICATE ||
            (st != STORE_OK && pg != NULL && PQstatus(pg) == CONNECTION_OK)) {
            /* A unique violation (a lock lapsed) or a deadlock fails the whole
             * statement: settle these buyers one by one so each gets its answer. */
            log_warn("batch of %d failed as a whole; settling one by one", n);
            for (int i = 0; i < n; i++)
                results[i] = store_order_create(pg, &orders[i]);
        } else if (st != STORE_OK) {
            for (int i = 0; i < n; i++)
                results[i] = st;
        }
        unlock_all(cs, batch, n);
    }

    for (int i = 0; i < n; i++) {
        batch[i]->done(cs, batch[i]->arg, results[i]);
        free(batch[i]);
    }
    for (int i = 0; i < nr; i++) {
        refused[i]->done(cs, refused[i]->arg, why[i]);
        free(refused[i]);
    }
    pthread_mutex_lock(&mu);
}

static waiter *waiter_new(store_order *o, batch_unlock *u, batch_done_fn done, void *arg)
{
    waiter *me = xcalloc(1, sizeof *me);

    me->order = o;
    me->unlock = u;
    me->done = done;
    me->arg = arg;
    return me;
}

/* Appends 'me' to 'q' (mu held); a full batch wakes its leader. */
static void enqueue(queue *q, waiter *me)
{
    if (q->tail != NULL)
        q->tail->next = me;
    else
        q->head = me;
    q->tail = me;
    if (++q->n >= g_cfg.batch_max)
        pthread_cond_signal(&q->full);
}

int batch_join(store_order *o, batch_unlock *u, batch_done_fn done, void *arg)
{
    waiter *me = waiter_new(o, u, done, arg);
    queue *q;

    pthread_once(&once, init);
    pthread_mutex_lock(&mu);
    for (q = queues; q < queues + NQUEUES; q++)
        if (q->voucher_id == o->voucher_id && q->leader)
            break;
    if (q == queues + NQUEUES) {
        pthread_mutex_unlock(&mu);
        free(me);
        return 0;
    }
    enqueue(q, me);
    pthread_mutex_unlock(&mu);
    return 1;
}

void batch_submit(conn_set *cs, store_order *o, batch_unlock *u, batch_done_fn done, void *arg)
{
    waiter *me = waiter_new(o, u, done, arg);
    queue *q;

    pthread_once(&once, init);
    pthread_mutex_lock(&mu);
    q = queue_of(o->voucher_id);
    if (q == NULL) {                          /* more hot vouchers than slots */
        waiter *one[1] = { me }, *refused[1];
        store_status why = STORE_UNAVAILABLE;
        int nr = 0;
        PGconn *pg;

        pthread_mutex_unlock(&mu);
        if (lock_all(cs, one, 1, refused, &why, &nr) == 1)
            why = (pg = conn_pg(cs)) == NULL ? STORE_UNAVAILABLE : store_order_create(pg, o);
        free(me);
        done(cs, arg, why);                   /* a held lock is released by its owner */
        return;
    }
    enqueue(q, me);
    if (q->leader) {
        pthread_mutex_unlock(&mu);
        return;
    }

    /* Lead: gather for the window, or until the batch is full, settle, and
     * go on while buyers are queued (they were refused a leader of their own). */
    q->leader = 1;
    while (q->head != NULL) {
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += (long)g_cfg.batch_window_us * 1000L;
        deadline.tv_sec += deadline.tv_nsec / 1000000000L;
        deadline.tv_nsec %= 1000000000L;
        while (q->n < g_cfg.batch_max &&
               pthread_cond_timedwait(&q->full, &mu, &deadline) != ETIMEDOUT)
            ;
        settle(cs, q);
    }
    q->leader = 0;
    pthread_mutex_unlock(&mu);
}

typedef struct sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    store_status st;
} sync_wait;

static void sync_done(conn_set *cs, void *arg, store_status st)
{
    sync_wait *w = arg;

    (void)cs;
    pthread_mutex_lock(&w->mu);
    w->st = st;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

store_status batch_settle(conn_set *cs, store_order *o, batch_unlock *u)
{
    sync_wait w = { .done = 0 };

    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    batch_submit(cs, o, u, sync_done, &w);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return w.st;
}
