/* config_check: the rules a parsed configuration must keep beyond each
 * value's own type and bounds: the rules between settings (WAIT's timeout
 * under the command timeout, ZK_HOSTS with SECKILL_LOCK=zk, ADMIN_TOKEN or
 * ADMIN_TOKEN_FILE), and the forms of the names and lists that are kept as
 * text (INSTANCE_ID, ID_PREFIX, REDIS_MASTER_NAME, ZK_HOSTS,
 * FENCE_HORIZON_MS's lower bound). No I/O but the log. */
#ifndef SECKILL_CONFIG_CHECK_H
#define SECKILL_CONFIG_CHECK_H

#include "config.h"

/* 0, or -1 after logging the first rule 'c' breaks (log_error). */
int config_check(const config *c);

/* 1 when INSTANCE_ID may hold 'ch': a letter, a digit, '-', '_' or '.'. */
int config_check_instance_char(char ch);

#endif
