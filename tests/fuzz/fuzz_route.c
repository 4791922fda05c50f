/* libFuzzer target: the request line as the router and the validators see
 * it. Input: "<METHOD> <path>\n<X-User-Id value>\n<ISO-8601 text>". */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "http.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The next '\n'-terminated piece of the input, NUL-terminated in 'buf'. */
static const uint8_t *piece(const uint8_t *p, const uint8_t *end, char *buf, size_t cap)
{
    size_t n = 0;

    while (p < end && *p != '\n' && n + 1 < cap)
        buf[n++] = (char)*p++;
    buf[n] = '\0';
    return p < end ? p + 1 : end;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char line[4096], uid[256], when[256], allow[64];
    const uint8_t *p = data, *end = data + size;
    const char *method = line, *path, *arg;
    size_t arg_len;
    int64_t v;
    int i;

    p = piece(p, end, line, sizeof line);
    p = piece(p, end, uid, sizeof uid);
    piece(p, end, when, sizeof when);

    char *space = strchr(line, ' ');
    path = space ? space + 1 : "";
    if (space)
        *space = '\0';

    i = http_route_find(handlers_routes, handlers_route_count, method, path, &arg, &arg_len,
                        allow, sizeof allow);
    if (i >= 0) {
        /* The '*' segment lies inside the path, and parses or is refused. */
        if (arg < path || arg + arg_len > path + strlen(path))
            abort();
        if (util_parse_id(arg, arg_len, &v) == 0 && v <= 0)
            abort();
    } else if (i != HTTP_ROUTE_NONE) {
        if (strlen(allow) == 0 || strlen(allow) >= sizeof allow)
            abort();
    }
    if (util_parse_id(uid, strlen(uid), &v) == 0 && v <= 0)
        abort();
    if (util_parse_iso8601(when, &v) == 0) {
        char back[32];
        util_format_iso8601(v, back, sizeof back);
    }
    util_utf8_valid(line, strlen(line));
    return 0;
}
