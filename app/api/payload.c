/* payload: admin request bodies. */
#include "payload.h"
#include "util.h"

#include <cJSON.h>
#include <string.h>

/* The body as one JSON value and nothing else. NULL: not JSON. */
static cJSON *parse(const char *body, size_t len)
{
    const char *end = NULL;
    cJSON *doc;

    if (body == NULL || len == 0 || memchr(body, '\0', len) != NULL || !util_utf8_valid(body, len))
        return NULL;
    /* cJSON's "require NUL" check fails on length-bounded input, so the
     * trailing bytes are checked here: only whitespace may follow the value. */
    doc = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (doc == NULL)
        return NULL;
    while (end < body + len && (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n'))
        end++;
    if (end != body + len) {
        cJSON_Delete(doc);
        return NULL;
    }
    return doc;
}

/* A whole number 0..PAYLOAD_COUNT_MAX in a JSON number. */
static int get_count(const cJSON *o, const char *name, int64_t *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);
    double d;

    if (!cJSON_IsNumber(it))
        return -1;
    d = it->valuedouble;
    /* Past 2^53 - 1 a double no longer holds every integer: 2^53 + 1 would
     * arrive as 2^53 and be stored as something the client did not send.
     * And cJSON prints a number with 15 significant digits (then 17 only
     * when those do not read back within its tolerance): from 10^15 on, a
     * stock would come back in /voucher and /stats as an approximation or
     * in exponent form. So at most 15 digits. */
    if (!(d >= 0 && d <= (double)PAYLOAD_COUNT_MAX) || d != (double)(int64_t)d)
        return -1;
    *out = (int64_t)d;
    return 0;
}

/* Optional ISO-8601 time: 1 present, 0 absent, -1 invalid. */
static int get_time(const cJSON *o, const char *name, int64_t *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);

    *out = -1;
    if (it == NULL || cJSON_IsNull(it))
        return 0;
    if (!cJSON_IsString(it) || util_parse_iso8601(it->valuestring, out) != 0 || *out < 0 ||
        *out > 253402300799LL) {      /* 9999-12-31T23:59:59Z */
        *out = -1;
        return -1;
    }
    return 1;
}

static int has_escaped_nul(const char *s, size_t len)
{
    for (size_t i = 0; i + 6 <= len; i++)
        if (s[i] == '\\' && (s[i + 1] == 'u' || s[i + 1] == 'U') && s[i + 2] == '0' &&
            s[i + 3] == '0' && s[i + 4] == '0' && s[i + 5] == '0')
            return 1;
    return 0;
}

static api_err voucher(const char *body, size_t len, payload_voucher *out, const char **why,
                       int create)
{
    cJSON *doc;
    const cJSON *title;
    int hb, he;
    api_err err = API_INVALID_FIELD;

    memset(out, 0, sizeof *out);
    *why = NULL;
    /* "\u0000" decodes to a NUL that would silently cut a string short. */
    if (body != NULL && has_escaped_nul(body, len)) {
        *why = "strings must not contain NUL characters";
        return API_INVALID_FIELD;
    }
    if ((doc = parse(body, len)) == NULL) {
        *why = "request body is not valid JSON";
        return API_INVALID_JSON;
    }
    if (!cJSON_IsObject(doc)) {
        *why = "the body must be a JSON object";
        goto out;
    }
    if (create) {
        title = cJSON_GetObjectItemCaseSensitive(doc, "title");
        if (!cJSON_IsString(title) || title->valuestring[0] == '\0' ||
            strlen(title->valuestring) > PAYLOAD_TITLE_MAX) {
            *why = "title must be a non-empty string of at most 200 bytes";
            goto out;
        }
        memcpy(out->title, title->valuestring, strlen(title->valuestring) + 1);
    }
    if (get_count(doc, "stock", &out->stock) != 0) {
        *why = "stock must be a whole number from 0 to 999999999999999";
        goto out;
    }
    hb = get_time(doc, "beginTime", &out->begin_time);
    he = get_time(doc, "endTime", &out->end_time);
    if (hb < 0 || (create && hb == 0)) {
        *why = "beginTime must be an ISO-8601 date-time";
        goto out;
    }
    if (he < 0 || (create && he == 0)) {
        *why = "endTime must be an ISO-8601 date-time";
        goto out;
    }
    if (hb == 1 && he == 1 && out->end_time < out->begin_time) {
        *why = "endTime is before beginTime";
        goto out;
    }
    err = API_OK;
out:
    cJSON_Delete(doc);
    return err;
}

api_err payload_voucher_create(const char *body, size_t len, payload_voucher *out,
                               const char **why)
{
    return voucher(body, len, out, why, 1);
}

api_err payload_voucher_reset(const char *body, size_t len, payload_voucher *out,
                              const char **why)
{
    return voucher(body, len, out, why, 0);
}

api_err payload_replay(const char *body, size_t len, int64_t *max, const char **why)
{
    cJSON *doc;
    api_err err = API_INVALID_FIELD;

    *max = PAYLOAD_REPLAY_DEFAULT;
    *why = NULL;
    if (body == NULL || len == 0)
        return API_OK;
    if ((doc = parse(body, len)) == NULL) {
        *why = "request body is not valid JSON";
        return API_INVALID_JSON;
    }
    if (!cJSON_IsObject(doc)) {
        *why = "the body must be a JSON object";
        goto out;
    }
    if (cJSON_GetObjectItemCaseSensitive(doc, "max") != NULL &&
        (get_count(doc, "max", max) != 0 || *max < 1 || *max > PAYLOAD_REPLAY_MAX)) {
        *max = PAYLOAD_REPLAY_DEFAULT;
        *why = "max must be a whole number from 1 to 10000";
        goto out;
    }
    err = API_OK;
out:
    cJSON_Delete(doc);
    return err;
}
