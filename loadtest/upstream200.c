/* upstream200: a separate upstream process that does no work, for make bench.
 *
 *   build/upstream200 PORT [THREADS]
 *
 * Listens on 127.0.0.1:PORT and answers every HTTP/1.1 request with the
 * same 200 at once, keeping the connection open. THREADS event loops
 * (default 2, like an instance's IO_THREADS), each with its own epoll and
 * its own SO_REUSEPORT listening socket, so the kernel spreads connections
 * over them as it spreads them over libmicrohttpd's threads.
 *
 * make bench puts two of these behind nginx in place of the two instances,
 * to see how much of the chain's cost is the upstream's own work. It is not
 * a floor for throughput: the chain's cost per request is mostly nginx's and
 * wrk's, and depends on how many requests each of their wake-ups carries.
 * Answering faster than an instance, it leaves wrk waking about twice per
 * request (perf stat: 1.7-1.9 epoll_wait per request, 0.83-0.85 with the
 * instances), and the chain runs slower than with the instances.
 *
 * Requests are parsed only as far as framing needs: the end of the headers
 * and Content-Length. Pipelined requests are answered in one write.
 * Anything it cannot frame (headers over 8 KiB, chunked bodies) closes the
 * connection. Stop it with SIGTERM. SIGUSR1 writes "accepted N\n" to stdout:
 * the connections accepted since start (tests/test_nginx.py counts nginx's
 * upstream connections with it). */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define UP_BUF 8192
#define UP_EVENTS 64

/* The ceiling nginx's body; the whole answer is made once, in main. */
#define UP_BODY "{\"error\":\"sold_out\",\"message\":\"voucher is sold out\"}\n"

static char up_answer[256];
static size_t up_answer_len;

typedef struct up_conn {
    int fd;
    size_t in_len;          /* bytes in in[] not yet framed */
    size_t body_left;       /* body bytes of the current request still to skip */
    size_t out_len, out_off;
    int want_out;           /* EPOLLOUT is in the interest set */
    char in[UP_BUF];
    char out[UP_BUF];
} up_conn;

static int up_port;

/* Connections accepted since start, for SIGUSR1. */
static atomic_ulong up_accepted;

/* SIGUSR1: "accepted N\n" on stdout, with async-signal-safe calls only. */
static void up_report(int sig)
{
    char buf[32], digits[24];
    unsigned long n = atomic_load(&up_accepted);
    size_t len = 0, nd = 0;
    int saved = errno;

    (void)sig;
    do {
        digits[nd++] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0);
    memcpy(buf, "accepted ", 9);
    len = 9;
    while (nd > 0)
        buf[len++] = digits[--nd];
    buf[len++] = '\n';
    if (write(STDOUT_FILENO, buf, len) < 0) {
        /* nothing to do: nobody reads the count */
    }
    errno = saved;
}

/* The value of Content-Length in the header block hdr[0..len), 0 when
 * absent; -1 for a value it does not take (negative, too big, chunked). */
static long up_content_length(const char *hdr, size_t len)
{
    const char *p = hdr, *end = hdr + len;

    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        size_t n = eol ? (size_t)(eol - p) : (size_t)(end - p);

        if (n >= 18 && strncasecmp(p, "transfer-encoding:", 18) == 0)
            return -1;
        if (n >= 15 && strncasecmp(p, "content-length:", 15) == 0) {
            long v = 0;
            size_t i = 15;

            while (i < n && (p[i] == ' ' || p[i] == '\t'))
                i++;
            if (i == n || p[i] < '0' || p[i] > '9')
                return -1;
            for (; i < n && p[i] >= '0' && p[i] <= '9'; i++) {
                v = v * 10 + (p[i] - '0');
                if (v > (1L << 30))
                    return -1;
            }
            return v;
        }
        p += n + 1;
    }
    return 0;
}

/* Frames what c->in holds and queues one answer per whole request.
 * Returns 0, or -1 when the connection must close. */
