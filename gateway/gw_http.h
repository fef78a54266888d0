/* HTTP plumbing shared by squishd's route files: the request context, the
 * route table and JSON/error response helpers. Everything here runs on an
 * HTTP loop thread and must not block. */
#ifndef GW_HTTP_H
#define GW_HTTP_H

#include "gw_int.h"

#include <h2o.h>
#include <jansson.h>

#define GW_MAX_ROUTE_ARGS 4

/* What a route handler gets: the request, the server, and the path segments
 * matched by '*' in the route's pattern (borrowed from the request). */
typedef struct {
    h2o_req_t *req;
    gw_server_t *srv;
    h2o_iovec_t args[GW_MAX_ROUTE_ARGS];
    int nargs;
} gw_call_t;

typedef void (*gw_route_fn)(gw_call_t *call);

typedef struct {
    const char *method;  /* "GET", "POST", "DELETE" */
    const char *pattern; /* "/v2/models/ * /ready" without spaces: '*' matches one segment */
    const char *name;    /* route label for logs and metrics */
    gw_route_fn fn;
} gw_route_t;

/* Sends obj (stolen) as JSON with the status. */
void gw_send_json(h2o_req_t *req, int status, json_t *obj);
/* Sends {"error": detail or the default message, "code": name} with the
 * error's HTTP status; a 503 carries Retry-After. */
void gw_send_error(h2o_req_t *req, int err, const char *detail);
/* Adds a response header (name is lower-case). */
void gw_add_header(h2o_req_t *req, const char *name, const char *value);

#endif
