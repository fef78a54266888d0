/* gateway/http/encoding.c: request bodies inflated in steps within the body
 * limit (gzip, zlib and raw deflate, and the errors a client's bytes can
 * cause), and the coding a response gets from Accept-Encoding, compressed
 * so that zlib reads it back. */
#include <criterion/criterion.h>
#include <http_int.h>
#include <sq.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* A request with a pool and headers, as far as encoding.c reads it. */
static void req_init(h2o_req_t *req, const char *method)
{
    memset(req, 0, sizeof(*req));
    h2o_mem_init_pool(&req->pool);
    req->method = h2o_iovec_init(method, strlen(method));
    req->input.method = req->method;
    req->version = 0x101;
}

static void req_header(h2o_req_t *req, const char *name, const char *value)
{
    h2o_add_header_by_str(&req->pool, &req->headers, name, strlen(name), 1, NULL, value,
                          strlen(value));
}

/* The coding for a GET with one Accept-Encoding header (NULL: none). */
static gw_coding_t coding_for(const char *accept)
{
    h2o_req_t req;
    req_init(&req, "GET");
    if (accept != NULL)
        req_header(&req, "accept-encoding", accept);
    gw_coding_t c = gw__accept_coding(&req);
    h2o_mem_clear_pool(&req.pool);
    return c;
}

/* ---- Accept-Encoding ------------------------------------------------------ */

Test(encoding, gzip_or_deflate_is_chosen_when_asked_for)
{
    cr_assert_eq(coding_for("gzip"), GW_CODING_GZIP, "what Triton's client sends");
    cr_assert_eq(coding_for("deflate"), GW_CODING_DEFLATE, "its other choice");
    cr_assert_eq(coding_for("GZip"), GW_CODING_GZIP, "names are case-insensitive");
    cr_assert_eq(coding_for("x-gzip"), GW_CODING_GZIP);
    cr_assert_eq(coding_for("gzip, deflate, br"), GW_CODING_GZIP, "gzip first on a tie");
    cr_assert_eq(coding_for("deflate, gzip"), GW_CODING_GZIP, "whatever the order");
    cr_assert_eq(coding_for("br, deflate"), GW_CODING_DEFLATE, "codings unknown here are skipped");
    cr_assert_eq(coding_for(" gzip ; q=1.0 "), GW_CODING_GZIP, "spaces and an explicit q");
}

Test(encoding, identity_unless_a_coding_is_acceptable)
{
    cr_assert_eq(coding_for(NULL), GW_CODING_IDENTITY, "no header: as it is");
    cr_assert_eq(coding_for(""), GW_CODING_IDENTITY);
    cr_assert_eq(coding_for("identity"), GW_CODING_IDENTITY);
    cr_assert_eq(coding_for("br"), GW_CODING_IDENTITY, "nothing squishd makes");
    cr_assert_eq(coding_for("gzip;q=0"), GW_CODING_IDENTITY, "q=0 means not acceptable");
    cr_assert_eq(coding_for("gzip;q=0.000, deflate;q=0"), GW_CODING_IDENTITY);
    cr_assert_eq(coding_for("gzip;q=2"), GW_CODING_IDENTITY, "a malformed q takes nothing");
    cr_assert_eq(coding_for("gzip;q=abc"), GW_CODING_IDENTITY);
    cr_assert_eq(coding_for("*;q=0"), GW_CODING_IDENTITY);
}

