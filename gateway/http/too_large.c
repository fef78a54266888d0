/* h2o answers a request body over --max-body-mb itself, before any handler
 * sees the request (its Content-Length, or a chunked body as it grows),
 * with a plain-text 413 "request entity is too large": no limit named, and
 * not squish's JSON error. It binds such a request to its host's fallback
 * path; a filter there rewrites that answer into {"error", "code"} naming
 * the limit and the flag that raises it. Every other answer passes as it
 * is (squish's own answers go by the "/" path, not the fallback). */
#include "http_int.h"

#include <sq.h>

#include <stdio.h>
#include <string.h>

typedef struct {
    h2o_filter_t super;
    long long max_body_bytes;
} too_large_filter_t;

typedef struct {
    h2o_ostream_t super;
    h2o_iovec_t body;
} too_large_ostream_t;

/* h2o's own text is dropped; ours goes once, with the final state. */
static void send_json(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs, size_t n,
                      h2o_send_state_t state)
{
    (void)bufs;
    (void)n;
    too_large_ostream_t *os = (too_large_ostream_t *)self;
    if (h2o_send_state_is_in_progress(state)) {
        h2o_ostream_send_next(self, req, NULL, 0, state);
        return;
    }
    h2o_ostream_send_next(self, req, &os->body, 1, state);
}

static void on_setup_ostream(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    const too_large_filter_t *f = (const too_large_filter_t *)self;
    if (req->res.status == 413) {
        char text[512];
        long long mib = f->max_body_bytes >> 20;
        snprintf(text, sizeof(text),
                 "{\"error\": \"the request body is larger than squishd takes (--max-body-mb "
                 "%lld, %lld MiB): send a smaller body, or start squishd with a larger "
                 "--max-body-mb (a model's upload, its data files included, is one body)\", "
                 "\"code\": \"%s\"}",
                 mib, mib, sq_err_name(SQ_TOO_LARGE));
        too_large_ostream_t *os = (too_large_ostream_t *)h2o_add_ostream(req, sizeof(*os), slot);
        os->super.do_send = send_json;
        os->body = h2o_strdup(&req->pool, text, SIZE_MAX);
        req->res.content_length = os->body.len;
        h2o_set_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE,
                       H2O_STRLIT("application/json"), 1);
        slot = &os->super.next;
    }
    h2o_setup_next_ostream(req, slot);
}

void gw__http_too_large_filter(h2o_hostconf_t *host, long long max_body_bytes)
{
    too_large_filter_t *f =
        (too_large_filter_t *)h2o_create_filter(&host->fallback_path, sizeof(*f));
    f->super.on_setup_ostream = on_setup_ostream;
    f->max_body_bytes = max_body_bytes;
}
