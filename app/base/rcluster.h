/* rcluster: Redis Cluster routing over hiredis, which has none (Debian's
 * hiredis 0.14). A key's hash slot (CRC16 of the key, or of its hash tag),
 * the slot map read with CLUSTER SLOTS, one connection per master, and the
 * redirections of the cluster specification
 * (https://redis.io/docs/reference/cluster-spec/):
 *
 *   MOVED slot host:port   the slot lives elsewhere for good: the map is
 *                          read again and the command sent there
 *   ASK slot host:port     the slot is being migrated and this key is
 *                          already on the target: ASKING, then the command,
 *                          there, once; the map stays
 *   TRYAGAIN               a multi-key command whose keys are split by a
 *                          migration: sent again after a pause
 *   CLUSTERDOWN            the cluster cannot serve the slot (a master lost
 *                          and not replaced yet): the map is read again and
 *                          the command sent again after a pause
 *   a lost connection      the node is dropped, the map read again (its
 *                          replica may have been promoted), sent again
 *
 * each retried until the call's budget (retry_ms) is spent; then the last
 * reply, or NULL, is the caller's (a 503). NOSCRIPT is the sender's (a
 * script sender falls back to EVAL: a promoted replica has no SCRIPT LOAD).
 *
 * One rcluster per thread: a handle is not thread-safe. As in hiredis, the
 * error lives in the handle: rc->err (RCLUSTER_ERR_*) and rc->errstr. */
#ifndef SECKILL_RCLUSTER_H
#define SECKILL_RCLUSTER_H

#include <stddef.h>
#include <stdint.h>
#include <hiredis/hiredis.h>

#define RCLUSTER_SLOTS 16384
#define RCLUSTER_MAX_NODES 64

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the cluster's
 * key hash: crc16("123456789") is 0x31C3. */
uint16_t rcluster_crc16(const char *buf, size_t len);

/* The hash slot of a key: CRC16 mod 16384 of the whole key, or, when the
 * key holds a '{' followed later by a '}' with at least one byte between
 * the first such pair, of those bytes only (the hash tag). */
int rcluster_keyslot(const char *key, size_t len);

/* What an error reply asks of a cluster client. */
typedef enum rcluster_kind {
    RCLUSTER_NONE,          /* not an error, or an error that is the answer */
    RCLUSTER_MOVED,
    RCLUSTER_ASK,
    RCLUSTER_TRYAGAIN,
    RCLUSTER_CLUSTERDOWN,
} rcluster_kind;

typedef struct rcluster_redirect {
    rcluster_kind kind;
    int slot;               /* MOVED, ASK: the slot; else -1 */
    char host[256];         /* MOVED, ASK: empty when the reply names a port only */
    int port;
} rcluster_redirect;

/* Reads reply 'r' (NULL allowed: NONE). "MOVED 3999 127.0.0.1:6381",
 * "ASK 3999 127.0.0.1:6381" (an empty host, ":6381", when the node does not
 * know its address: the one that answered is meant), "TRYAGAIN ...",
 * "CLUSTERDOWN ...". A MOVED or ASK that cannot be read is NONE. */
rcluster_kind rcluster_redirect_parse(const redisReply *r, rcluster_redirect *out);

enum {
    RCLUSTER_OK = 0,
    RCLUSTER_ERR_CONNECT,   /* no node of the map or the seeds could be reached */
    RCLUSTER_ERR_MAP,       /* no usable slot map (no node answered CLUSTER SLOTS whole) */
    RCLUSTER_ERR_NODES,     /* more than RCLUSTER_MAX_NODES nodes */
    RCLUSTER_ERR_BUDGET,    /* redirections or retries past the call's budget */
};

typedef struct rcluster_opts {
    int timeout_ms;         /* connect and per-command timeout */
    int retry_ms;           /* one call's budget for redirections and retries */
    const char *username;   /* NULL or empty: no ACL user */
    const char *password;   /* NULL or empty: no AUTH */
    /* Optional: run on each new connection to a node, before any command
     * of the caller (the scripts cached there, so that a NOSCRIPT fallback
     * never follows an ASKING it would lose). 0, or -1 to drop it. */
    int (*on_connect)(redisContext *c, void *arg);
    void *on_connect_arg;
} rcluster_opts;

