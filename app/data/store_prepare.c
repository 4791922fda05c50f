/* store_prepare: every store module's statements on a fresh session. */
#include "store_prepare.h"
#include "store.h"
#include "store_batch.h"
#include "store_fence.h"
#include "store_order.h"
#include "store_steps.h"
#include "store_voucher.h"

int store_prepare(PGconn *pg)
{
    if (store_session_setup(pg) != 0 || store_voucher_prepare(pg) != 0 ||
        store_order_prepare(pg) != 0 || store_fence_prepare(pg) != 0 ||
        store_steps_prepare(pg) != 0 || store_batch_prepare(pg) != 0)
        return -1;
    return 0;
}
