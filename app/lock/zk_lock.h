/* zk_lock: ZooKeeper's lock recipe with the multi-threaded C client
 * (zookeeper.apache.org/doc/current/recipes.html, "Locks").
 *
 * A lock is a parent znode <root>/<key> (a container node: the server
 * removes it once its last child is gone). To take it a client creates an
 * ephemeral sequential child "<session id>-<attempt>-<sequence>" and lists
 * the children: the lowest sequence holds the lock. A waiter watches only
 * its predecessor (no herd: one release wakes one waiter); an attempt that
 * does not wait deletes its node and reports busy.
 *
 * Sessions: one zk_lock_client is one ZooKeeper session, shared by every
 * thread of the process (the C client's own I/O and completion threads
 * serve all callers; a session costs the ensemble a heartbeat and a
 * tracker entry, so there is one per process, not per worker). Every node
 * a client creates is ephemeral: the server deletes it when the session
 * ends -- at once on a clean close, and only after the session timeout
 * when the process died (a SIGKILL closes the socket, but the server keeps
 * the session until it misses the heartbeats). A session that expires
 * takes every hold with it: they are lost (zk_lock_release says so), the
 * client opens a new session at its next call, and a holder that wrote
 * after the expiry is refused at the fence (its token is lower than the
 * next holder's).
 *
 * Fencing token: the zxid of the create (the node's czxid). ZooKeeper
 * orders every write of the ensemble by zxid, so it only grows, for every
 * key, for as long as the ensemble keeps its data. (The sequence suffix
 * is per parent and restarts at 0 when the parent is re-created, which a
 * container parent is after its last child leaves: it is no token.)
 *
 * Reentry: a second acquire of a key by the owner that holds it (the same
 * owner string, in this process, in the same session) counts up, like
 * Redisson's hold count; the node is deleted when the count is back to 0.
 * Owners are the callers' strings; the hold table is this process's.
 *
 * A create whose reply is lost (ZOOKEEPER-1262: the server created the
 * node, the connection dropped before the answer) is found again by its
 * name, which carries the session id and a per-attempt number; one that
 * cannot be found yet (still disconnected) is remembered and deleted at a
 * later call, so that it cannot block the key for the session's life.
 *
 * Thread-safe: every function may be called from any thread. */
#ifndef SECKILL_ZK_LOCK_H
#define SECKILL_ZK_LOCK_H

#include <stddef.h>
#include <stdint.h>

#include "lock_status.h"

typedef struct zk_lock_client zk_lock_client;

/* Outcomes (lock_status.h):
 *   LOCK_OK         held (acquire), released or counted down (release)
 *   LOCK_BUSY       another owner holds it
 *   LOCK_ERR        ZooKeeper unreachable or an error: nothing is held
 *   LOCK_NOT_OWNER  release: this owner holds no such lock here
 *   LOCK_LOST       release: the hold's session ended meanwhile (it was lost) */

typedef struct zk_lock_grant {
    int64_t token;    /* czxid of the node: the fencing token */
    int64_t seq;      /* the node's sequence number under its parent */
    int64_t session;  /* the session that holds it */
    int count;        /* hold count after the call (reentry) */
} zk_lock_grant;

/* Opens a session to 'hosts' ("host:port[,host:port...]") asking for
 * 'session_timeout_ms' (the server bounds it by 2 and 20 ticks), creates
 * 'root' (e.g. "/seckill/locks") when missing, and waits up to
 * 'connect_wait_ms' for the session. NULL with the reason in 'err'. */
zk_lock_client *zk_lock_open(const char *hosts, const char *root, int session_timeout_ms,
                     int connect_wait_ms, char *err, size_t errlen);

/* Ends the session (its nodes go at once) and frees the client. */
void zk_lock_close(zk_lock_client *c);

/* One attempt to take 'key' for 'owner'; waits up to 'wait_ms' for the
 * predecessor to go (0: not at all). 'g' may be NULL. */
lock_status zk_lock_acquire(zk_lock_client *c, const char *key, const char *owner, long wait_ms,
                        zk_lock_grant *g);

/* Counts 'owner''s hold of 'key' down, deleting its node at 0. 'left' (may
 * be NULL) gets the count after the call. LOCK_ERR: the delete's answer was
 * lost; the node is deleted at a later call or with the session. */
lock_status zk_lock_release(zk_lock_client *c, const char *key, const char *owner, int *left);

/* The current session's id (0 when none) and its negotiated timeout (ms). */
int64_t zk_lock_session_id(zk_lock_client *c);
int zk_lock_session_timeout(zk_lock_client *c);

/* Counters of this client since open. */
typedef struct zk_lock_counts {
    uint64_t acquired, contended, released, not_owner, lost;
    uint64_t recovered;   /* lost create replies whose node was found by name */
    uint64_t orphans;     /* nodes deleted after their reply or release was lost */
    uint64_t sessions;    /* sessions opened (1 + the expiries recovered) */
} zk_lock_counts;
void zk_lock_counts_get(zk_lock_client *c, zk_lock_counts *out);

/* Test hook: the next successful create's reply is dropped, as if the
 * connection failed after the server created the node (ZOOKEEPER-1262). */
void zk_lock_test_drop_next_create_reply(zk_lock_client *c);

#endif
