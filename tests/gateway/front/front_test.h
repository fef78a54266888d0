/* What the front/ tests share: a frontend record on a bare server (a
 * registry, pipelines, a zeroed configuration), no thread and no link. */
#ifndef FRONT_TEST_H
#define FRONT_TEST_H

#include "front_int.h"

#include <stdlib.h>

typedef struct {
    gw_server_t srv;
    gw_config_t cfg;
    gw_front_t *fr;
} front_fixture_t;

static inline void front_fixture_init(front_fixture_t *x)
{
    *x = (front_fixture_t){0};
    x->srv.cfg = &x->cfg;
    x->srv.registry = gw_registry_new();
    x->srv.pipelines = gw_pipes_new();
    x->fr = sq_xcalloc(1, sizeof(*x->fr));
    x->fr->registry = x->srv.registry;
    x->fr->pipelines = x->srv.pipelines;
    x->fr->http_port = &x->srv.http_port;
    x->fr->core = gw_sched_core_opts(&x->cfg);
    x->fr->sched.ops = &fr_front_sched_ops;
    pthread_mutex_init(&x->fr->lock, NULL);
    fr_fleet_clear(&x->fr->fleet);
}

static inline void front_fixture_dispose(front_fixture_t *x)
{
    fr_live_free(x->fr->live, x->fr->nlive);
    free(x->fr->held);
    free(x->fr->gone);
    free(x->fr->slots);
    pthread_mutex_destroy(&x->fr->lock);
    free(x->fr);
    gw_pipes_free(x->srv.pipelines);
    gw_registry_free(x->srv.registry);
}

#endif