Test(encoding, q_values_rank_the_codings_and_identity)
{
    cr_assert_eq(coding_for("gzip;q=0.5, deflate;q=0.8"), GW_CODING_DEFLATE);
    cr_assert_eq(coding_for("gzip;q=0.9, deflate;q=0.8"), GW_CODING_GZIP);
    cr_assert_eq(coding_for("gzip;q=0, deflate"), GW_CODING_DEFLATE, "gzip refused, deflate not");
    cr_assert_eq(coding_for("gzip;q=0.5, identity"), GW_CODING_IDENTITY,
                 "identity preferred (q=1) over gzip (0.5)");
    cr_assert_eq(coding_for("gzip;q=0.5, identity;q=0.5"), GW_CODING_GZIP, "a tie compresses");
    cr_assert_eq(coding_for("gzip;q=0.5"), GW_CODING_GZIP, "identity not named stands in no way");
    cr_assert_eq(coding_for("*"), GW_CODING_GZIP, "any coding");
    cr_assert_eq(coding_for("*;q=0.5, gzip;q=0"), GW_CODING_DEFLATE, "* covers those not named");
    cr_assert_eq(coding_for("gzip;level=9;q=0"), GW_CODING_IDENTITY, "q among other parameters");
}

Test(encoding, several_headers_count_together_and_head_gets_identity)
{
    h2o_req_t req;
    req_init(&req, "GET");
    req_header(&req, "accept-encoding", "identity;q=0.1");
    req_header(&req, "accept-encoding", "deflate");
    cr_assert_eq(gw__accept_coding(&req), GW_CODING_DEFLATE);
    h2o_mem_clear_pool(&req.pool);
    req_init(&req, "HEAD");
    req_header(&req, "accept-encoding", "gzip");
    cr_assert_eq(gw__accept_coding(&req), GW_CODING_IDENTITY, "HEAD sends no body to compress");
    h2o_mem_clear_pool(&req.pool);
}

/* ---- compressing ------------------------------------------------------------ */

static size_t make_json(char *buf, size_t cap)
{
    size_t n = 0;
    for (int i = 0; n + 64 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "{\"name\": \"output%d\", \"data\": [%d.5]},", i,
                              i * 7);
    return n;
}

Test(encoding, compressed_bodies_inflate_back_to_the_same_bytes)
{
    static char body[64 << 10];
    size_t len = make_json(body, sizeof(body));
    for (int c = GW_CODING_GZIP; c <= GW_CODING_DEFLATE; c++) {
        h2o_req_t req;
        req_init(&req, "GET");
        size_t zlen = 0;
        uint8_t *z = gw__compress(&req, (gw_coding_t)c, body, len, &zlen);
        cr_assert_not_null(z);
        cr_assert_lt(zlen, len / 3, "JSON shrinks");
        if (c == GW_CODING_GZIP)
            cr_assert(z[0] == 0x1f && z[1] == 0x8b, "a gzip member");
        else
            cr_assert((z[0] & 0x0f) == 8 && ((z[0] << 8) | z[1]) % 31 == 0, "a zlib stream");
        z_stream s;
        memset(&s, 0, sizeof(s));
        cr_assert_eq(inflateInit2(&s, 15 + 32), Z_OK);
        static char back[64 << 10];
        s.next_in = z;
        s.avail_in = (uInt)zlen;
        s.next_out = (Bytef *)back;
        s.avail_out = sizeof(back);
        cr_assert_eq(inflate(&s, Z_FINISH), Z_STREAM_END);
        cr_assert_eq(s.total_out, len);
        cr_assert_eq(memcmp(back, body, len), 0);
        inflateEnd(&s);
        h2o_mem_clear_pool(&req.pool);
    }
}

Test(encoding, a_body_that_would_not_shrink_is_not_compressed)
{
    static uint8_t noise[4096];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof(noise); i++) {
        x = x * 1103515245u + 12345u;
        noise[i] = (uint8_t)(x >> 24);
    }
    h2o_req_t req;
    req_init(&req, "GET");
    size_t zlen = 0;
    cr_assert_null(gw__compress(&req, GW_CODING_GZIP, noise, sizeof(noise), &zlen));
    cr_assert_null(gw__compress(&req, GW_CODING_IDENTITY, "{}", 2, &zlen));
    h2o_mem_clear_pool(&req.pool);
}

/* ---- inflating ---------------------------------------------------------------- */

