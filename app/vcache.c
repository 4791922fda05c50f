/* vcache: per-thread voucher cache, invalidated by a shared generation. */
#include "vcache.h"
#include "util.h"

#include <stdatomic.h>
#include <string.h>

#define VCACHE_SLOTS 64   /* direct-mapped: a sale has a handful of hot vouchers */

typedef struct slot {
    store_voucher v;      /* v.voucher_id == 0: empty */
    int64_t loaded_us;
} slot;

static _Atomic uint64_t generation = 1;
static _Thread_local slot slots[VCACHE_SLOTS];
static _Thread_local uint64_t seen_generation;

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
    slot *s = slot_of(voucher_id);

    if (s->v.voucher_id != voucher_id ||
        util_mono_us() - s->loaded_us > (int64_t)VCACHE_TTL_MS * 1000)
        return 0;
    *out = s->v;
    return 1;
}

void vcache_put(const store_voucher *v)
{
    slot *s = slot_of(v->voucher_id);

    s->v = *v;
    s->loaded_us = util_mono_us();
}

void vcache_mark_sold_out(int64_t voucher_id)
{
    slot *s = slot_of(voucher_id);

    if (s->v.voucher_id == voucher_id)
        s->v.stock = 0;
}

void vcache_invalidate_all(void)
{
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
}
