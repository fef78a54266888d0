/* http/'s internals shared by its files and its unit tests: content codings
 * (encoding.c) for http.c's request path. */
#ifndef GW_HTTP_INT_H
#define GW_HTTP_INT_H

#include "gw_http.h"

#include <stddef.h>
#include <stdint.h>

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

#endif
