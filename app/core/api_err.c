/* api: error codes, their statuses and default messages. */
#include "api_err.h"

static const struct {
    const char *code;
    int status;
    const char *message;
} table[API_ERR_COUNT] = {
    [API_OK] = { "ok", 200, "ok" },
    [API_INVALID_VOUCHER_ID] = { "invalid_voucher_id", 400,
                                 "voucher id must be a positive 64-bit decimal integer" },
    [API_INVALID_USER_ID] = { "invalid_user_id", 400,
                              "X-User-Id must be a positive 64-bit decimal integer" },
    [API_INVALID_JSON] = { "invalid_json", 400, "request body is not valid JSON" },
    [API_INVALID_FIELD] = { "invalid_field", 400, "a field is missing or invalid" },
    [API_UNAUTHORIZED] = { "unauthorized", 401, "missing or wrong admin bearer token" },
    [API_ADMIN_DISABLED] = { "admin_disabled", 403, "admin API is disabled (no ADMIN_TOKEN)" },
    [API_VOUCHER_NOT_FOUND] = { "voucher_not_found", 404, "no such voucher" },
    [API_NOT_FOUND] = { "not_found", 404, "no such route" },
    [API_METHOD_NOT_ALLOWED] = { "method_not_allowed", 405, "method not allowed on this route" },
    [API_NOT_STARTED] = { "not_started", 409, "the sale has not started yet" },
    [API_ENDED] = { "ended", 409, "the sale has ended" },
    [API_SOLD_OUT] = { "sold_out", 409, "sold out" },
    [API_ALREADY_ORDERED] = { "already_ordered", 409, "this user already ordered this voucher" },
    [API_BODY_TOO_LARGE] = { "body_too_large", 413, "request body too large" },
    [API_UNAVAILABLE] = { "unavailable", 503, "a backing service is unavailable, retry later" },
    [API_BAD_REQUEST] = { "bad_request", 400, "malformed HTTP request" },
};

const char *api_err_code(api_err e)
{
    return (unsigned)e < API_ERR_COUNT ? table[e].code : "unknown";
}

int api_err_status(api_err e)
{
    return (unsigned)e < API_ERR_COUNT ? table[e].status : 500;
}

const char *api_err_message(api_err e)
{
    return (unsigned)e < API_ERR_COUNT ? table[e].message : "unknown error";
}
