/* Content codings: request bodies sent with Content-Encoding gzip or
 * deflate are inflated, in steps, so that http.c can move a long one off
 * the HTTP loop. */
#include "http_int.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

/* ---- request bodies -------------------------------------------------------- */

struct gw_inflate {
    z_stream z;
    int ready; /* z is initialised */
    int gzip;  /* named gzip (else deflate) */
    int raw;   /* deflate's second try: raw, without the zlib wrapper */
    const uint8_t *in;
    size_t in_len;
    uint8_t *out;
    size_t cap, n;
    int64_t limit;
};

static int coding_is(h2o_iovec_t v, const char *name)
{
    size_t len = strlen(name);
    return v.len == len && strncasecmp(v.base, name, len) == 0;
}

/* (Re)starts the stream from the first byte of the input: gzip or zlib
 * (told apart by their headers), or raw deflate on the second try. */
static int inflate_begin(gw_inflate_t *z)
{
    if (z->ready)
        inflateEnd(&z->z);
    memset(&z->z, 0, sizeof(z->z));
    z->ready = inflateInit2(&z->z, z->raw ? -15 : 15 + 32) == Z_OK;
    if (!z->ready)
        return SQ_NOMEM;
    z->z.next_in = (Bytef *)z->in;
    z->z.avail_in = (uInt)z->in_len;
    z->n = 0;
    return 0;
}

int gw__inflate_new(h2o_iovec_t content_encoding, const void *in, size_t len, int64_t limit,
                    gw_inflate_t **out, char *why, size_t whylen)
{
    *out = NULL;
    h2o_iovec_t ce = content_encoding;
    if (ce.len == 0 || coding_is(ce, "identity"))
        return 0;
    int gzip = coding_is(ce, "gzip") || coding_is(ce, "x-gzip");
    if (!gzip && !coding_is(ce, "deflate")) {
        snprintf(why, whylen, "Content-Encoding: %.*s is not supported; send gzip, deflate or none",
                 (int)(ce.len < 32 ? ce.len : 32), ce.base);
        return SQ_MEDIA_TYPE;
    }
    if (len > UINT32_MAX) {
        snprintf(why, whylen, "a compressed body of more than 4 GiB");
        return SQ_TOO_LARGE;
    }
    gw_inflate_t *z = calloc(1, sizeof(*z));
    if (z == NULL)
        return SQ_NOMEM;
    z->gzip = gzip;
    z->in = in;
    z->in_len = len;
    z->limit = limit;
    z->cap = len * 4 + 4096;
    if ((int64_t)z->cap > limit + 1)
        z->cap = (size_t)limit + 1;
    z->out = malloc(z->cap);
    if (z->out == NULL || inflate_begin(z) != 0) {
        gw__inflate_free(z);
        return SQ_NOMEM;
    }
    *out = z;
    return 0;
}

/* Room for more output: doubles, up to one byte past the limit (the byte
 * that tells a body over it); exactly cap bytes when cap is not 0. */
static int grow(gw_inflate_t *z, size_t cap)
{
    if (cap == 0)
        cap = z->cap * 2 > (size_t)z->limit + 1 ? (size_t)z->limit + 1 : z->cap * 2;
    uint8_t *bigger = realloc(z->out, cap);
    if (bigger == NULL)
        return SQ_NOMEM;
    z->out = bigger;
    z->cap = cap;
    return 0;
}

int gw__inflate_run(gw_inflate_t *z, size_t budget, char *why, size_t whylen)
{
    size_t until = z->n + budget < z->n ? SIZE_MAX : z->n + budget;
    const char *name = z->gzip ? "gzip" : "deflate";
    for (;;) {
        if ((int64_t)z->n > z->limit) {
            snprintf(why, whylen, "the %s body inflates past --max-body-mb (%lld MiB)", name,
                     (long long)(z->limit >> 20));
            return SQ_TOO_LARGE;
        }
        if (z->n == z->cap && grow(z, 0) != 0)
            return SQ_NOMEM;
        if (z->n >= until)
            return 1;
        size_t room = z->cap - z->n;
        if (room > until - z->n)
            room = until - z->n;
        if (room > UINT_MAX)
            room = UINT_MAX;
        z->z.next_out = z->out + z->n;
        z->z.avail_out = (uInt)room;
        int rc = inflate(&z->z, Z_NO_FLUSH);
        z->n += room - z->z.avail_out;
        if (rc == Z_OK)
            continue;
        if (rc == Z_STREAM_END && z->z.avail_in == 0) {
            if ((int64_t)z->n > z->limit)
                continue; /* reported above */
            /* One byte past the body: room for a terminator, as the
             * request's own buffers have. */
            if (z->n == z->cap && grow(z, z->n + 1) != 0)
                return SQ_NOMEM;
            return 0;
        }
        if (rc == Z_MEM_ERROR)
            return SQ_NOMEM;
        /* "deflate" is zlib by the standard, but some clients send it raw. */
        if (!z->gzip && !z->raw) {
            z->raw = 1;
            if (inflate_begin(z) != 0)
                return SQ_NOMEM;
            continue;
        }
        snprintf(why, whylen, "the %s body could not be inflated: %s", name,
                 rc == Z_STREAM_END ? "data after its end"
                 : z->z.msg != NULL ? z->z.msg
                                    : "truncated");
        return SQ_BAD_REQUEST;
    }
}

void gw__inflate_rebase(gw_inflate_t *z, const void *in)
{
    size_t consumed = (size_t)(z->z.next_in - z->in);
    z->in = in;
    z->z.next_in = (Bytef *)in + consumed;
}

void *gw__inflate_take(gw_inflate_t *z, size_t *len)
{
    void *out = z->out;
    *len = z->n;
    z->out = NULL;
    z->cap = z->n = 0;
    return out;
}

void gw__inflate_free(gw_inflate_t *z)
{
    if (z == NULL)
        return;
    if (z->ready)
        inflateEnd(&z->z);
    free(z->out);
    free(z);
}
