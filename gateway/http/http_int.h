/* http/'s internals shared by its files and its unit tests: content codings
 * (encoding.c) for http.c's request path and reply.c's bodies. */
#ifndef GW_HTTP_INT_H
#define GW_HTTP_INT_H

#include "gw_http.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the room's context -------------------------------------------------- */

/* The room's context, a copy of what gw_http_start was given
 * (gw__http_ctx_fill), then read-only: its settings, its handles, the
 * server's flags through the pointers given. The room never
 * reads gw_server_t: what its routes need comes with their app
 * (gw_call_t.app). */
typedef struct gw_http_ctx {
    gw_http_config_t cfg;
    const atomic_int *stopping;
    atomic_int *http_port;
    gw_offload_t *offload;
    gw_front_t *front;
} gw_http_ctx_t;

/* Fills ctx from deps, once, as the room is created. */
void gw__http_ctx_fill(gw_http_ctx_t *ctx, const gw_http_deps_t *deps);

/* ---- h2o's own 413 (too_large.c) ----------------------------------------- */

/* Makes h2o's answer to a body over the limit squish's JSON error, naming
 * max_body_bytes and --max-body-mb (a filter on host's fallback path). */
void gw__http_too_large_filter(h2o_hostconf_t *host, long long max_body_bytes);

/* ---- deferred replies (async.c) ------------------------------------------ */

/* Lets go of one of the job's two holds (the request's, the reply's); the
 * last frees it: its dispose hook, its body, its raw reply. Loop thread. */
void gw__async_release(gw_async_t *a);
/* Takes the job off its loop's watch list (gw_async_watch), if on it. */
void gw__async_unwatch(gw_async_t *a);
/* Tells the job its client went away, once, and only before its reply. */
void gw__async_tell_gone(gw_async_t *a);

/* ---- request bodies: Content-Encoding ------------------------------------ */

/* A compressed request body being inflated: gzip, zlib or raw deflate,
 * the output growing up to a limit. Runs on one thread at a time, in steps
 * (gw__inflate_run); not movable once made (zlib points back into it). */
typedef struct gw_inflate gw_inflate_t;

/* Starts inflating `in` (len bytes, borrowed until the inflate ends or is
 * rebased) as content_encoding says. 0 with *out NULL: nothing to inflate
 * (no coding, or identity); 0 with *out set: call gw__inflate_run; else an
 * SQ_* code with why (SQ_MEDIA_TYPE: a coding other than gzip or deflate;
 * SQ_TOO_LARGE: over 4 GiB compressed). limit: the most bytes the body may
 * inflate to (--max-body-mb). */
int gw__inflate_new(h2o_iovec_t content_encoding, const void *in, size_t len, int64_t limit,
                    gw_inflate_t **out, char *why, size_t whylen);
/* Inflates until the body is whole (0), until budget more bytes have come
 * out (1: call again), or an error: SQ_TOO_LARGE past the limit,
 * SQ_BAD_REQUEST for data that is not what its coding says, SQ_NOMEM; why
 * says which (not for SQ_NOMEM). */
int gw__inflate_run(gw_inflate_t *z, size_t budget, char *why, size_t whylen);
/* The input now lies at `in` (the same bytes, copied): for a request whose
 * buffer may go before the inflate ends. */
void gw__inflate_rebase(gw_inflate_t *z, const void *in);
/* After gw__inflate_run returned 0: the body (malloc'd, one byte more than
 * *len; the caller frees it); the inflate keeps nothing. */
void *gw__inflate_take(gw_inflate_t *z, size_t *len);
/* Frees z (and an output not taken); NULL is fine. */
void gw__inflate_free(gw_inflate_t *z);

/* ---- response bodies: Accept-Encoding ------------------------------------ */

typedef enum { GW_CODING_IDENTITY, GW_CODING_GZIP, GW_CODING_DEFLATE } gw_coding_t;

/* Responses below this size go as they are: a gzip header and trailer
 * and a round of deflate cost more than they save. */
#define GW_COMPRESS_MIN_BYTES 1024
/* Nor above this one: deflate on the HTTP thread costs about 8 ms per MB
 * of JSON and 20 of float tensors (which hardly shrink), and the loop
 * serves every other connection of its thread meanwhile. */
#define GW_COMPRESS_MAX_BYTES (1 << 20)

/* The coding a response to req should have, from its Accept-Encoding
 * headers (RFC 9110 12.5.3): gzip (or x-gzip) or deflate when the client
 * gives it a q-value above 0 and at least that of identity, gzip first on
 * a tie; "*" stands for codings not named; identity when there is no
 * header, when every coding has q=0, or for a HEAD request. */
gw_coding_t gw__accept_coding(h2o_req_t *req);

/* Compresses len bytes of body into the request's pool as coding (gzip:
 * RFC 1952; deflate: zlib, RFC 1950, as HTTP's "deflate" means); the
 * result's length in *out_len. NULL when zlib fails or the result would not
 * be smaller. */
void *gw__compress(h2o_req_t *req, gw_coding_t coding, const void *body, size_t len,
                   size_t *out_len);

#endif
