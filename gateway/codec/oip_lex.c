/* The OIP decoder's shared pieces, below both the request walk (oip.c)
 * and the tensor data readers (oip_data.c): datatype names, errors with
 * their JSON path, the request's arena, array iteration. */
#include "gw_codec.h"
#include "oip_int.h"

#include <sq.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const datatype_names[] = {
    [GW_OIP_FP32] = "FP32",
    [GW_OIP_UINT8] = "UINT8",
    [GW_OIP_BYTES] = "BYTES",
};
_Static_assert(sizeof(datatype_names) / sizeof(datatype_names[0]) == GW_OIP_DATATYPE_COUNT_,
               "one name per datatype");

const char *gw_oip_datatype_name(gw_oip_datatype_t dt)
{
    return (unsigned)dt < GW_OIP_DATATYPE_COUNT_ ? datatype_names[dt] : "?";
}

size_t gw_oip_datatype_size(gw_oip_datatype_t dt)
{
    return dt == GW_OIP_FP32 ? 4 : dt == GW_OIP_UINT8 ? 1 : 0;
}

/* ---- error paths ---- */

int oip_fail(oip_dec_t *d, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (d->plen > 0)
        snprintf(d->err, d->errlen, "%s: %s", d->path, msg);
    else
        snprintf(d->err, d->errlen, "%s", msg);
    return code;
}

/* Appends text to the path, cut where the path is full, as snprintf
 * would: every key and index of every request pushes onto it, so without
 * printf's cost. */
static void path_put(oip_dec_t *d, const char *text, size_t n)
{
    size_t room = sizeof(d->path) - 1 - d->plen;
    if (n > room)
        n = room;
    memcpy(d->path + d->plen, text, n);
    d->plen += n;
    d->path[d->plen] = '\0';
}

size_t oip_path_key(oip_dec_t *d, const char *key)
{
    size_t old = d->plen;
    if (old > 0)
        path_put(d, ".", 1);
    path_put(d, key, strlen(key));
    return old;
}

size_t oip_path_index(oip_dec_t *d, size_t i)
{
    size_t old = d->plen;
    char text[24];
    size_t at = sizeof(text);
    text[--at] = ']';
    do
        text[--at] = (char)('0' + i % 10);
    while ((i /= 10) != 0);
    text[--at] = '[';
    path_put(d, text + at, sizeof(text) - at);
    return old;
}

void oip_path_pop(oip_dec_t *d, size_t old)
{
    d->plen = old;
    d->path[old] = '\0';
}

/* The validated text disagrees with the lexer: cannot happen, but must not
 * crash either. */
int oip_malformed(oip_dec_t *d)
{
    return oip_fail(d, SQ_BAD_JSON, "malformed JSON");
}

/* "[N,3,224,224]" (batch < 0) or "[2,3,224,224]". */
void oip_shape_str(char *buf, size_t cap, long long batch, const int64_t *item, int ndim)
{
    size_t o = 0;
    int n = batch < 0 ? snprintf(buf, cap, "[N") : snprintf(buf, cap, "[%lld", batch);
    o = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < ndim && o < cap; i++) {
        n = snprintf(buf + o, cap - o, ",%lld", (long long)item[i]);
        o += n > 0 ? (size_t)n : 0;
    }
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

/* ---- memory the request owns ---- */

void *oip_req_alloc(gw_oip_request_t *r, size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL)
        return NULL;
    if (r->nowned_ == r->owned_cap_) {
        r->owned_cap_ = r->owned_cap_ ? 2 * r->owned_cap_ : 8;
        r->owned_ = sq_xrealloc(r->owned_, (size_t)r->owned_cap_ * sizeof(void *));
    }
    r->owned_[r->nowned_++] = p;
    return p;
}

/* Next element of an array whose '[' was consumed: 1, 0 at the end. */
int oip_next_elem(oip_dec_t *d, oip_cur_t *c, int *first)
{
    if (*first) {
        *first = 0;
        return oip_accept(c, ']') ? 0 : 1;
    }
    if (oip_accept(c, ','))
        return 1;
    if (oip_accept(c, ']'))
        return 0;
    return oip_malformed(d);
}