/* body deflated with zlib's windowBits (31 gzip, 15 zlib, -15 raw). */
static uint8_t *deflated(const void *body, size_t len, int window_bits, size_t *zlen)
{
    z_stream s;
    memset(&s, 0, sizeof(s));
    cr_assert_eq(deflateInit2(&s, 9, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&s, len);
    uint8_t *out = malloc(cap);
    s.next_in = (Bytef *)body;
    s.avail_in = (uInt)len;
    s.next_out = out;
    s.avail_out = (uInt)cap;
    cr_assert_eq(deflate(&s, Z_FINISH), Z_STREAM_END);
    *zlen = s.total_out;
    deflateEnd(&s);
    return out;
}

static h2o_iovec_t ce(const char *name)
{
    return h2o_iovec_init(name, strlen(name));
}

/* Inflates in steps of `step` bytes: the body, or NULL with *rc the error. */
static uint8_t *inflate_all(const char *coding, const uint8_t *in, size_t len, int64_t limit,
                            size_t step, size_t *out_len, int *steps, int *rc, char *why)
{
    gw_inflate_t *z = NULL;
    *rc = gw__inflate_new(ce(coding), in, len, limit, &z, why, 160);
    *steps = 0;
    if (*rc != 0)
        return NULL;
    cr_assert_not_null(z);
    while ((*rc = gw__inflate_run(z, step, why, 160)) == 1)
        (*steps)++;
    uint8_t *out = *rc == 0 ? gw__inflate_take(z, out_len) : NULL;
    gw__inflate_free(z);
    return out;
}

Test(encoding, gzip_zlib_and_raw_deflate_bodies_inflate)
{
    static char body[200 << 10];
    size_t len = make_json(body, sizeof(body));
    const struct {
        const char *coding;
        int window_bits;
    } cases[] = {{"gzip", 31}, {"deflate", 15}, {"deflate", -15}, {"x-gzip", 31}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t zlen, out_len = 0;
        uint8_t *in = deflated(body, len, cases[i].window_bits, &zlen);
        int steps, rc;
        char why[160] = "";
        uint8_t *out =
            inflate_all(cases[i].coding, in, zlen, 1 << 20, SIZE_MAX, &out_len, &steps, &rc, why);
        cr_assert_eq(rc, 0, "%s (%d): %s", cases[i].coding, cases[i].window_bits, why);
        cr_assert_eq(out_len, len);
        cr_assert_eq(memcmp(out, body, len), 0);
        free(out);
        free(in);
    }
}

Test(encoding, a_budget_stops_the_inflate_and_the_next_call_goes_on)
{
    static char body[200 << 10];
    size_t len = make_json(body, sizeof(body));
    size_t zlen, out_len = 0;
    uint8_t *in = deflated(body, len, 31, &zlen);
    int steps, rc;
    char why[160];
    uint8_t *out = inflate_all("gzip", in, zlen, 1 << 20, 16 << 10, &out_len, &steps, &rc, why);
    cr_assert_eq(rc, 0);
    cr_assert_eq(steps, (int)((len - 1) / (16 << 10)), "one stop per 16 KiB that came out");
    cr_assert_eq(out_len, len);
    cr_assert_eq(memcmp(out, body, len), 0);
    free(out);
    /* Half inflated, then the input moves (HTTP/2: the job's own copy). */
    gw_inflate_t *z = NULL;
    cr_assert_eq(gw__inflate_new(ce("gzip"), in, zlen, 1 << 20, &z, why, sizeof(why)), 0);
    cr_assert_eq(gw__inflate_run(z, len / 2, why, sizeof(why)), 1);
    uint8_t *copy = malloc(zlen);
    memcpy(copy, in, zlen);
    memset(in, 0, zlen);
    gw__inflate_rebase(z, copy);
    cr_assert_eq(gw__inflate_run(z, SIZE_MAX, why, sizeof(why)), 0, "%s", why);
    out = gw__inflate_take(z, &out_len);
    cr_assert_eq(out_len, len);
    cr_assert_eq(memcmp(out, body, len), 0);
    gw__inflate_free(z);
    free(out);
    free(copy);
    free(in);
}

Test(encoding, a_body_past_the_limit_once_inflated_is_too_large)
{
    size_t big = 8 << 20, zlen;
    uint8_t *zeros = calloc(1, big);
    uint8_t *in = deflated(zeros, big, 31, &zlen);
    cr_assert_lt(zlen, 64 << 10, "a zip bomb: 8 MiB in a few KiB");
    int steps, rc;
    size_t out_len;
    char why[160] = "";
    cr_assert_null(inflate_all("gzip", in, zlen, 1 << 20, SIZE_MAX, &out_len, &steps, &rc, why));
    cr_assert_eq(rc, SQ_TOO_LARGE);
    cr_assert(strstr(why, "--max-body-mb (1 MiB)") != NULL, "%s", why);
    /* Exactly at the limit is fine. */
    free(in);
    in = deflated(zeros, 1 << 20, 31, &zlen);
    uint8_t *out = inflate_all("gzip", in, zlen, 1 << 20, 4096, &out_len, &steps, &rc, why);
    cr_assert_eq(rc, 0, "%s", why);
    cr_assert_eq(out_len, (size_t)1 << 20);
    free(out);
    free(in);
    free(zeros);
}

Test(encoding, bytes_that_are_not_their_coding_are_a_bad_request)
{
    static char body[8 << 10];
    size_t len = make_json(body, sizeof(body));
    size_t zlen, out_len;
    uint8_t *in = deflated(body, len, 31, &zlen);
    int steps, rc;
    char why[160] = "";
    cr_assert_null(inflate_all("gzip", (const uint8_t *)"not gzip", 8, 1 << 20, SIZE_MAX, &out_len,
                               &steps, &rc, why));
    cr_assert_eq(rc, SQ_BAD_REQUEST);
    cr_assert(strstr(why, "the gzip body could not be inflated") != NULL, "%s", why);
    cr_assert_null(
        inflate_all("gzip", in, zlen - 20, 1 << 20, SIZE_MAX, &out_len, &steps, &rc, why));
    cr_assert_eq(rc, SQ_BAD_REQUEST);
    cr_assert(strstr(why, "truncated") != NULL, "%s", why);
    uint8_t *more = malloc(zlen + 3);
    memcpy(more, in, zlen);
    memcpy(more + zlen, "xyz", 3);
    cr_assert_null(
        inflate_all("gzip", more, zlen + 3, 1 << 20, SIZE_MAX, &out_len, &steps, &rc, why));
    cr_assert_eq(rc, SQ_BAD_REQUEST);
    cr_assert(strstr(why, "data after its end") != NULL, "%s", why);
    cr_assert_null(inflate_all("deflate", (const uint8_t *)"\xff\xff\xff\xff", 4, 1 << 20, SIZE_MAX,
                               &out_len, &steps, &rc, why));
    cr_assert_eq(rc, SQ_BAD_REQUEST, "neither zlib nor raw deflate");
    cr_assert(strstr(why, "the deflate body") != NULL, "%s", why);
    free(more);
    free(in);
}

Test(encoding, only_gzip_deflate_and_identity_are_taken)
{
    gw_inflate_t *z = (gw_inflate_t *)1;
    char why[160] = "";
    cr_assert_eq(gw__inflate_new(ce(""), "x", 1, 100, &z, why, sizeof(why)), 0);
    cr_assert_null(z, "no coding: nothing to inflate");
    cr_assert_eq(gw__inflate_new(ce("Identity"), "x", 1, 100, &z, why, sizeof(why)), 0);
    cr_assert_null(z);
    cr_assert_eq(gw__inflate_new(ce("br"), "x", 1, 100, &z, why, sizeof(why)), SQ_MEDIA_TYPE);
    cr_assert_null(z);
    cr_assert(strstr(why, "Content-Encoding: br is not supported; send gzip, deflate or none") !=
                  NULL,
              "%s", why);
    gw__inflate_free(NULL);
}