static int up_frame(up_conn *c)
{
    size_t off = 0;

    for (;;) {
        if (c->body_left) {
            size_t skip = c->in_len - off < c->body_left ? c->in_len - off : c->body_left;

            off += skip;
            c->body_left -= skip;
            if (c->body_left)
                break;
            continue;
        }
        const char *hdr = c->in + off;
        const char *eoh = memmem(hdr, c->in_len - off, "\r\n\r\n", 4);
        long cl;

        if (!eoh)
            break;
        cl = up_content_length(hdr, (size_t)(eoh - hdr));
        if (cl < 0)
            return -1;
        if (c->out_len + up_answer_len > sizeof c->out)
            return -1;      /* a client that pipelines without reading */
        memcpy(c->out + c->out_len, up_answer, up_answer_len);
        c->out_len += up_answer_len;
        off = (size_t)(eoh + 4 - c->in);
        c->body_left = (size_t)cl;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    return c->in_len == sizeof c->in ? -1 : 0;   /* headers too large */
}

/* Writes what is queued. Returns 1 when all of it went out, 0 when the
 * socket is full (wait for EPOLLOUT), -1 on an error. */
static int up_flush(up_conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        c->out_off += (size_t)n;
    }
    c->out_off = c->out_len = 0;
    return 1;
}

static void up_close(int ep, up_conn *c)
{
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    free(c);
}

/* One readable or writable event on c. Returns 0, or -1 to close. */
static int up_serve(int ep, up_conn *c, uint32_t events)
{
    int wrote;

    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        ssize_t n = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, 0);

        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return -1;
        if (n > 0) {
            c->in_len += (size_t)n;
            if (up_frame(c) < 0)
                return -1;
        }
    }
    if (c->out_len == 0)
        return 0;
    wrote = up_flush(c);
    if (wrote < 0)
        return -1;
    /* epoll_ctl only when the interest changes: a request that is answered
     * at once, as nearly all are, costs one recv and one send. */
    if (c->want_out != !wrote) {
        struct epoll_event ev = { .events = EPOLLIN | (wrote ? 0u : (uint32_t)EPOLLOUT), .data.ptr = c };

        c->want_out = !wrote;
        return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    }
    return 0;
}

static int up_listen(void)
{
    struct sockaddr_in a;
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)up_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) < 0 || listen(fd, 4096) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void up_accept(int ep, int lfd)
{
    for (;;) {
        int one = 1;
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        up_conn *c;

        if (fd < 0)
            return;
        atomic_fetch_add(&up_accepted, 1);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            free(c);
        }
    }
}

/* The listening socket's event carries NULL; a connection's, its up_conn. */
static void *up_loop(void *arg)
{
    int lfd = *(int *)arg;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
    struct epoll_event evs[UP_EVENTS];

    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0) {
        perror("upstream200: epoll");
        exit(1);
    }
    for (;;) {
        int n = epoll_wait(ep, evs, UP_EVENTS, -1);

        for (int i = 0; i < n; i++) {
            up_conn *c = evs[i].data.ptr;

            if (!c)
                up_accept(ep, lfd);
            else if (up_serve(ep, c, evs[i].events) < 0)
                up_close(ep, c);
        }
        if (n < 0 && errno != EINTR) {
            perror("upstream200: epoll_wait");
            exit(1);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 2 ? atoi(argv[2]) : 2;
    int *fds;
    pthread_t t;
    struct sigaction sa;

    if (argc < 2 || (up_port = atoi(argv[1])) <= 0 || up_port > 65535 || threads < 1 || threads > 64) {
        fprintf(stderr, "usage: upstream200 PORT [THREADS 1..64]\n");
        return 2;
    }
    up_answer_len = (size_t)snprintf(up_answer, sizeof up_answer,
                                     "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     "Content-Length: %zu\r\n\r\n%s", sizeof UP_BODY - 1, UP_BODY);
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = up_report;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    fds = calloc((size_t)threads, sizeof *fds);
    if (!fds)
        return 1;
    /* Every socket bound before any thread runs: a client connecting at
     * once reaches a loop that is listening. */
    for (int i = 0; i < threads; i++) {
        fds[i] = up_listen();
        if (fds[i] < 0) {
            fprintf(stderr, "upstream200: 127.0.0.1:%d: %s\n", up_port, strerror(errno));
            return 1;
        }
    }
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&t, NULL, up_loop, &fds[i]) != 0) {
            fprintf(stderr, "upstream200: pthread_create failed\n");
            return 1;
        }
    }
    up_loop(&fds[0]);
    return 0;
}
