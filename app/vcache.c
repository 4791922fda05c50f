/* vcache: the process's voucher cache, invalidated by a generation. */
#include "vcache.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define VCACHE_SLOTS 64   /* direct-mapped: a sale has a handful of hot vouchers */

typedef struct slot {
    store_voucher v;      /* v.voucher_id == 0: empty */
    int64_t loaded_us;
} slot;

/* Shared by the event threads and the workers on purpose: a worker's read
 * of Postgres is what lets an event thread refuse the next buyer. One
 * mutex, held for a copy of one slot. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static slot slots[VCACHE_SLOTS];
static uint64_t seen_generation = 1;
static _Atomic uint64_t generation = 1;

/* mu held. */
static slot *slot_of(int64_t id)
{
    uint64_t gen = atomic_load_explicit(&generation, memory_order_acquire);

    if (gen != seen_generation) {
        memset(slots, 0, sizeof slots);
        seen_generation = gen;
    }
    return &slots[(uint64_t)id % VCACHE_SLOTS];
}

int vcache_get(int64_t voucher_id, store_voucher *out)
{
    int64_t now = util_mono_us();
    int hit;
    slot *s;

    pthread_mutex_lock(&mu);
    s = slot_of(voucher_id);
    hit = s->v.voucher_id == voucher_id && now - s->loaded_us <= (int64_t)VCACHE_TTL_MS * 1000;
    if (hit)
        *out = s->v;
    pthread_mutex_unlock(&mu);
    return hit;
}

uint64_t vcache_generation(void)
{
    return atomic_load_explicit(&generation, memory_order_acquire);
}

void vcache_put(const store_voucher *v, uint64_t gen)
{
    slot *s;

    pthread_mutex_lock(&mu);
    s = slot_of(v->voucher_id);
    if (gen == seen_generation) {
        s->v = *v;
        s->loaded_us = util_mono_us();
    }
    pthread_mutex_unlock(&mu);
}

void vcache_mark_sold_out(int64_t voucher_id, uint64_t gen)
{
    slot *s;

    pthread_mutex_lock(&mu);
    s = slot_of(voucher_id);
    if (gen == seen_generation && s->v.voucher_id == voucher_id)
        s->v.stock = 0;
    pthread_mutex_unlock(&mu);
}

void vcache_invalidate_all(void)
{
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
}
