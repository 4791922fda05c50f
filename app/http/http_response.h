/* http_response: the answers. Whoever holds a request (its event thread,
 * its worker, or the thread it was handed to) answers it with exactly one
 * http_send_* call, and that call is also the hand-back: on the event
 * thread the answer goes to libmicrohttpd at once; on any other thread it
 * is kept in the request, which goes back to its event thread to be sent.
 * After the call the caller must not touch the request (it may be freed at
 * once; a second answer stops the process). */
#ifndef SECKILL_HTTP_RESPONSE_H
#define SECKILL_HTTP_RESPONSE_H

#include <stddef.h>
#include <cJSON.h>
#include <microhttpd.h>

#include "api_err.h"
#include "http_request.h"

/* Each may be called once per request, by whoever holds it, and returns
 * HTTP_ANSWERED. An answer that cannot be built closes the connection
 * instead. */

/* Sends 'body' (taken: freed here) with 'status'. */
http_outcome http_send_json(http_req *r, int status, cJSON *body);

/* Sends 'len' bytes of 'text' (taken: freed here with free()). */
http_outcome http_send_text(http_req *r, int status, const char *content_type, char *text,
                            size_t len);

/* Sends {"error":code,"message":...} with the code's status ('message' NULL:
 * the default text). Adds Retry-After to 503. */
http_outcome http_send_error(http_req *r, api_err e, const char *message);

/* The same with one more response header 'name: value' (both borrowed). */
http_outcome http_send_error_header(http_req *r, api_err e, const char *message,
                                    const char *name, const char *value);

/*---- the HTTP layer's own ----*/

/* From now on every answer asks its client to close the connection after
 * it (the drain: each open connection carries at most one more request).
 * Any thread; not undone. */
void http_response_close_begin(void);

/* 1 once http_response_close_begin ran. Any thread. */
int http_response_closing(void);

/* Adds "Connection: close" to 'resp' when closing: called on the event
 * thread where an answer is handed to libmicrohttpd, so that an answer
 * made before the drain began gets it too. */
void http_response_close_if_closing(struct MHD_Response *resp);

#endif
