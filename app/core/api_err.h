/* api: the vocabulary of the HTTP API: error codes and the
 * statuses they travel with. Shared by the router, handlers and stats. */
#ifndef SECKILL_API_ERR_H
#define SECKILL_API_ERR_H

typedef enum api_err {
    API_OK = 0,
    API_INVALID_VOUCHER_ID,
    API_INVALID_USER_ID,
    API_INVALID_JSON,
    API_INVALID_FIELD,
    API_UNAUTHORIZED,
    API_ADMIN_DISABLED,
    API_VOUCHER_NOT_FOUND,
    API_NOT_FOUND,
    API_METHOD_NOT_ALLOWED,
    API_NOT_STARTED,
    API_ENDED,
    API_SOLD_OUT,
    API_ALREADY_ORDERED,
    API_BODY_TOO_LARGE,
    API_UNAVAILABLE,
    API_BAD_REQUEST,          /* malformed HTTP (framing, duplicate headers, NUL bytes) */
    API_ERR_COUNT
} api_err;

/* "sold_out", ... ("ok" for API_OK). Static strings. */
const char *api_err_code(api_err e);

/* The HTTP status each code is answered with. */
int api_err_status(api_err e);

/* The 503's message for work not started by its request's deadline
 * (REQUEST_DEADLINE_MS). */
#define API_LATE_MESSAGE "not started before the request's deadline, retry later"

/* Default human message for a code. */
const char *api_err_message(api_err e);

#endif
