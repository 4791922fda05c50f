/* version: what this binary is - its version (the VERSION file, and the git
 * commit when built from a checkout, baked in at build time) and the
 * versions of the libraries it runs with. */
#ifndef SECKILL_VERSION_H
#define SECKILL_VERSION_H

#include <stddef.h>
#include <stdio.h>

/* "0.1.0 (git 20aa8d5c1f2e)": a static string. */
const char *version_string(void);

/* The two parts of version_string, for metric labels: the version
 * ("0.1.0") and the commit ("20aa8d5c1f2e", "20aa8d5c1f2e-dirty"; empty
 * when not built from a checkout). Truncated to fit. */
void version_parts(char *version, size_t vn, char *revision, size_t rn);

/* The --version text: "seckill <version>", then one line per library
 * ("libmicrohttpd 0.9.75", "hiredis 0.14.1", "libpq 15.14", "cJSON 1.7.15").
 * libmicrohttpd, libpq and cJSON report the version loaded at run time;
 * hiredis 0.14 has no such call, so its line is the version built against. */
void version_print(FILE *out);

#endif
