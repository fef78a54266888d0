/* The OIP decoder's shared pieces, below both the request walk (oip.c)
 * and the tensor data readers (oip_data.c): datatype names, errors with
 * their JSON path, the request's arena, array iteration, and the typed
 * values (keys, booleans, integers, strings, region names) the walk reads,
 * each failing with its path. */
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

/* ---- values with their errors ---- */

/* Next member of an object whose '{' was consumed: 1 with the key (keys
 * longer than keycap - 1 come back truncated and match nothing known), 0 at
 * the end, <0 on error. */
int oip_next_key(oip_dec_t *d, oip_cur_t *c, int *first, char *key, size_t keycap)
{
    if (!*first && !oip_accept(c, ',')) {
        if (oip_accept(c, '}'))
            return 0;
        return oip_malformed(d);
    }
    if (*first) {
        *first = 0;
        if (oip_accept(c, '}'))
            return 0;
    }
    const char *s;
    size_t n;
    int esc;
    if (oip_string(c, &s, &n, &esc) != 0 || !oip_accept(c, ':'))
        return oip_malformed(d);
    if (esc) {
        char tmp[128];
        if (n < sizeof(tmp)) {
            n = oip_unescape(s, n, tmp);
            s = tmp;
        }
        /* A key past 127 escaped bytes is unknown anyway. */
        if (n >= keycap)
            n = keycap - 1;
        memcpy(key, s, n);
    } else {
        if (n >= keycap)
            n = keycap - 1;
        memcpy(key, s, n);
    }
    key[n] = '\0';
    if (memchr(key, '\0', n) != NULL)
        key[0] = '\x01'; /* a key holding \u0000 matches nothing */
    return 1;
}

int oip_skip_value(oip_dec_t *d, oip_cur_t *c)
{
    return oip_skip(c) == 0 ? 0 : oip_malformed(d);
}

/* Reads a boolean value; SQ_BAD_REQUEST naming the path otherwise. */
int oip_read_bool(oip_dec_t *d, oip_cur_t *c, int *out)
{
    char ch = oip_peek(c);
    if (ch == 't' || ch == 'f') {
        *out = ch == 't';
        return oip_skip_value(d, c);
    }
    return oip_fail(d, SQ_BAD_REQUEST, "expected true or false");
}

int oip_is_number_start(char ch)
{
    return ch == '-' || (ch >= '0' && ch <= '9');
}

/* An integer in [min, max], else SQ_BAD_REQUEST with what. */
int oip_read_int(oip_dec_t *d, oip_cur_t *c, int64_t min, int64_t max, int64_t *out,
                 const char *what)
{
    const char *s;
    size_t n;
    if (!oip_is_number_start(oip_peek(c)) || oip_number(c, &s, &n) != 0 ||
        oip_parse_int(s, n, min, max, out) != 0)
        return oip_fail(d, SQ_BAD_REQUEST, "expected %s", what);
    return 0;
}

/* A string value unescaped into out (cap bytes with the NUL); *len gets the
 * full length even when it did not fit. */
int oip_read_string(oip_dec_t *d, oip_cur_t *c, char *out, size_t cap, size_t *len)
{
    const char *s;
    size_t n;
    int esc;
    if (oip_peek(c) != '"')
        return oip_fail(d, SQ_BAD_REQUEST, "expected a string");
    if (oip_string(c, &s, &n, &esc) != 0)
        return oip_malformed(d);
    if (!esc) {
        *len = n;
        size_t k = n < cap - 1 ? n : cap - 1;
        memcpy(out, s, k);
        out[k] = '\0';
        return 0;
    }
    char *tmp = malloc(n ? n : 1);
    if (tmp == NULL)
        return oip_fail(d, SQ_NOMEM, "out of memory");
    size_t u = oip_unescape(s, n, tmp);
    *len = u;
    size_t k = u < cap - 1 ? u : cap - 1;
    memcpy(out, tmp, k);
    out[k] = '\0';
    free(tmp);
    return 0;
}

/* parameters.shared_memory_region: the name of a region, 1..GW_OIP_REGION_MAX
 * bytes without NUL (whether it is registered is the caller's to say). A
 * route whose model description does not take shared memory refuses it. */
int oip_read_region(oip_dec_t *d, oip_cur_t *c, char *out)
{
    if (!d->model->shared_memory)
        return oip_fail(d, SQ_BAD_REQUEST,
                        "shared-memory tensors are not taken on this route: send the data in the "
                        "body");
    char tmp[GW_OIP_REGION_MAX + 2];
    size_t len;
    int rc = oip_read_string(d, c, tmp, sizeof(tmp), &len);
    if (rc != 0)
        return rc;
    if (len == 0 || len > GW_OIP_REGION_MAX || strlen(tmp) != len)
        return oip_fail(d, SQ_BAD_REQUEST,
                        "expected the name of a registered shared-memory region (1..%d bytes)",
                        GW_OIP_REGION_MAX);
    memcpy(out, tmp, len + 1);
    return 0;
}