typedef struct rcluster_node {
    char host[256];
    int port;
    redisContext *c;        /* NULL until first used, and after a failure */
} rcluster_node;

typedef struct rcluster {
    rcluster_opts opts;     /* the strings are copies owned by the handle */
    char *username, *password;
    rcluster_node nodes[RCLUSTER_MAX_NODES];
    int nnodes;             /* the seeds first, then the nodes the map named */
    uint8_t slot[RCLUSTER_SLOTS]; /* master of each slot: node index + 1; 0 unknown */
    int stale;              /* the map must be read again before use */
    uint64_t refreshes;     /* slot maps read (for tests and metrics) */
    uint64_t redirects;     /* MOVED and ASK followed */
    int err;
    char errstr[256];
} rcluster;

/* Parses the seeds "host:port,host:port,..." (no I/O: the map is read at
 * the first call). Returns a handle (free with rcluster_free), or NULL with
 * the reason in 'errbuf'. */
rcluster *rcluster_new(const char *seeds, const rcluster_opts *opts, char *errbuf, size_t n);
void rcluster_free(rcluster *rc);

/* Reads the slot map with CLUSTER SLOTS from a known node (the map's
 * masters first, then the seeds). 0, or -1 with the error in the handle. */
int rcluster_refresh(rcluster *rc);

/* The connection to the master of 'slot', connected (and authenticated)
 * now if need be; the map is read first when stale or when it has no
 * master for the slot. Borrowed: valid until the next call on 'rc'. NULL
 * with the error in the handle. */
redisContext *rcluster_slot_context(rcluster *rc, int slot);

/* Sends one command and reads its reply on 'c': the sender of
 * rcluster_call. Returns the reply (the caller frees it) or NULL when the
 * connection failed (c->err). */
typedef redisReply *(*rcluster_send_fn)(redisContext *c, void *arg);

/* Runs 'send' on the master of 'slot' and follows what the reply asks
 * (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, a lost connection) within the budget.
 * Returns the first reply that is not a redirection (the caller frees it;
 * it may be another error), or, once the budget is spent, the last
 * redirection's reply (err RCLUSTER_ERR_BUDGET) or NULL (no reply at all:
 * err says why). */
redisReply *rcluster_call(rcluster *rc, int slot, rcluster_send_fn send, void *arg);

/* rcluster_call of one command (redisCommandArgv's arguments), routed by
 * the slot of argv[key] (key: the index of the argument that is the key). */
redisReply *rcluster_command_argv(rcluster *rc, int key, int argc, const char **argv,
                                  const size_t *argvlen);

/* For a caller that runs its own commands on rcluster_slot_context's
 * connections (pipelines, scripts a library sends) and reads a redirection
 * in a reply: the connection to send the command to again. MOVED: the
 * slot is remembered at its new master (the rest of the map read at the
 * next stale use), and that master's connection returned. ASK: the
 * target's connection, on which ASKING was just sent (the next command
 * there, once, may touch the migrating slot). TRYAGAIN, CLUSTERDOWN: NULL
 * with the map marked stale: pause, then route again. Borrowed as
 * rcluster_slot_context's; NULL with the error in the handle. */
redisContext *rcluster_redirected(rcluster *rc, const rcluster_redirect *rd,
                                  const redisContext *from);

/* The connection to the master of 'slot', as rcluster_slot_context's, but
 * handed over: the caller owns it (redisFree) and the handle forgets it.
 * For a thread that keeps one connection of its own (a subscriber). */
redisContext *rcluster_slot_take(rcluster *rc, int slot);

/* The node (an index of rc->nodes) that is master of 'slot' in the map as
 * last read, or -1 when none is known. No I/O: for grouping keys by master
 * after rcluster_slot_context has read the map. */
int rcluster_slot_node(const rcluster *rc, int slot);

/* One slot of each master in the map (read first when stale), in slot
 * order, at most 'max': rcluster_slot_context of each reaches every
 * master once. The number, or -1 with the error in the handle. */
int rcluster_master_slots(rcluster *rc, int *slots, int max);

/* Drops every connection and marks the map stale (after a fork, or to
 * start over). */
void rcluster_reset(rcluster *rc);

#endif
