/* test_http_state: the request's one state (http.h), on a real
 * libmicrohttpd daemon with a route table of its own. Every hand-off works:
 * answered on the event thread, on a worker, by another thread after a
 * worker or the event thread handed it off, and parked then passed to a
 * worker. Every misuse stops the process with a message naming it: an
 * answer given twice (on a worker, on the event thread), an answer after
 * the request was completed and freed, a worker's handler that returns
 * without answering, a hand-off after the answer. Each misuse runs in a
 * child process (this binary again, with --misuse <path>). */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "config.h"
#include "http.h"
#include "log.h"
#include "t.h"
#include "util.h"

#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif

static int port;

/*---- handlers ----*/

static http_outcome say(http_req *r, const char *text)
{
    return http_send_text(r, 200, "text/plain", xstrdup(text), strlen(text));
}

static http_outcome h_worker(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    return say(r, "worker");
}

static http_outcome f_fast(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    return say(r, "fast");
}

/* A holder answers 20 ms later, from a thread of its own; 'again' answers
 * a second time 300 ms after that, when the request is long completed. */
typedef struct later {
    http_req *r;
    int again;
} later;

static void *answer_later(void *arg)
{
    later *l = arg;

    t_sleep_ms(20);
    say(l->r, "later");
    if (l->again) {
        t_sleep_ms(300);
        say(l->r, "again");
    }
    free(l);
    return NULL;
}

static void spawn_answer(http_req *r, int again)
{
    pthread_t t;
    later *l = xcalloc(1, sizeof *l);

    l->r = r;
    l->again = again;
    if (pthread_create(&t, NULL, answer_later, l) != 0)
        abort();
    pthread_detach(t);
}

static http_outcome h_handoff(http_req *r, const char *arg, size_t arg_len)
{
    http_outcome out = http_hand_off(r);

    (void)arg;
    (void)arg_len;
    spawn_answer(r, 0);
    return out;
}

static http_outcome f_park(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    if (http_park(r) != 0)
        return http_send_error(r, API_UNAVAILABLE, "stopped");
    spawn_answer(r, 0);
    return HTTP_HANDED_OFF;
}

/* Parked, then nobody takes it: on to the route's worker handler. */
static http_outcome f_unpark(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    if (http_park(r) != 0)
        return HTTP_PASS;
    http_unpark(r);
    return HTTP_HANDED_OFF;
}

/*---- misuses ----*/

static http_outcome h_twice(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    say(r, "one");
    return say(r, "two");
}

static http_outcome f_twice(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    say(r, "one");
    return say(r, "two");
}

static http_outcome h_silent(http_req *r, const char *arg, size_t arg_len)
{
    (void)r;
    (void)arg;
    (void)arg_len;
    return HTTP_ANSWERED;
}

static http_outcome h_after(http_req *r, const char *arg, size_t arg_len)
{
    http_outcome out = http_hand_off(r);

    (void)arg;
    (void)arg_len;
    spawn_answer(r, 1);
    return out;
}

static http_outcome h_handoff_answered(http_req *r, const char *arg, size_t arg_len)
{
    (void)arg;
    (void)arg_len;
    say(r, "one");
    return http_hand_off(r);
}

static const http_route routes[] = {
    { "GET", "/worker", h_worker, NULL },
    { "GET", "/fast", NULL, f_fast },
    { "GET", "/handoff", h_handoff, NULL },
    { "GET", "/park", h_worker, f_park },
    { "GET", "/unpark", h_worker, f_unpark },
    { "GET", "/twice-worker", h_twice, NULL },
    { "GET", "/twice-fast", NULL, f_twice },
    { "GET", "/silent", h_silent, NULL },
    { "GET", "/after-answer", h_after, NULL },
    { "GET", "/handoff-answered", h_handoff_answered, NULL },
};

/*---- the server and a client ----*/

static int free_port(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), p = -1;

    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        p = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return p;
}

static void server_start(const char *argv0)
{
    char *args[] = { (char *)argv0, NULL };
    char p[16];

    port = free_port();
    snprintf(p, sizeof p, "%d", port);
    setenv("PORT", p, 1);
    setenv("BIND", "127.0.0.1", 1);
    setenv("THREADS", "2", 1);
    setenv("IO_THREADS", "2", 1);
    setenv("LOG_LEVEL", "warn", 0);
    if (port < 0 || config_load(1, args) != 0) {
        fprintf(stderr, "cannot configure the server\n");
        exit(2);
    }
    log_set_level((enum log_level)g_cfg.log_level);
    if (http_start(routes, sizeof routes / sizeof routes[0]) != 0) {
        fprintf(stderr, "http_start failed on port %d\n", port);
        exit(2);
    }
}

/* GET 'path' on a fresh connection: the status, and the body into 'body'.
 * -1 when no answer came within 5 s. */
