-- seckill schema (PostgreSQL 15). Table and column names (tb_voucher, tb_voucher_order)
-- are the classic flash-sale tutorial's, so that users and external checkers can query them directly.
-- Idempotent: safe to load on every start.

CREATE TABLE IF NOT EXISTS tb_voucher (
    voucher_id    bigserial   PRIMARY KEY,
    title         text        NOT NULL,
    stock         bigint      NOT NULL CHECK (stock >= 0),
    initial_stock bigint      NOT NULL CHECK (initial_stock >= 0),
    begin_time    timestamptz NOT NULL,
    end_time      timestamptz NOT NULL,
    create_time   timestamptz NOT NULL DEFAULT now(),
    update_time   timestamptz NOT NULL DEFAULT now(),
    CHECK (end_time >= begin_time)
);

-- The voucher's sale: 1 at creation, one more at each reset (which deletes
-- the orders of the sale before). Redis-first orders carry the sale they
-- were admitted in; the consumer persists an order only while its sale is
-- this one, read under the voucher row's lock, which the reset takes too.
ALTER TABLE tb_voucher ADD COLUMN IF NOT EXISTS sale_gen bigint NOT NULL DEFAULT 1;

CREATE TABLE IF NOT EXISTS tb_voucher_order (
    id          bigint      PRIMARY KEY,          -- Redis-generated 64-bit order id
    user_id     bigint      NOT NULL,
    voucher_id  bigint      NOT NULL REFERENCES tb_voucher (voucher_id),
    create_time timestamptz NOT NULL DEFAULT now()
);

-- The last line of defence for "one order per user": locks can expire, this
-- cannot. The demo ladder drops it on purpose (and restores it) to show what
-- the locks alone do.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = 'uq_voucher_order_user_voucher') THEN
        ALTER TABLE tb_voucher_order
            ADD CONSTRAINT uq_voucher_order_user_voucher UNIQUE (user_id, voucher_id);
    END IF;
END $$;

-- Per-voucher aggregation for /stats and reset's DELETE.
CREATE INDEX IF NOT EXISTS idx_voucher_order_voucher ON tb_voucher_order (voucher_id);

-- Fencing tokens (Kleppmann): the highest lock token accepted per lock key.
-- An order write carrying a lower token comes from a holder whose lease
-- expired while it was paused; it is refused in the same transaction.
-- Tokens are microseconds of Redis's clock: a write whose token is older
-- than FENCE_HORIZON_MS is refused too, so the service deletes rows older
-- than twice that (app/services/fence.c) without letting a stale holder in.
CREATE TABLE IF NOT EXISTS tb_lock_fence (
    lock_key text   PRIMARY KEY,
    token    bigint NOT NULL
);

-- The per-user lock as a row (SECKILL_LOCK=pg-table; app/lock/pg_lock.c): one row per
-- held key. Taking it is one INSERT ... ON CONFLICT DO UPDATE that succeeds
-- when the row is absent, expired, or the same owner's (reentry counts
-- 'holds' up); release deletes or counts down the owner's row only. Fencing
-- tokens come from the sequence, so they only grow. An expired row is taken
-- over by the next acquire; LOCK_PG_SWEEP_MS > 0 also deletes them on a timer.
CREATE SEQUENCE IF NOT EXISTS tb_lock_token_seq;
CREATE TABLE IF NOT EXISTS tb_lock (
    lock_key   text        PRIMARY KEY,
    owner      text        NOT NULL,
    holds      integer     NOT NULL CHECK (holds > 0),
    token      bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
