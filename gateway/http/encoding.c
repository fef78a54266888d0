/* Content codings: request bodies sent with Content-Encoding gzip or
 * deflate are inflated (in steps, so that http.c can move a long one off
 * the HTTP loop), and response bodies go gzip- or deflate-compressed when
 * the client's Accept-Encoding asks for it (gw_send_body, the one place
 * every body squishd sends leaves through). */
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

/* ---- response bodies ------------------------------------------------------- */

/* A q-value ("1", "0.5", "0.125", "1.000") in thousandths; a malformed one
 * is 0: that coding is not taken. */
static int parse_q(const char *s, size_t len)
{
    if (len == 0 || (s[0] != '0' && s[0] != '1'))
        return 0;
    int q = (s[0] - '0') * 1000, scale = 100;
    if (len > 1) {
        if (s[1] != '.' || len > 5)
            return 0;
        for (size_t i = 2; i < len; i++, scale /= 10) {
            if (s[i] < '0' || s[i] > '9')
                return 0;
            q += (s[i] - '0') * scale;
        }
    }
    return q > 1000 ? 0 : q;
}

static int is_ows(char c)
{
    return c == ' ' || c == '\t';
}

static h2o_iovec_t trim(const char *b, const char *e)
{
    while (b < e && is_ows(*b))
        b++;
    while (e > b && is_ows(e[-1]))
        e--;
    return h2o_iovec_init(b, (size_t)(e - b));
}

enum { Q_GZIP, Q_DEFLATE, Q_IDENTITY, Q_ANY, Q_COUNT };

/* One Accept-Encoding value: "gzip;q=0.8, deflate, identity;q=0". Each
 * coding's q (thousandths) in q[], where it names one of ours. */
static void parse_accept(const char *s, size_t len, int q[Q_COUNT])
{
    const char *end = s + len;
    while (s < end) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *ee = comma != NULL ? comma : end;
        const char *semi = memchr(s, ';', (size_t)(ee - s));
        h2o_iovec_t name = trim(s, semi != NULL ? semi : ee);
        int value = 1000;
        /* Parameters: only q counts ("q=0.5"; spaces around ';' and '='
         * are tolerated). */
        for (const char *p = semi; p != NULL && p < ee;) {
            const char *next = memchr(p + 1, ';', (size_t)(ee - p - 1));
            h2o_iovec_t param = trim(p + 1, next != NULL ? next : ee);
            const char *eq = memchr(param.base, '=', param.len);
            if (eq != NULL) {
                h2o_iovec_t key = trim(param.base, eq);
                h2o_iovec_t val = trim(eq + 1, param.base + param.len);
                if (key.len == 1 && (key.base[0] == 'q' || key.base[0] == 'Q'))
                    value = parse_q(val.base, val.len);
            }
            p = next;
        }
        int which = coding_is(name, "gzip") || coding_is(name, "x-gzip") ? Q_GZIP
                    : coding_is(name, "deflate")                         ? Q_DEFLATE
                    : coding_is(name, "identity")                        ? Q_IDENTITY
                    : coding_is(name, "*")                               ? Q_ANY
                                                                         : -1;
        if (which >= 0 && value > q[which])
            q[which] = value;
        s = comma != NULL ? comma + 1 : end;
    }
}

gw_coding_t gw__accept_coding(h2o_req_t *req)
{
    if (h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD")))
        return GW_CODING_IDENTITY;
    int q[Q_COUNT] = {-1, -1, -1, -1}; /* -1: not named */
    static const char name[] = "accept-encoding";
    for (ssize_t i = -1;
         (i = h2o_find_header_by_str(&req->headers, name, sizeof(name) - 1, i)) != -1;)
        parse_accept(req->headers.entries[i].value.base, req->headers.entries[i].value.len, q);
    /* "*" stands for every coding not named; identity not named (nor
     * covered by "*") is acceptable but stands in no coding's way. */
    int any = q[Q_ANY];
    int gzip = q[Q_GZIP] >= 0 ? q[Q_GZIP] : any > 0 ? any : 0;
    int deflate = q[Q_DEFLATE] >= 0 ? q[Q_DEFLATE] : any > 0 ? any : 0;
    int identity = q[Q_IDENTITY] >= 0 ? q[Q_IDENTITY] : any > 0 ? any : 0;
    int best = gzip >= deflate ? gzip : deflate;
    if (best == 0 || identity > best)
        return GW_CODING_IDENTITY;
    return gzip >= deflate ? GW_CODING_GZIP : GW_CODING_DEFLATE;
}

void *gw__compress(h2o_req_t *req, gw_coding_t coding, const void *body, size_t len,
                   size_t *out_len)
{
    if (coding == GW_CODING_IDENTITY || len < 2 || len > UINT_MAX)
        return NULL;
    z_stream z;
    memset(&z, 0, sizeof(z));
    /* The fastest level: on the HTTP thread, time matters more than the
     * last few percent. */
    if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, coding == GW_CODING_GZIP ? 15 + 16 : 15, 8,
                     Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    /* A result that would not be smaller does not fit: it is not sent. */
    uint8_t *out = h2o_mem_alloc_pool(&req->pool, len - 1);
    z.next_in = (Bytef *)body;
    z.avail_in = (uInt)len;
    z.next_out = out;
    z.avail_out = (uInt)(len - 1);
    int rc = deflate(&z, Z_FINISH);
    *out_len = z.total_out;
    deflateEnd(&z);
    return rc == Z_STREAM_END ? out : NULL;
}

void gw_send_body(h2o_req_t *req, const void *body, size_t len)
{
    static h2o_generator_t generator = {NULL, NULL};
    h2o_iovec_t buf = {NULL, 0};
    if (len >= GW_COMPRESS_MIN_BYTES && len <= GW_COMPRESS_MAX_BYTES) {
        /* From this size on, what is sent depends on Accept-Encoding:
         * caches must keep the answers apart. */
        h2o_set_header_token(&req->pool, &req->res.headers, H2O_TOKEN_VARY,
                             H2O_STRLIT("accept-encoding"));
        gw_coding_t coding = gw__accept_coding(req);
        size_t zlen = 0;
        void *z = gw__compress(req, coding, body, len, &zlen);
        if (z != NULL) {
            buf = h2o_iovec_init(z, zlen);
            if (coding == GW_CODING_GZIP)
                h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_ENCODING, NULL,
                               H2O_STRLIT("gzip"));
            else
                h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_ENCODING, NULL,
                               H2O_STRLIT("deflate"));
        }
    }
    if (buf.base == NULL)
        buf = len > 0 ? h2o_strdup(&req->pool, body, len) : h2o_iovec_init(H2O_STRLIT(""));
    req->res.content_length = buf.len;
    h2o_start_response(req, &generator);
    if (h2o_memis(req->method.base, req->method.len, H2O_STRLIT("HEAD")))
        h2o_send(req, NULL, 0, H2O_SEND_STATE_FINAL);
    else
        h2o_send(req, &buf, 1, H2O_SEND_STATE_FINAL);
}
