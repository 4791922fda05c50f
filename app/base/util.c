/* util: small pure helpers shared by every module. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

static int parse_digits(const char *s, size_t len, int64_t *out)
{
    int64_t v = 0;

    if (s == NULL || len == 0 || len > 19 + 64)   /* leading zeros allowed, bounded */
        return -1;
    for (size_t i = 0; i < len; i++) {
        int d = s[i] - '0';
        if (d < 0 || d > 9)
            return -1;
        if (v > (INT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int util_parse_id(const char *s, size_t len, int64_t *out)
{
    int64_t v;

    if (parse_digits(s, len, &v) != 0 || v <= 0)
        return -1;
    *out = v;
    return 0;
}

int util_parse_u63(const char *s, size_t len, int64_t *out)
{
    return parse_digits(s, len, out);
}

/* Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
 * civil-from-days inverse, derived by hand): timegm without the TZ games. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int take_num(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        char c = (*p)[i];
        if (c < '0' || c > '9')
            return -1;
        v = v * 10 + (c - '0');
    }
    *p += n;
    *out = v;
    return 0;
}

int util_parse_iso8601(const char *s, int64_t *out)
{
    static const int mdays[] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    const char *p = s;
    int y, mo, d, h, mi, sec, off = 0;

    if (s == NULL)
        return -1;
    if (take_num(&p, 4, &y) || *p++ != '-' || take_num(&p, 2, &mo) || *p++ != '-' ||
        take_num(&p, 2, &d))
        return -1;
    if (*p != 'T' && *p != 't' && *p != ' ')
        return -1;
    p++;
    if (take_num(&p, 2, &h) || *p++ != ':' || take_num(&p, 2, &mi) || *p++ != ':' ||
        take_num(&p, 2, &sec))
        return -1;
    if (*p == '.' || *p == ',') {           /* fraction: accepted, truncated */
        p++;
        if (*p < '0' || *p > '9')
            return -1;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int sign = *p++ == '-' ? -1 : 1, oh, om;
        if (take_num(&p, 2, &oh))
            return -1;
        if (*p == ':')
            p++;
        if (take_num(&p, 2, &om) || oh > 23 || om > 59)
            return -1;
        off = sign * (oh * 3600 + om * 60);
    }
    if (*p != '\0')
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || h > 23 || mi > 59 || sec > 60)
        return -1;
    if (mo == 2 && d == 29 && !((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
        return -1;
    if (sec == 60)                          /* leap second: fold into the next */
        sec = 59;
    *out = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - off;
    return 0;
}

void util_format_iso8601(int64_t ts, char *buf, size_t n)
{
    struct tm tm;
    time_t t = (time_t)ts;

    if (gmtime_r(&t, &tm) == NULL || strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
        snprintf(buf, n, "invalid");
}

int64_t util_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

int64_t util_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t util_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Set once at start (TEST_CLOCK_STEP_MS), read-only after. */
static int64_t test_clock_step_ns;

void util_set_test_clock_step_ms(int64_t ms)
{
    test_clock_step_ns = ms * 1000000;
}

void util_deadline(clockid_t clk, int64_t us, struct timespec *out)
{
    int64_t ns;

    clock_gettime(clk, out);
    ns = us * 1000 + (clk == CLOCK_REALTIME ? test_clock_step_ns : 0);
    out->tv_sec += (time_t)(ns / 1000000000);
    out->tv_nsec += (long)(ns % 1000000000);
    if (out->tv_nsec >= 1000000000L) {
        out->tv_sec++;
        out->tv_nsec -= 1000000000L;
    }
}

int util_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    int rc = -1;

    if (pthread_condattr_init(&attr) != 0)
        return -1;
    if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 && pthread_cond_init(cv, &attr) == 0)
        rc = 0;
    pthread_condattr_destroy(&attr);
    return rc;
}

void util_uuid4(char buf[37])
{
    unsigned char b[16];
    size_t got = 0;

    while (got < sizeof b) {
        ssize_t r = getrandom(b + got, sizeof b - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            abort();                        /* no entropy: owner ids would collide */
        }
        got += (size_t)r;
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(buf, 37,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
             b[12], b[13], b[14], b[15]);
}

int util_secret_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char diff = (unsigned char)(la != lb);

    /* Walk the whole of 'a' whatever 'b' holds; length leaks, content does not. */
    for (size_t i = 0; i < la; i++)
        diff |= (unsigned char)(a[i] ^ (i < lb ? b[i] : 0));
    return diff == 0;
}

int util_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + len;

    while (p < end) {
        unsigned c = *p++;
        int more;
        unsigned min, cp;
        if (c < 0x80)
            continue;
        if (c >= 0xc2 && c <= 0xdf) {
            more = 1, min = 0x80, cp = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            more = 2, min = 0x800, cp = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            more = 3, min = 0x10000, cp = c & 0x07;
        } else {
            return 0;
        }
        if (end - p < more)
            return 0;
        while (more-- > 0) {
            if ((*p & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (*p++ & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
    }
    return 1;
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        abort();
    return p;
}

void *xcalloc(size_t n, size_t m)
{
    void *p = calloc(n ? n : 1, m ? m : 1);
    if (p == NULL)
        abort();
    return p;
}

void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (p == NULL)
        abort();
    return p;
}

char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (p == NULL)
        abort();
    return p;
}

void util_thread_name(const char *name)
{
    /* Only a label for tools: a failure (a name too long) changes nothing. */
    (void)pthread_setname_np(pthread_self(), name);
}

util_sbuf util_sbuf_init(char *out, size_t n)
{
    util_sbuf sb = { out, n, 0 };

    if (n > 0)
        out[0] = '\0';
    return sb;
}

void util_sbuf_mem(util_sbuf *sb, const char *s, size_t k)
{
    if (sb->n == 0)
        return;
    if (k > sb->n - 1 - sb->len)
        k = sb->n - 1 - sb->len;
    memcpy(sb->b + sb->len, s, k);
    sb->len += k;
    sb->b[sb->len] = '\0';
}

void util_sbuf_str(util_sbuf *sb, const char *s)
{
    util_sbuf_mem(sb, s, strlen(s));
}

void util_list_init(util_list *it, const char *s)
{
    it->next = s;
    it->last = 0;
}

int util_list_next(util_list *it, const char **s, size_t *len)
{
    const char *comma;

    if (it->next == NULL)
        return 0;
    comma = strchr(it->next, ',');
    *s = it->next;
    *len = comma != NULL ? (size_t)(comma - it->next) : strlen(it->next);
    it->next = comma != NULL ? comma + 1 : NULL;
    it->last = comma == NULL;
    return 1;
}

void util_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}