static int get(const char *path, char *body, size_t n)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    struct timeval tv = { 5, 0 };
    char req[256], resp[4096];
    size_t got = 0;
    int fd, status = -1;
    const char *b;

    body[0] = '\0';
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        goto out;
    snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, strlen(req)) != (ssize_t)strlen(req))
        goto out;
    for (;;) {
        ssize_t k = read(fd, resp + got, sizeof resp - 1 - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    resp[got] = '\0';
    if (sscanf(resp, "HTTP/1.1 %d", &status) != 1)
        status = -1;
    if ((b = strstr(resp, "\r\n\r\n")) != NULL)
        snprintf(body, n, "%s", b + 4);
out:
    close(fd);
    return status;
}

/*---- cases: what works ----*/

static void expect(const char *path, const char *want)
{
    char body[256];

    if (T_EQ_I64(get(path, body, sizeof body), 200))
        T_EQ_STR(body, want);
}

static void test_every_hand_off_answers(void)
{
    expect("/fast", "fast");
    expect("/worker", "worker");
    expect("/handoff", "later");
    expect("/park", "later");
    expect("/unpark", "worker");
}

/* More requests than the quarantine holds: completed requests are freed
 * in turn, and the counts stay right. */
static void test_many_requests(void)
{
    static const char *const paths[] = { "/fast", "/worker", "/handoff", "/park", "/unpark" };
    static const char *const want[] = { "fast", "worker", "later", "later", "worker" };
    char body[256];
    int ok = 0;

    for (int i = 0; i < 200; i++)
        ok += get(paths[i % 5], body, sizeof body) == 200 && strcmp(body, want[i % 5]) == 0;
    T_EQ_I64(ok, 200);
    int in_progress = -1, queued = -1;
    for (int i = 0; i < 100 && in_progress != 0; i++) {
        http_load(&in_progress, &queued);
        if (in_progress != 0)
            t_sleep_ms(10);
    }
    T_EQ_I64(in_progress, 0);
    T_EQ_I64(queued, 0);
}

/*---- cases: what stops the process ----*/

/* Runs this binary with --misuse 'path'; it must die of SIGABRT with
 * 'message' on stderr (or, built with AddressSanitizer, with its report
 * when the misuse touched freed memory: 'asan_ok'). */
static void expect_abort(const char *argv0, const char *path, const char *message, int asan_ok)
{
    char err[16384];
    size_t got = 0;
    int p[2], status = 0;
    pid_t pid;

    if (!T_ASSERT(pipe(p) == 0))
        return;
    pid = fork();
    if (pid == 0) {
        char *args[] = { (char *)argv0, "--misuse", (char *)path, NULL };
        dup2(p[1], STDERR_FILENO);
        close(p[0]);
        close(p[1]);
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(p[1]);
    for (;;) {
        ssize_t k = read(p[0], err + got, sizeof err - 1 - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    err[got] = '\0';
    close(p[0]);
    waitpid(pid, &status, 0);
#ifdef T_ASAN
    if (asan_ok && strstr(err, "AddressSanitizer") != NULL) {
        printf("# %s: AddressSanitizer reported the access\n", path);
        T_ASSERT(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
        return;
    }
#else
    (void)asan_ok;
#endif
    T_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    if (!T_ASSERT(strstr(err, message) != NULL))
        printf("# %s: stderr was:\n%s\n", path, err);
    else
        printf("# %s: %s\n", path, message);
}

static const char *self;

static void test_answer_twice_on_a_worker(void)
{
    expect_abort(self, "/twice-worker", "(answered twice?): request", 0);
}

static void test_answer_twice_on_the_event_thread(void)
{
    expect_abort(self, "/twice-fast", "is sent", 0);
}

static void test_answer_after_completion(void)
{
    expect_abort(self, "/after-answer", "is completed and freed", 1);
}

static void test_handler_returns_unanswered(void)
{
    expect_abort(self, "/silent", "returned without answering", 0);
}

static void test_hand_off_after_answer(void)
{
    expect_abort(self, "/handoff-answered", "hand-off by a thread that does not hold", 0);
}

/* Child mode: serve, make the request, give the misuse time to be seen. */
static int misuse_child(const char *argv0, const char *path)
{
    char body[256];

    server_start(argv0);
    get(path, body, sizeof body);
    t_sleep_ms(2000);
    fprintf(stderr, "the misuse of %s went unnoticed\n", path);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--misuse") == 0)
        return misuse_child(argv[0], argv[2]);

    self = argv[0];
    server_start(argv[0]);
    T_RUN(test_every_hand_off_answers);
    T_RUN(test_many_requests);
    T_RUN(test_answer_twice_on_a_worker);
    T_RUN(test_answer_twice_on_the_event_thread);
    T_RUN(test_answer_after_completion);
    T_RUN(test_handler_returns_unanswered);
    T_RUN(test_hand_off_after_answer);
    http_drain(0, 1000);
    http_stop();
    return t_done();
}
