/* slow_fsync: a disk whose flush is slow, for the ladder's Redis.
 *
 *   LD_PRELOAD=build/slow_fsync.so SLOW_FSYNC_MS=3000 redis-server ...
 *
 * An LD_PRELOAD library: fsync(2) and fdatasync(2) wait SLOW_FSYNC_MS
 * (default 0: no change) before they flush, as on a disk busy with other
 * writes. Nothing else changes: every byte still reaches the file.
 *
 * Why: with `appendfsync everysec` Redis fsyncs its AOF in a background
 * thread once a second, and while that fsync runs it holds back the write(2)
 * of new AOF data for up to two seconds (flushAppendOnlyFile in Redis's
 * src/aof.c), while its clients already have their replies. A process killed
 * then loses what it held back, as a machine crash loses what was written
 * but not flushed. On a fast, idle disk the fsync takes a millisecond and
 * the window is almost never open when the kill comes; this library keeps
 * it open, so that the ladder shows the loss every run (loadtest/ladder,
 * the redis-first step with everysec). */
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <time.h>

int fsync(int fd);
int fdatasync(int fd);

typedef int (*slow_fsync_fn)(int);

static slow_fsync_fn next_fsync, next_fdatasync;
static long slow_fsync_ms;

/* SLOW_FSYNC_MS and libc's own functions, read when the library is loaded,
 * before any thread of the program runs. */
__attribute__((constructor)) static void slow_fsync_init(void)
{
    const char *s = getenv("SLOW_FSYNC_MS");

    slow_fsync_ms = s ? strtol(s, NULL, 10) : 0;
    *(void **)&next_fsync = dlsym(RTLD_NEXT, "fsync");   /* POSIX's cast of a */
    *(void **)&next_fdatasync = dlsym(RTLD_NEXT, "fdatasync"); /* data pointer */
}

static void slow_fsync_wait(void)
{
    struct timespec left;
    int saved = errno;

    if (slow_fsync_ms <= 0)
        return;
    left.tv_sec = slow_fsync_ms / 1000;
    left.tv_nsec = (slow_fsync_ms % 1000) * 1000000L;
    while (nanosleep(&left, &left) == -1 && errno == EINTR)
        ;
    errno = saved;
}

static int slow_fsync_call(slow_fsync_fn next, int fd)
{
    if (!next) {
        errno = ENOSYS;
        return -1;
    }
    slow_fsync_wait();
    return next(fd);
}

int fsync(int fd)
{
    return slow_fsync_call(next_fsync, fd);
}

int fdatasync(int fd)
{
    return slow_fsync_call(next_fdatasync, fd);
}
