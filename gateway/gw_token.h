/* The admin token (token.c). */
#ifndef GW_TOKEN_H
#define GW_TOKEN_H

#include "gw_server.h"

#include <stddef.h>

/* Reads it, or creates a random one (mode 0600) on first
 * start. A token file readable by group or others is refused. */
int gw_token_load(gw_server_t *srv, char *err, size_t errlen);
/* Constant-time comparison of a presented bearer token with the admin one. */
int gw_token_matches(const gw_server_t *srv, const char *presented, size_t len);

#endif
