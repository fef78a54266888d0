/* Replies computed off the HTTP loop: a job's life (gw_async_new ties it
 * to its request, gw_async_done hands it back to the loop thread, and it
 * is freed when both sides have let go) and its client going away. Below
 * both the loops (http.c, which deliver the replies) and the jobs'
 * makers (proxy.c, the api room): nothing here calls either. */
#include "http_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    gw_async_t *job;
} async_anchor_t;

void gw__async_release(gw_async_t *a)
{
    if (--a->refs > 0)
        return;
    if (a->dispose != NULL)
        a->dispose(a);
    json_decref(a->body);
    gw_async_dispose_detail(a);
    for (int i = 0; i < a->nraw_headers; i++)
        free(a->raw_headers[i].value);
    free(a->raw);
    free(a);
}

void gw__async_unwatch(gw_async_t *a)
{
    if (h2o_linklist_is_linked(&a->watch_link))
        h2o_linklist_unlink(&a->watch_link);
}

/* Tells the job its client went away, once, before its reply. */
void gw__async_tell_gone(gw_async_t *a)
{
    gw__async_unwatch(a);
    if (!a->answered && !a->gone_told && a->gone != NULL) {
        a->gone_told = 1;
        a->gone(a);
    }
}

/* Runs when h2o frees the request (reply sent or client gone). */
static void on_anchor_dispose(void *p)
{
    async_anchor_t *anchor = p;
    gw_async_t *a = anchor->job;
    a->req = NULL;
    gw__async_tell_gone(a);
    gw__async_release(a);
}

gw_async_t *gw_async_new(gw_call_t *call, size_t size)
{
    gw_async_t *a = sq_xcalloc(1, size);
    a->reply_to = call->reply_to;
    a->req = call->req;
    a->app = call->app;
    a->refs = 2;
    async_anchor_t *anchor =
        h2o_mem_alloc_shared(&call->req->pool, sizeof(*anchor), on_anchor_dispose);
    anchor->job = a;
    return a;
}

void gw_async_done(gw_async_t *a)
{
    h2o_multithread_send_message(a->reply_to, &a->super);
}

void gw_async_fail(gw_async_t *a, int err, const char *fmt, ...)
{
    a->err = err;
    a->detail[0] = '\0';
    gw_async_dispose_detail(a);
    if (fmt == NULL)
        return;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(a->detail, sizeof(a->detail), fmt, ap);
    va_end(ap);
    /* Rare and long (an upload's refusal): on the heap, not in every
     * request's struct. */
    if (n >= (int)sizeof(a->detail)) {
        a->detail_long = sq_xmalloc((size_t)n + 1);
        vsnprintf(a->detail_long, (size_t)n + 1, fmt, again);
    }
    va_end(again);
}

const char *gw_async_detail(const gw_async_t *a)
{
    return a->detail_long != NULL ? a->detail_long : a->detail;
}

void gw_async_dispose_detail(gw_async_t *a)
{
    free(a->detail_long);
    a->detail_long = NULL;
}
