/* config_machine: the defaults that depend on the machine, and the token file. */
#include "config_machine.h"
#include "config_check.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "<hostname>-<port>", the hostname cut and with characters INSTANCE_ID
 * does not allow replaced by '-'; "seckill-<port>" without a hostname. */
static void default_instance_id(config *c)
{
    char host[256];

    if (gethostname(host, sizeof host) != 0 || host[0] == '\0') {
        snprintf(c->instance_id, sizeof c->instance_id, "seckill-%d", c->port);
        return;
    }
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        if (!config_check_instance_char(*p))
            *p = '-';
    /* 63 bytes at most: room for "-65535". */
    snprintf(c->instance_id, sizeof c->instance_id, "%.56s-%d", host, c->port);
}

/* ADMIN_TOKEN_FILE -> c->admin_token (config_check refused both set). 0,
 * or -1 after a message. */
static int read_admin_token_file(config *c)
{
    const char *path = c->admin_token_file;
    char buf[sizeof c->admin_token + 8];
    size_t len;
    int rc = -1;
    FILE *f;

    f = fopen(path, "r");
    if (f == NULL) {
        log_error("cannot read ADMIN_TOKEN_FILE '%s': %s", path, strerror(errno));
        return -1;
    }
    len = fread(buf, 1, sizeof buf - 1, f);
    if (ferror(f)) {
        log_error("cannot read ADMIN_TOKEN_FILE '%s': %s", path, strerror(errno));
        goto out;
    }
    buf[len] = '\0';
    if (memchr(buf, '\0', len) != NULL) {
        log_error("ADMIN_TOKEN_FILE '%s' holds a NUL byte", path);
        goto out;
    }
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        buf[--len] = '\0';
    if (len == 0) {
        log_error("ADMIN_TOKEN_FILE '%s' is empty", path);
        goto out;
    }
    if (len >= sizeof c->admin_token || !feof(f)) {
        log_error("ADMIN_TOKEN_FILE '%s': the token is too long (at most %zu bytes)", path,
                  sizeof c->admin_token - 1);
        goto out;
    }
    memcpy(c->admin_token, buf, len + 1);
    rc = 0;
out:
    fclose(f);
    return rc;
}

static int dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* ./lua when run from the checkout, else lua/ beside or above the binary. */
static void default_lua_dir(config *c)
{
    static const char *const rel[] = { "/../lua", "/../../lua", "/../../../lua", "/lua" };
    char exe[PATH_MAX];
    ssize_t n;

    if (dir_exists("lua")) {
        snprintf(c->lua_dir, sizeof c->lua_dir, "lua");
        return;
    }
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL)
            *slash = '\0';
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            char cand[PATH_MAX + 16];
            snprintf(cand, sizeof cand, "%s%s", exe, rel[i]);
            size_t len = strlen(cand);
            if (dir_exists(cand) && len < sizeof c->lua_dir) {
                memcpy(c->lua_dir, cand, len + 1);
                return;
            }
        }
    }
    snprintf(c->lua_dir, sizeof c->lua_dir, "lua");
}

int config_machine_fill(config *c)
{
    if (c->instance_id[0] == '\0')
        default_instance_id(c);
    if (c->admin_token_file[0] != '\0' && read_admin_token_file(c) != 0)
        return -1;
    if (c->lua_dir[0] == '\0')
        default_lua_dir(c);
    util_uuid4(c->instance_uuid);
    return 0;
}
