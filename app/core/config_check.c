/* config_check: the rules between settings and the forms of their names. */
#include "config_check.h"
#include "log.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

int config_check_instance_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '-' || ch == '_' || ch == '.';
}

/* ZK_HOSTS: host:port[,host:port...], required by SECKILL_LOCK=zk. */
static int check_zk_hosts(const config *c)
{
    util_list it;
    const char *p;
    size_t len;
    int n = 0;

    if (c->zk_hosts[0] == '\0') {
        if (c->lock_strategy != LOCKS_ZK)
            return 0;
        log_error("SECKILL_LOCK=zk needs ZK_HOSTS=host:port[,host:port...]");
        return -1;
    }
    util_list_init(&it, c->zk_hosts);
    while (util_list_next(&it, &p, &len)) {
        const char *end = p + len;
        const char *colon = NULL;
        if (len == 0 && it.last && n > 0) {
            log_error("invalid ZK_HOSTS '%s': trailing comma", c->zk_hosts);
            return -1;
        }
        for (const char *q = p; q < end; q++)
            if (*q == ':')
                colon = q;
        char *num_end;
        long port = colon != NULL ? strtol(colon + 1, &num_end, 10) : 0;
        if (colon == NULL || colon == p || colon + 1 == end || num_end != end || port < 1 ||
            port > 65535 || memchr(p, ' ', len) != NULL || memchr(p, '/', len) != NULL) {
            log_error("invalid ZK_HOSTS '%s': expected host:port[,host:port...]", c->zk_hosts);
            return -1;
        }
        n++;
    }
    return 0;
}

/* REDIS_CLUSTER_NODES: one way to find Redis, and the lock strategies
 * whose Redis keys are routed per slot (the others keep several keys of
 * different slots in one script or one pipeline). Every stock strategy
 * runs on a cluster. */
static int check_cluster(const config *c)
{
    if (c->cluster_nodes_text[0] == '\0')
        return 0;
    if (c->sentinels_text[0] != '\0') {
        log_error("REDIS_CLUSTER_NODES and REDIS_SENTINELS are both set: a Redis Cluster "
                  "fails over by itself; set one of them");
        return -1;
    }
    if (strcmp(c->redis_url_text, CONFIG_REDIS_URL_DEFAULT) != 0) {
        log_error("REDIS_CLUSTER_NODES and REDIS_URL are both set: the cluster's nodes are "
                  "found from REDIS_CLUSTER_NODES; unset REDIS_URL (or set it empty)");
        return -1;
    }
    if (c->lock_strategy != LOCKS_REENTRANT && c->lock_strategy != LOCKS_NONE &&
        c->lock_strategy != LOCKS_LOCAL && c->lock_strategy != LOCKS_ZK &&
        c->lock_strategy != LOCKS_PG_TABLE && c->lock_strategy != LOCKS_PG_ADVISORY) {
        log_error("with REDIS_CLUSTER_NODES, SECKILL_LOCK is reentrant, zk, pg-table or "
                  "pg-advisory (setnx, owner, multilock and redlock keep one Redis)");
        return -1;
    }
    return 0;
}

int config_check(const config *c)
{
    if (c->master_name[0] == '\0' || strpbrk(c->master_name, " \t\r\n") != NULL) {
        log_error("invalid REDIS_MASTER_NAME '%s': a name without spaces", c->master_name);
        return -1;
    }
    if (check_cluster(c) != 0)
        return -1;
    /* WAIT's answer must come back before the socket's read timeout. */
    if (c->lock_sync_replicas > 0 && c->lock_sync_timeout_ms >= c->redis_timeout_ms) {
        log_error("LOCK_SYNC_TIMEOUT_MS (%d) must be below REDIS_TIMEOUT_MS (%d): the answer "
                  "to WAIT has to arrive within the command timeout",
                  c->lock_sync_timeout_ms, c->redis_timeout_ms);
        return -1;
    }
    if (c->redis_order_durability == DURABILITY_WAIT &&
        c->redis_order_wait_ms >= c->redis_timeout_ms) {
        log_error("REDIS_ORDER_WAIT_MS (%d) must be below REDIS_TIMEOUT_MS (%d): the answer "
                  "to WAIT has to arrive within the command timeout",
                  c->redis_order_wait_ms, c->redis_timeout_ms);
        return -1;
    }
    if (c->admin_token_file[0] != '\0' && c->admin_token[0] != '\0') {
        log_error("ADMIN_TOKEN and ADMIN_TOKEN_FILE are both set: set one of them");
        return -1;
    }
    /* Empty: config_machine gives the default, which keeps the rule. */
    for (const char *p = c->instance_id; *p; p++) {
        if (!config_check_instance_char(*p)) {
            log_error("invalid INSTANCE_ID '%s': use letters, digits, '-', '_', '.'",
                      c->instance_id);
            return -1;
        }
    }
    for (const char *p = c->id_prefix; *p; p++) {
        if (*p == ':' || *p == ' ' || (unsigned char)*p < 0x21) {
            log_error("invalid ID_PREFIX '%s'", c->id_prefix);
            return -1;
        }
    }
    if (c->id_prefix[0] == '\0') {
        log_error("ID_PREFIX must not be empty");
        return -1;
    }
    if (check_zk_hosts(c) != 0)
        return -1;
    if (c->fence_horizon_ms > 0 && c->fence_horizon_ms < 1000) {
        log_error("invalid FENCE_HORIZON_MS=%ld: expected 0 (no horizon) or at least 1000 ms",
                  c->fence_horizon_ms);
        return -1;
    }
    return 0;
}
