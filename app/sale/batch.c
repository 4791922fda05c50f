/* batch: group commit of buyers, the "batched" stock strategy (stock.h).
 *
 * Buyers of the same voucher queue here; the first becomes the leader,
 * gathers the others for at most BATCH_WINDOW_US or BATCH_MAX buyers, takes
 * the user locks and order ids that its buyers left to it (all in one
 * round trip), and settles them all in one statement (store_order_batch)
 * on its own connection: one commit, one WAL flush, one hold of the hot row
 * for the whole batch. It releases the batch's locks in one more round
 * trip, then gives each buyer its own outcome. Pipelined (BATCH_PIPELINE),
 * the next batch gathers and takes its locks while the one before it is
 * in Postgres (lead_pipelined). No worker waits for a batch
 * but its leader: a buyer's request stays suspended in libmicrohttpd and
 * is answered from the leader, so a batch can hold more buyers than there
 * are workers. */
#include "stock.h"
#include "config.h"
#include "log.h"
#include "counters.h"
#include "store_batch.h"
#include "store_order.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct waiter {
    stock_buyer *b;
    stock_done_fn done;
    void *arg;
    struct waiter *next;
} waiter;

/* A leader's working space for one batch, sized by BATCH_MAX: allocated
 * once per queue at its first leader, used only by the queue's leader. */
typedef struct scratch {
    waiter **taken, **batch, **refused;
    store_order *orders;
    store_status *results, *why;
    user_lock_hold **holds;
    user_lock_id *ids;
    int *idx;
    int nt, n, nr;            /* taken from the queue, in the batch, refused */
    int nsend;                /* of the batch, the first nsend went to the statement */
    store_batch_call call;    /* the statement out, when nsend > 0 */
    PGconn *pg;               /* the connection it went to: the leader's */
} scratch;

typedef struct queue {
    int64_t voucher_id;       /* 0: free slot */
    waiter *head, *tail;
    int n;
    int leader;               /* a leader is gathering or settling */
    pthread_cond_t full;      /* the leader's wake-up: BATCH_MAX reached */
    scratch *s[2];            /* the leader's (two when pipelined); NULL until used */
} queue;

/* The batching state is shared by the workers of this process by design:
 * that is what lets their buyers share a commit. One mutex guards it. */
#define NQUEUES 32
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static queue queues[NQUEUES];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The gathering window is a timed wait: on the monotonic clock, so that a
 * step of the wall clock (NTP, an operator) cannot hold a batch. */
static void init(void)
{
    for (int i = 0; i < NQUEUES; i++)
        if (util_cond_init_monotonic(&queues[i].full) != 0)
            abort();
}

