/* http_response: building an answer and handing it to libmicrohttpd, or
 * keeping it for the event thread (http_response.h). */
#include "http_response.h"
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic int closing;        /* the drain has begun */

void http_response_close_begin(void)
{
    atomic_store(&closing, 1);
}

int http_response_closing(void)
{
    return atomic_load_explicit(&closing, memory_order_relaxed);
}

void http_response_close_if_closing(struct MHD_Response *resp)
{
    if (http_response_closing() &&
        MHD_get_response_header(resp, MHD_HTTP_HEADER_CONNECTION) == NULL)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

/* Makes the answer 'resp' (NULL: none could be built: the connection
 * closes): straight to libmicrohttpd on the event thread, else kept for the
 * event thread; a handed-off request goes back to it at once. */
static http_outcome answer(http_req *r, int status, struct MHD_Response *resp,
                           const char *content_type)
{
    int was;

    if (resp != NULL) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
        MHD_add_response_header(resp, "X-Instance-Id", g_cfg.instance_id);
        MHD_add_response_header(resp, "X-Request-Id", r->request_id);
        if (status == 503) {
            char ra[16];
            snprintf(ra, sizeof ra, "%d", g_cfg.retry_after_s);
            MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, ra);
        }
        r->status = status;
    }
    was = http_request_move(r, HTTP_REQUEST_ANSWERABLE, HTTP_ST_ANSWERED,
                            HTTP_REQUEST_ANSWER_MISUSE);
    if (was == HTTP_ST_READING) {
        /* On the event thread, inside libmicrohttpd's callback. */
        if (resp != NULL)
            http_response_close_if_closing(resp);
        if (resp == NULL || MHD_queue_response(r->conn, (unsigned)status, resp) != MHD_YES)
            r->close = 1;
        if (resp != NULL)
            MHD_destroy_response(resp);        /* MHD keeps its own reference */
        http_request_move(r, HTTP_REQUEST_BIT(HTTP_ST_ANSWERED), HTTP_ST_SENT, "answer");
        return HTTP_ANSWERED;
    }
    /* Suspended: the event thread queues it at resume. */
    r->held = resp;
    r->close = resp == NULL;
    if (was == HTTP_ST_HANDED)
        http_request_resume(r, "answer");    /* its holder is done with it */
    return HTTP_ANSWERED;
}

http_outcome http_send_text(http_req *r, int status, const char *content_type, char *text,
                            size_t len)
{
    struct MHD_Response *resp;

    http_request_check(r, HTTP_REQUEST_ANSWERABLE, HTTP_REQUEST_ANSWER_MISUSE);
    resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (resp == NULL)
        free(text);
    return answer(r, status, resp, content_type);
}

http_outcome http_send_json(http_req *r, int status, cJSON *body)
{
    char *text;

    http_request_check(r, HTTP_REQUEST_ANSWERABLE, HTTP_REQUEST_ANSWER_MISUSE);
    text = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    if (text == NULL)
        return answer(r, status, NULL, NULL);
    return http_send_text(r, status, "application/json", text, strlen(text));
}

/* {"error":code,"message":message}, printed by cJSON (escaped as JSON);
 * NULL when out of memory. The caller frees it. */
static char *error_body(api_err e, const char *message)
{
    cJSON *o = cJSON_CreateObject();
    char *text;

    cJSON_AddStringToObject(o, "error", api_err_code(e));
    cJSON_AddStringToObject(o, "message", message ? message : api_err_message(e));
    text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* Each error's body with its own message, printed once for the process's
 * life (a sold-out crowd gets the same bytes each time): no JSON printing
 * and no allocation per answer. An entry that could not be printed stays
 * NULL, and its answers print their body as any other. */
static char *prebuilt[API_ERR_COUNT];
static size_t prebuilt_len[API_ERR_COUNT];
static pthread_once_t prebuilt_once = PTHREAD_ONCE_INIT;

static void prebuild(void)
{
    for (int e = 0; e < API_ERR_COUNT; e++) {
        prebuilt[e] = error_body((api_err)e, NULL);
        prebuilt_len[e] = prebuilt[e] ? strlen(prebuilt[e]) : 0;
    }
}

static http_outcome send_error_with(http_req *r, api_err e, const char *message,
                                    const char *hdr_name, const char *hdr_value)
{
    struct MHD_Response *resp = NULL;
    char *text;

    http_request_check(r, HTTP_REQUEST_ANSWERABLE, HTTP_REQUEST_ANSWER_MISUSE);
    pthread_once(&prebuilt_once, prebuild);
    if (message == NULL && e >= 0 && e < API_ERR_COUNT && prebuilt[e] != NULL) {
        resp = MHD_create_response_from_buffer(prebuilt_len[e], prebuilt[e], MHD_RESPMEM_PERSISTENT);
    } else if ((text = error_body(e, message)) != NULL) {
        resp = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (resp == NULL)
            free(text);
    }
    if (resp != NULL && hdr_name != NULL)
        MHD_add_response_header(resp, hdr_name, hdr_value);
    r->err = e;
    return answer(r, api_err_status(e), resp, "application/json");
}

http_outcome http_send_error(http_req *r, api_err e, const char *message)
{
    return send_error_with(r, e, message, NULL, NULL);
}

http_outcome http_send_error_header(http_req *r, api_err e, const char *message,
                                    const char *name, const char *value)
{
    return send_error_with(r, e, message, name, value);
}
