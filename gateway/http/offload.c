/* The offload thread: CPU work that must not run on an HTTP loop (parsing
 * large OIP JSON bodies, inflating large compressed ones) and is not
 * sqlite's (the DB thread). One thread, jobs in order. */
#include "gw_http.h"

#include <stdlib.h>

struct gw_offload_ctx {
    sq_loop_t *loop;
    pthread_t thread;
};

typedef struct {
    void (*fn)(void *arg);
    void *arg;
} offload_job_t;

static void run(sq_loop_t *loop, void *p)
{
    offload_job_t *j = p;
    (void)loop;
    j->fn(j->arg);
    free(j);
}

static void *offload_thread(void *arg)
{
    sq_loop_run(((struct gw_offload_ctx *)arg)->loop);
    return NULL;
}

int gw_offload_start(gw_offload_t **out)
{
    struct gw_offload_ctx *o = sq_xcalloc(1, sizeof(*o));
    o->loop = sq_loop_new();
    if (o->loop == NULL || pthread_create(&o->thread, NULL, offload_thread, o) != 0) {
        sq_loop_free(o->loop);
        free(o);
        return SQ_NOMEM;
    }
    *out = o;
    return 0;
}

void gw_offload(gw_offload_t *o, void (*fn)(void *arg), void *arg)
{
    offload_job_t *j = sq_xmalloc(sizeof(*j));
    j->fn = fn;
    j->arg = arg;
    sq_loop_post(o->loop, run, j);
}

static void stop(sq_loop_t *loop, void *arg)
{
    (void)arg;
    sq_loop_stop(loop);
}

void gw_offload_stop(gw_offload_t *o)
{
    if (o == NULL)
        return;
    sq_loop_post(o->loop, stop, NULL);
    pthread_join(o->thread, NULL);
    sq_loop_run_posts(o->loop);
    sq_loop_free(o->loop);
    free(o);
}
