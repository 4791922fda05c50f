/* unit_voucher_cache: the voucher cache (voucher_cache.h) without a database: hits and
 * misses, the time to live, sold-out and ordered marks, and the generation
 * that a reset moves (stale answers ignored, everything dropped). */
#include <string.h>

#include "t.h"
#include "voucher_cache.h"

static store_voucher voucher(int64_t id, int64_t stock)
{
    store_voucher v;
    memset(&v, 0, sizeof v);
    v.voucher_id = id;
    snprintf(v.title, sizeof v.title, "voucher %lld", (long long)id);
    v.stock = stock;
    v.initial_stock = stock;
    v.begin_time = 1795564800;
    v.end_time = 1795564800 + 3600;
    return v;
}

static void test_miss_then_hit(void)
{
    store_voucher v = voucher(1001, 10), out;
    T_EQ_I64(voucher_cache_get(1001, &out), 0);
    voucher_cache_put(&v, voucher_cache_generation());
    T_EQ_I64(voucher_cache_get(1001, &out), 1);
    T_EQ_I64(out.voucher_id, 1001);
    T_EQ_I64(out.stock, 10);
    T_EQ_STR(out.title, "voucher 1001");
    T_EQ_I64(voucher_cache_get(1002, &out), 0);
}

static void test_slot_collision_is_a_miss_not_a_wrong_hit(void)
{
    /* 64 direct-mapped slots: ids 2000 and 2064 share one. Whatever the
     * layout, a lookup never answers with another voucher. */
    store_voucher a = voucher(2000, 1), b = voucher(2064, 2), out;
    uint64_t gen = voucher_cache_generation();
    voucher_cache_put(&a, gen);
    voucher_cache_put(&b, gen);
    if (voucher_cache_get(2000, &out))
        T_EQ_I64(out.voucher_id, 2000);
    T_EQ_I64(voucher_cache_get(2064, &out), 1);
    T_EQ_I64(out.voucher_id, 2064);
}

static void test_sold_out_mark(void)
{
    store_voucher v = voucher(3001, 5), out;
    uint64_t gen = voucher_cache_generation();
    voucher_cache_mark_sold_out(3001, gen);             /* not cached: nothing to mark */
    T_EQ_I64(voucher_cache_get(3001, &out), 0);
    voucher_cache_put(&v, gen);
    voucher_cache_mark_sold_out(3001, gen);
    T_EQ_I64(voucher_cache_get(3001, &out), 1);
    T_EQ_I64(out.stock, 0);
    T_EQ_I64(out.initial_stock, 5);
}

static void test_ordered_mark(void)
{
    uint64_t gen = voucher_cache_generation();
    T_EQ_I64(voucher_cache_ordered(4001, 77), 0);
    voucher_cache_mark_ordered(4001, 77, gen);
    T_EQ_I64(voucher_cache_ordered(4001, 77), 1);
    T_EQ_I64(voucher_cache_ordered(4001, 78), 0);
    T_EQ_I64(voucher_cache_ordered(4002, 77), 0);
}

static void test_reset_drops_everything_and_ignores_stale_answers(void)
{
    store_voucher v = voucher(5001, 3), out;
    uint64_t before = voucher_cache_generation();
    voucher_cache_put(&v, before);
    voucher_cache_mark_ordered(5001, 9, before);
    T_EQ_I64(voucher_cache_get(5001, &out), 1);

    voucher_cache_invalidate_all();
    T_ASSERT(voucher_cache_generation() != before);
    T_EQ_I64(voucher_cache_get(5001, &out), 0);
    T_EQ_I64(voucher_cache_ordered(5001, 9), 0);

    /* Answers read before the reset must not come back. */
    voucher_cache_put(&v, before);
    voucher_cache_mark_ordered(5001, 9, before);
    T_EQ_I64(voucher_cache_get(5001, &out), 0);
    T_EQ_I64(voucher_cache_ordered(5001, 9), 0);

    uint64_t now = voucher_cache_generation();
    voucher_cache_put(&v, now);
    T_EQ_I64(voucher_cache_get(5001, &out), 1);
    voucher_cache_mark_sold_out(5001, before);          /* stale: ignored */
    T_EQ_I64(voucher_cache_get(5001, &out), 1);
    T_EQ_I64(out.stock, 3);
}

static void test_entries_expire(void)
{
    store_voucher v = voucher(6001, 1), out;
    uint64_t gen = voucher_cache_generation();
    voucher_cache_put(&v, gen);
    voucher_cache_mark_ordered(6001, 5, gen);
    T_EQ_I64(voucher_cache_get(6001, &out), 1);
    T_EQ_I64(voucher_cache_ordered(6001, 5), 1);
    t_sleep_ms(VOUCHER_CACHE_TTL_MS + 100);
    T_EQ_I64(voucher_cache_get(6001, &out), 0);
    T_EQ_I64(voucher_cache_ordered(6001, 5), 0);
}

int main(void)
{
    T_RUN(test_miss_then_hit);
    T_RUN(test_slot_collision_is_a_miss_not_a_wrong_hit);
    T_RUN(test_sold_out_mark);
    T_RUN(test_ordered_mark);
    T_RUN(test_reset_drops_everything_and_ignores_stale_answers);
    T_RUN(test_entries_expire);
    return t_done();
}
