/* What a route reads of its request: header values, the body (in place or
 * copied), query parameters and {version} path segments. */
#include "http_int.h"

#include <stdlib.h>
#include <string.h>

int gw_request_body(h2o_req_t *req, const uint8_t **data, size_t *len, uint8_t **owned)
{
    *owned = NULL;
    *len = req->entity.len;
    if (req->version < 0x200 || req->entity.len == 0) {
        *data = (const uint8_t *)req->entity.base;
        return 0;
    }
    uint8_t *copy = malloc(req->entity.len);
    if (copy == NULL)
        return SQ_OVERLOAD;
    memcpy(copy, req->entity.base, req->entity.len);
    *data = *owned = copy;
    return 0;
}

h2o_iovec_t gw_header(h2o_req_t *req, const char *name)
{
    ssize_t i = h2o_find_header_by_str(&req->headers, name, strlen(name), -1);
    if (i < 0)
        return h2o_iovec_init(NULL, 0);
    return req->headers.entries[i].value;
}

int gw_parse_version(h2o_iovec_t v)
{
    if (v.len == 0 || v.len > 10)
        return -1;
    long long n = 0;
    for (size_t i = 0; i < v.len; i++) {
        if (v.base[i] < '0' || v.base[i] > '9')
            return -1;
        n = n * 10 + (v.base[i] - '0');
    }
    return n >= 1 && n <= 1000000000 ? (int)n : -1;
}

int gw_query_param(h2o_req_t *req, const char *name, char *out, size_t outlen)
{
    if (req->query_at == SIZE_MAX)
        return 0;
    const char *p = req->path.base + req->query_at + 1, *end = req->path.base + req->path.len;
    size_t nlen = strlen(name);
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *pe = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(pe - p));
        const char *ke = eq ? eq : pe;
        if ((size_t)(ke - p) == nlen && memcmp(p, name, nlen) == 0) {
            size_t o = 0;
            for (const char *v = eq ? eq + 1 : pe; v < pe && o + 1 < outlen; v++) {
                if (*v == '%' && v + 2 < pe && sq_hexval(v[1]) >= 0 && sq_hexval(v[2]) >= 0) {
                    out[o++] = (char)(sq_hexval(v[1]) * 16 + sq_hexval(v[2]));
                    v += 2;
                } else {
                    out[o++] = *v == '+' ? ' ' : *v;
                }
            }
            out[o] = '\0';
            return 1;
        }
        p = pe + 1;
    }
    return 0;
}
