/* libFuzzer target: the admin API's JSON bodies (create, reset and replay). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "payload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    payload_voucher v;
    const char *why;
    api_err e;
    int64_t max;

    e = payload_voucher_create((const char *)data, size, &v, &why);
    if (e == API_OK) {
        /* What passes validation is what the database may be given. */
        if (v.title[0] == '\0' || strlen(v.title) > PAYLOAD_TITLE_MAX || v.stock < 0 ||
            v.begin_time < 0 || v.end_time < v.begin_time)
            abort();
    } else if ((e != API_INVALID_JSON && e != API_INVALID_FIELD) || why == NULL) {
        abort();
    }
    e = payload_voucher_reset((const char *)data, size, &v, &why);
    if (e == API_OK && (v.stock < 0 || (v.begin_time >= 0 && v.end_time >= 0 &&
                                        v.end_time < v.begin_time)))
        abort();
    e = payload_replay((const char *)data, size, &max, &why);
    if (e == API_OK ? max < 1 || max > PAYLOAD_REPLAY_MAX
                    : (e != API_INVALID_JSON && e != API_INVALID_FIELD) || why == NULL)
        abort();
    return 0;
}
