/* lock_status: the outcome of a lock call, one vocabulary for every lock
 * of the lock library (the Redis lock lock.h, MultiLock and RedLock
 * multi_lock.h, ZooKeeper's zk_lock.h, Postgres's pg_lock.h) and for the sale's
 * per-user lock strategies (user_lock.h), so that an outcome reads the same
 * whichever backend gave it. Each call's header says which of these it
 * returns and what it leaves behind on LOCK_ERR. Declarations only: it
 * is part of the lock library and needs nothing. */
#ifndef SECKILL_LOCK_STATUS_H
#define SECKILL_LOCK_STATUS_H

typedef enum lock_status {
    LOCK_OK = 0,          /* acquired (new or reentry) / released or count decreased */
    LOCK_BUSY = 1,        /* not acquired: another owner holds it */
    LOCK_NOT_OWNER = 2,   /* release by someone who does not hold it: nothing changed */
    LOCK_LOST = 3,        /* release: the hold ended with its session meanwhile (zk_lock) */
    LOCK_ERR = -1,        /* the lock's service failed, did not answer in time, or
                           * (multi_lock) granted it with no validity left */
    LOCK_UNSYNCED = -2,   /* granted on the master, but fewer replicas than required
                           * acknowledged the grant (lock_sync_set): it was undone */
    LOCK_MOVED = -3       /* Redis Cluster (lock.h): the node asked does not serve the
                           * key's slot now (MOVED, ASK, TRYAGAIN, CLUSTERDOWN): nothing
                           * ran; route again and retry (lock_last_redirect) */
} lock_status;

#endif
