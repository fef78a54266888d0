/* api/: squishd's HTTP API: the route table (routes.c) and its handlers,
 * one file per area (inference, complex queries, models, pipelines, Triton's
 * model repository, metrics). The room's public face is the table alone. */
#ifndef GW_API_H
#define GW_API_H

#include "gw_http.h"

/* What squishd's HTTP loops serve (routes.c). */
extern const gw_http_app_t gw_http_app;

#endif