static scratch *scratch_new(int n)
{
    scratch *s = xcalloc(1, sizeof *s);
    size_t m = (size_t)n;

    s->taken = xmalloc(sizeof *s->taken * m);
    s->batch = xmalloc(sizeof *s->batch * m);
    s->refused = xmalloc(sizeof *s->refused * m);
    s->orders = xmalloc(sizeof *s->orders * m);
    s->results = xmalloc(sizeof *s->results * m);
    s->why = xmalloc(sizeof *s->why * m);
    s->holds = xmalloc(sizeof *s->holds * m);
    s->ids = xmalloc(sizeof *s->ids * m);
    s->idx = xmalloc(sizeof *s->idx * m);
    return s;
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

/* Takes the locks the leader was asked to take, and their order ids, for
 * the whole batch in one round trip. Returns how many waiters go on to the
 * statement (moved to the front of 'w'); the others are appended to
 * s->refused with their result in s->why. */
static int take_locks(conn_set *cs, scratch *s, waiter **w, int n, int *nrefused)
{
    int k = 0, kept = 0;

    for (int i = 0; i < n; i++) {
        if (!w[i]->b->lock_pending)
            continue;
        s->idx[k] = i;
        s->holds[k] = w[i]->b->hold;
        memset(&s->ids[k], 0, sizeof s->ids[k]);
        k++;
    }
    user_lock_acquire_many(cs, s->holds, s->ids, (size_t)k);
    for (int j = 0; j < k; j++) {
        stock_buyer *b = w[s->idx[j]]->b;
        b->id = s->ids[j];
        if (b->id.taken && b->id.st == ORDER_ID_OK)
            b->order.order_id = b->id.value;
        if (b->hold->taken == LOCK_OK)
            b->order.fence_token = b->hold->token;
    }
    for (int i = 0; i < n; i++) {
        stock_buyer *b = w[i]->b;
        store_status r = STORE_OK;
        if (b->lock_pending)
            r = b->hold->taken == LOCK_BUSY ? STORE_DUPLICATE
                : b->hold->taken != LOCK_OK || !b->id.taken || b->id.st != ORDER_ID_OK
                    ? STORE_UNAVAILABLE
                    : STORE_OK;
        if (r == STORE_OK) {
            w[kept++] = w[i];
        } else {
            s->refused[*nrefused] = w[i];
            s->why[(*nrefused)++] = r;
        }
    }
    return kept;
}

/* Takes up to BATCH_MAX waiters from the head of 'q' into 's' (mu held). */
static void gather(queue *q, scratch *s)
{
    s->nt = s->n = s->nr = 0;
    while (q->head != NULL && s->nt < g_cfg.batch_max) {
        s->taken[s->nt++] = q->head;
        q->head = q->head->next;
        q->n--;
    }
    if (q->head == NULL)
        q->tail = NULL;
}

/* Readies the gathered batch for its statement (mu not held): refuses the
 * buyers past their deadline, takes the locks and ids left to the leader,
 * refuses a second buyer of the same user. */
static void prepare(conn_set *cs, scratch *s)
{
    int kept = 0, nlocked;

    /* Buyers who waited here past their deadline are not ordered (their
     * locks, not taken yet, are not taken). */
    for (int t = 0; t < s->nt; t++) {
        if (stock_past_deadline(s->taken[t]->b)) {
            s->refused[s->nr] = s->taken[t];
            s->why[s->nr++] = STORE_UNAVAILABLE;
        } else {
            s->taken[kept++] = s->taken[t];
        }
    }
    nlocked = take_locks(cs, s, s->taken, kept, &s->nr);
    for (int t = 0; t < nlocked; t++) {
        waiter *w = s->taken[t];
        /* The same user twice in one batch means a concurrent request of that
         * user (its lock lapsed): the later one is the duplicate. */
        int dup = 0;
        for (int i = 0; i < s->n && !dup; i++)
            dup = s->orders[i].user_id == w->b->order.user_id;
        if (dup) {
            s->refused[s->nr] = w;
            s->why[s->nr++] = STORE_DUPLICATE;
            continue;
        }
        s->batch[s->n] = w;
        s->orders[s->n] = w->b->order;
        s->n++;
    }
}

/* Sends the batch's statement; its outcome is read by read_batch. A
 * buyer whose deadline passed since its lock was taken (a pipelined batch
 * waits for the one before it) is left out and answered 503: moved to the
 * end of the batch, so that its lock is released with the others. */
static void send_batch(conn_set *cs, scratch *s)
{
    int late = 0;

    s->nsend = 0;
    for (int i = 0; i < s->n; i++) {
        waiter *w = s->batch[i];
        if (stock_past_deadline(w->b)) {
            s->taken[late++] = w;
            continue;
        }
        s->batch[s->nsend] = w;
        s->orders[s->nsend++] = w->b->order;
    }
    for (int j = 0; j < late; j++) {
        s->batch[s->nsend + j] = s->taken[j];
        s->results[s->nsend + j] = STORE_UNAVAILABLE;
    }
    if (s->nsend == 0)
        return;
    counters_batch(s->nsend);
    s->pg = conn_pg(cs);
    s->call.sent = -1;
    if (s->pg != NULL)
        store_order_batch_send(s->pg, s->orders, (size_t)s->nsend, g_cfg.batch_early_lock_release,
                               &s->call);
}

/* Reads the outcome of the batch's statement into s->results. */
static void read_batch(conn_set *cs, scratch *s)
{
    PGconn *pg = s->pg;
    int n = s->nsend;
    store_status st;

    if (n == 0)
        return;
    /* Nothing on this thread touches Postgres between the send and here;
     * were the connection replaced meanwhile, the old one is freed. */
    if (pg != NULL && pg != cs->pg) {
        log_error("batch: the connection of a statement in flight was replaced");
        pg = NULL;
    }
    st = pg == NULL ? STORE_UNAVAILABLE : store_order_batch_recv(pg, &s->call, (size_t)n, s->results);
    if (st == STORE_DUPLICATE || (st != STORE_OK && pg != NULL && PQstatus(pg) == CONNECTION_OK)) {
        /* A unique violation (a lock lapsed) or a deadlock fails the whole
         * statement: settle these buyers one by one so each gets its
         * answer, those whose deadline has not passed meanwhile. */
        log_warn("batch of %d failed as a whole; settling one by one", n);
        for (int i = 0; i < n; i++)
            s->results[i] = stock_past_deadline(s->batch[i]->b)
                                ? STORE_UNAVAILABLE
                                : store_order_create(pg, &s->orders[i]);
    } else if (st != STORE_OK) {
        for (int i = 0; i < n; i++)
            s->results[i] = st;
    }
}

/* PG_HA: the batch's orders are answered as done only once a synchronous
 * standby has their commit (store_ha_confirm, once for the batch, on this
 * thread's second session: the first may carry the next batch already). */
static void confirm_batch(conn_set *cs, scratch *s)
{
    store_status st;
    PGconn *pg;
    int any = 0;

    for (int i = 0; i < s->n && !any; i++)
        any = s->results[i] == STORE_OK;
    if (!g_cfg.pg_ha || !any)
        return;
    pg = conn_pg_aside(cs);
    st = pg == NULL ? STORE_UNAVAILABLE : store_ha_confirm(pg);
    for (int i = 0; st != STORE_OK && i < s->n; i++)
        if (s->results[i] == STORE_OK)
            s->results[i] = STORE_UNAVAILABLE;
}

/* Releases the batch's user locks in one round trip, after its commit and
 * before anyone is answered (a failed release is retried by its owner),
 * then answers every buyer of the batch and every one refused. */
static void release_and_answer(conn_set *cs, scratch *s)
{
    if (s->n > 0) {
        for (int i = 0; i < s->n; i++)
            s->holds[i] = s->batch[i]->b->hold;
        user_lock_release_many(cs, s->holds, (size_t)s->n);
        confirm_batch(cs, s);
    }
    for (int i = 0; i < s->n; i++) {
        s->batch[i]->done(cs, s->batch[i]->arg, s->results[i]);
        free(s->batch[i]);
    }
    for (int i = 0; i < s->nr; i++) {
        s->refused[i]->done(cs, s->refused[i]->arg, s->why[i]);
        free(s->refused[i]);
    }
    s->n = s->nr = 0;
}

/* Settles up to BATCH_MAX waiters taken from the head of 'q' and answers
 * them (mu held on entry and exit; released while Postgres, Redis and the
 * answers run). */
static void settle(conn_set *cs, queue *q, scratch *s)
{
    gather(q, s);
    pthread_mutex_unlock(&mu);
    prepare(cs, s);
    send_batch(cs, s);
    read_batch(cs, s);
    release_and_answer(cs, s);
    pthread_mutex_lock(&mu);
}

/* Waits for the gathering window, or until the batch is full (mu held). */
static void gather_wait(queue *q)
{
    struct timespec deadline;

    util_deadline(CLOCK_MONOTONIC, g_cfg.batch_window_us, &deadline);
    while (q->n < g_cfg.batch_max && pthread_cond_timedwait(&q->full, &mu, &deadline) != ETIMEDOUT)
        ;
}

/* Pipelined, with the batch 'busy' out: gathers for the window, or until
 * the batch is full, or, when busy and the batch sent before it ('before'
 * buyers) are both small (GATHER_SMALL buyers or fewer), until busy's
 * outcome is in, whichever comes first (mu held on entry and exit). Small
 * batches in a row mean few buyers in flight: the next ones are mostly
 * those waiting for busy's answers, so once its outcome is in, the rest of
 * the window only kept the machine idle (make bench's idle table). A crowd
 * makes larger batches, and for it the window stays whole: cutting it
 * makes smaller batches, which cost more CPU per order than a busy machine
 * has; one small batch in a crowd is not enough to cut it. */
#define GATHER_SLICE_US 250
#define GATHER_SMALL 4
static void gather_wait_or_outcome(queue *q, scratch *busy, int before)
{
    int64_t end;

    if (busy == NULL || busy->nsend == 0 || busy->nsend > GATHER_SMALL || before > GATHER_SMALL) {
        gather_wait(q);
        return;
    }
    end = util_mono_us() + g_cfg.batch_window_us;
    for (;;) {
        int64_t left = end - util_mono_us();
        int ready;

        if (q->n >= g_cfg.batch_max || left <= 0)
            return;
        pthread_mutex_unlock(&mu);
        ready = store_order_batch_wait(busy->pg, &busy->call,
                                       left < GATHER_SLICE_US ? left : GATHER_SLICE_US);
        pthread_mutex_lock(&mu);
        if (ready)
            return;
    }
}

/* While the batch 'busy' runs and nobody is queued, watches both in
 * slices: returns once a result or a buyer has come, or the statement's
 * bound has passed (mu held on entry and exit). */
static void await_outcome_or_buyers(queue *q, scratch *busy)
{
    int64_t slice = g_cfg.batch_window_us < 1000 ? g_cfg.batch_window_us : 1000;
    int ready = busy->nsend == 0;

    while (q->head == NULL && !ready) {
        pthread_mutex_unlock(&mu);
        ready = store_order_batch_wait(busy->pg, &busy->call, slice > 100 ? slice : 100);
        pthread_mutex_lock(&mu);
    }
}

/* The leader's loop with batches pipelined (BATCH_PIPELINE): the next
 * batch gathers and takes its locks while the one before is in Postgres,
 * so that neither waits for the other's round trips. Statements still
 * commit one after another, and nobody is answered before their commit
 * (mu held on entry and exit). */
static void lead_pipelined(conn_set *cs, queue *q)
{
    scratch *busy = NULL;          /* the batch whose statement is out */
    int before = 0;                /* the buyers of the batch sent before busy */
    int next = 0;

    while (q->head != NULL || busy != NULL) {
        scratch *s = NULL;

        if (busy != NULL)
            await_outcome_or_buyers(q, busy);
        if (q->head != NULL) {
            gather_wait_or_outcome(q, busy, before);
            s = q->s[next];
            next ^= 1;
            gather(q, s);
        }
        pthread_mutex_unlock(&mu);
        if (s != NULL)
            prepare(cs, s);
        if (busy != NULL)
            read_batch(cs, busy);
        if (s != NULL)
            send_batch(cs, s);
        if (busy != NULL)
            release_and_answer(cs, busy);
        if (s != NULL)
            before = busy != NULL ? busy->nsend : 0;
        busy = s;
        if (s != NULL && s->nsend == 0) {  /* nobody went to Postgres: answer now */
            release_and_answer(cs, s);
            busy = NULL;
        }
        pthread_mutex_lock(&mu);
    }
}

static waiter *waiter_new(stock_buyer *b, stock_done_fn done, void *arg)
{
    waiter *me = xcalloc(1, sizeof *me);

    me->b = b;
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

/* More hot vouchers than queues: this buyer alone, on this worker. A held
 * lock is released by its owner. */
static void settle_alone(conn_set *cs, waiter *me)
{
    waiter *one[1] = { me }, *refused[1];
    store_status why = STORE_UNAVAILABLE;
    user_lock_hold *holds[1];
    user_lock_id ids[1];
    int idx[1], nr = 0;
    scratch s = { .refused = refused, .why = &why, .holds = holds, .ids = ids, .idx = idx };
    stock_done_fn done = me->done;
    void *arg = me->arg;
    PGconn *pg;

    if (!stock_past_deadline(me->b) && take_locks(cs, &s, one, 1, &nr) == 1)
        why = (pg = conn_pg(cs)) == NULL ? STORE_UNAVAILABLE : store_order_create(pg, &me->b->order);
    free(me);
    done(cs, arg, why);
}

/* Queues 'b' and returns; 'done' is called once with its outcome, after
 * the commit and after its lock was released with the rest of the batch.
 * The first buyer of an idle queue becomes its leader: its worker gathers
 * and settles batches until the queue is empty, so it returns only then. */
static void submit(conn_set *cs, stock_buyer *b, stock_done_fn done, void *arg)
{
    waiter *me = waiter_new(b, done, arg);
    queue *q;

    pthread_once(&once, init);
    pthread_mutex_lock(&mu);
    q = queue_of(b->order.voucher_id);
    if (q == NULL) {
        pthread_mutex_unlock(&mu);
        settle_alone(cs, me);
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
    if (q->s[0] == NULL)
        q->s[0] = scratch_new(g_cfg.batch_max);
    if (g_cfg.batch_pipeline && q->s[1] == NULL)
        q->s[1] = scratch_new(g_cfg.batch_max);
    if (g_cfg.batch_pipeline) {
        lead_pipelined(cs, q);
    } else {
        while (q->head != NULL) {
            gather_wait(q);
            settle(cs, q, q->s[0]);
        }
    }
    q->leader = 0;
    pthread_mutex_unlock(&mu);
}

/* For an event thread, which must not block nor lead: queues 'b' when the
 * voucher's queue has a leader at work (it will settle 'b' before it
 * stops). The mutex is never held across I/O. */
static int join(stock_buyer *b, stock_done_fn done, void *arg)
{
    waiter *me = waiter_new(b, done, arg);
    queue *q;

    pthread_once(&once, init);
    pthread_mutex_lock(&mu);
    for (q = queues; q < queues + NQUEUES; q++)
        if (q->voucher_id == b->order.voucher_id && q->leader)
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

/* submit, waiting for the outcome: for a lock that only the thread that
 * took it may release, the buyer's 'done' runs on this thread. */
static store_status submit_and_wait(conn_set *cs, stock_buyer *b)
{
    sync_wait w = { .done = 0 };

    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    submit(cs, b, sync_done, &w);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return w.st;
}

static void batched_settle(conn_set *cs, PGconn *pg, stock_buyer *b, stock_done_fn done,
                           void *arg)
{
    (void)pg;                                 /* the leader uses its own */
    if (b->same_thread)
        done(cs, arg, submit_and_wait(cs, b));
    else
        submit(cs, b, done, arg);
}

const stock_backend stock_batched = {
    .name = "batched",
    .deferred = 1,
    .settle = batched_settle,
    .join = join,
};
