/* The route table's lookup: a request's method and path against the
 * routes' patterns, '*' capturing a segment; 405's Allow. */
#include "http_int.h"

#include <string.h>

/* Matches a path against a pattern segment by segment; '*' captures one
 * non-empty segment. */
static int match(const char *pattern, const char *path, size_t len, gw_call_t *call)
{
    const char *p = pattern, *s = path, *end = path + len;
    call->nargs = 0;
    while (*p != '\0' && s < end) {
        if (*p != '/' || *s != '/')
            return 0;
        p++, s++;
        const char *seg = s;
        while (s < end && *s != '/')
            s++;
        size_t seglen = (size_t)(s - seg);
        if (*p == '*') {
            if (seglen == 0 || call->nargs == GW_MAX_ROUTE_ARGS)
                return 0;
            call->args[call->nargs++] = h2o_iovec_init(seg, seglen);
            p++;
        } else {
            const char *pe = p;
            while (*pe != '\0' && *pe != '/')
                pe++;
            if ((size_t)(pe - p) != seglen || memcmp(p, seg, seglen) != 0)
                return 0;
            p = pe;
        }
    }
    return *p == '\0' && s == end;
}

const gw_route_t *gw__route_find(const gw_http_app_t *app, h2o_iovec_t method, h2o_iovec_t path,
                                 gw_call_t *call, char *allow, size_t allowlen)
{
    /* Trailing slashes are not significant ("/v2/" is "/v2"). */
    while (path.len > 1 && path.base[path.len - 1] == '/')
        path.len--;
    allow[0] = '\0';
    const gw_route_t *routes = app->routes;
    for (size_t i = 0; i < app->nroutes; i++) {
        if (!match(routes[i].pattern, path.base, path.len, call))
            continue;
        if (h2o_memis(method.base, method.len, routes[i].method, strlen(routes[i].method)))
            return &routes[i];
        /* ", " and the method, and the NUL, if they fit. */
        size_t used = strlen(allow), mlen = strlen(routes[i].method);
        if (strstr(allow, routes[i].method) == NULL && used + 2 + mlen < allowlen) {
            if (allow[0] != '\0')
                strcat(allow, ", ");
            strcat(allow, routes[i].method);
        }
    }
    return NULL;
}

int gw_http_forwarded(const gw_http_app_t *app, const char *method, const char *path)
{
    gw_call_t call = {0};
    char allow[64];
    const gw_route_t *route =
        gw__route_find(app, h2o_iovec_init(method, strlen(method)),
                       h2o_iovec_init(path, strlen(path)), &call, allow, sizeof(allow));
    return route != NULL && !route->on_frontend && app->forward != NULL;
}
