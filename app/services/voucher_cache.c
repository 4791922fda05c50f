/* voucher_cache: the process's voucher cache and its buyers, invalidated by a
 * generation. */
#include "voucher_cache.h"
#include "util.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define VOUCHER_CACHE_SLOTS 64   /* direct-mapped: a sale has a handful of hot vouchers */
#define BUYER_SLOTS 4096  /* direct-mapped (voucher, user) pairs with an order: 96 KiB */

typedef struct slot {
    store_voucher v;      /* v.voucher_id == 0: empty */
    int64_t loaded_us;
} slot;

/* Shared by the event threads and the workers on purpose: a worker's read
 * of Postgres is what lets an event thread refuse the next buyer. One
 * mutex, held for a copy of one slot. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static slot slots[VOUCHER_CACHE_SLOTS];
static struct buyer {
    int64_t voucher_id, user_id;    /* voucher_id 0: empty */
    int64_t marked_us;
} buyers[BUYER_SLOTS];
static uint64_t seen_generation = 1;
static _Atomic uint64_t generation = 1;

/* mu held: forgets everything once a reset moved the generation. */
static void sync_generation(void)
{
    uint64_t gen = atomic_load_explicit(&generation, memory_order_acquire);

    if (gen != seen_generation) {
        memset(slots, 0, sizeof slots);
        memset(buyers, 0, sizeof buyers);
        seen_generation = gen;
    }
}

/* mu held. */
static slot *slot_of(int64_t id)
{
    sync_generation();
    return &slots[(uint64_t)id % VOUCHER_CACHE_SLOTS];
}

/* mu held. */
static struct buyer *buyer_of(int64_t voucher_id, int64_t user_id)
{
    uint64_t h = ((uint64_t)user_id * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)voucher_id;

    sync_generation();
    return &buyers[(h >> 20) % BUYER_SLOTS];
}

int voucher_cache_get(int64_t voucher_id, store_voucher *out)
{
    int64_t now = util_mono_us();
    int hit;
    slot *s;

    pthread_mutex_lock(&mu);
    s = slot_of(voucher_id);
    hit = s->v.voucher_id == voucher_id && now - s->loaded_us <= (int64_t)VOUCHER_CACHE_TTL_MS * 1000;
    if (hit)
        *out = s->v;
    pthread_mutex_unlock(&mu);
    return hit;
}

uint64_t voucher_cache_generation(void)
{
    return atomic_load_explicit(&generation, memory_order_acquire);
}

void voucher_cache_put(const store_voucher *v, uint64_t gen)
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

void voucher_cache_mark_sold_out(int64_t voucher_id, uint64_t gen)
{
    slot *s;

    pthread_mutex_lock(&mu);
    s = slot_of(voucher_id);
    if (gen == seen_generation && s->v.voucher_id == voucher_id)
        s->v.stock = 0;
    pthread_mutex_unlock(&mu);
}

void voucher_cache_mark_ordered(int64_t voucher_id, int64_t user_id, uint64_t gen)
{
    struct buyer *b;

    pthread_mutex_lock(&mu);
    b = buyer_of(voucher_id, user_id);
    if (gen == seen_generation) {
        b->voucher_id = voucher_id;
        b->user_id = user_id;
        b->marked_us = util_mono_us();
    }
    pthread_mutex_unlock(&mu);
}

int voucher_cache_ordered(int64_t voucher_id, int64_t user_id)
{
    int64_t now = util_mono_us();
    struct buyer *b;
    int hit;

    pthread_mutex_lock(&mu);
    b = buyer_of(voucher_id, user_id);
    hit = b->voucher_id == voucher_id && b->user_id == user_id &&
          now - b->marked_us <= (int64_t)VOUCHER_CACHE_TTL_MS * 1000;
    pthread_mutex_unlock(&mu);
    return hit;
}

void voucher_cache_invalidate_all(void)
{
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
}
