/* config_machine: what the settings take from the machine, once at load
 * after config_check: INSTANCE_ID's default (the hostname and the port),
 * ADMIN_TOKEN from ADMIN_TOKEN_FILE, LUA_DIR's default (./lua, or lua/
 * found from the binary's path) and the process's random instance_uuid. */
#ifndef SECKILL_CONFIG_MACHINE_H
#define SECKILL_CONFIG_MACHINE_H

#include "config.h"

/* Fills those fields of 'c' that are unset. 0, or -1 after logging why
 * ADMIN_TOKEN_FILE could not be used. */
int config_machine_fill(config *c);

#endif
