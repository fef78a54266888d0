/* The offload thread (offload.c): slow work off the HTTP loops. */
#ifndef GW_OFFLOAD_H
#define GW_OFFLOAD_H

#include "gw_server.h"

int gw_offload_start(gw_server_t *srv);
/* Runs fn(arg) on the offload thread. */
void gw_offload(gw_server_t *srv, void (*fn)(void *arg), void *arg);
void gw_offload_stop(gw_server_t *srv);

#endif
