/* One rule turns a placement plan into a session's dispatcher routes, for
 * the live gateway (gateway/dispatch/planning.c) and the simulator (bench/sim) alike,
 * so that what the simulator measures is what squishd does. */
#include "pl.h"
#include "pl_dispatch.h"

#include <stddef.h>

static const pl_alloc_t *alloc_of(const pl_device_t *dev, int session_id)
{
    for (int a = 0; a < dev->nallocs; a++)
        if (dev->allocs[a].session_id == session_id)
            return &dev->allocs[a];
    return NULL;
}

static int listed(const pl_route_t *routes, int n, int worker)
{
    for (int i = 0; i < n; i++)
        if (routes[i].worker == worker)
            return 1;
    return 0;
}

/* The worker that runs device device_id and can serve the session now, or
 * -1. */
static int worker_at(const pl_route_rules_t *rules, int device_id)
{
    int worker = device_id >= 0 && device_id < rules->nworkers ? rules->workers[device_id] : -1;
    if (worker < 0)
        return -1;
    return rules->usable == NULL || rules->usable(rules->ctx, worker, rules->model) ? worker : -1;
}

int pl_plan_routes(const pl_plan_t *plan, int session_id, const pl_route_rules_t *rules,
                   pl_route_t *routes, int max)
{
    const pl_plan_entry_t *e =
        plan != NULL && rules->index != NULL ? pl_plan_index_get(rules->index, session_id) : NULL;
    int n = 0;
    if (plan != NULL && rules->index != NULL) {
        for (int k = 0, last = -1; e != NULL && k < e->nallocs && n < max; k++) {
            int i = rules->index->alloc_device[e->first_alloc + k];
            if (i == last)
                continue; /* one route a device: its first allocation's */
            last = i;
            const pl_device_t *dev = &plan->devices[i];
            const pl_alloc_t *a = &dev->allocs[rules->index->alloc_ix[e->first_alloc + k]];
            int worker = worker_at(rules, dev->id);
            if (worker >= 0)
                routes[n++] =
                    (pl_route_t){.worker = worker, .target_batch = rules->targets ? a->batch : 0};
        }
    } else {
        for (int i = 0; plan != NULL && i < plan->ndevices && n < max; i++) {
            const pl_device_t *dev = &plan->devices[i];
            const pl_alloc_t *a = alloc_of(dev, session_id);
            if (a == NULL)
                continue;
            int worker = worker_at(rules, dev->id);
            if (worker < 0)
                continue;
            routes[n++] =
                (pl_route_t){.worker = worker, .target_batch = rules->targets ? a->batch : 0};
        }
    }
    int planned = n;
    if (rules->used_fallback != NULL)
        *rules->used_fallback = planned == 0;
    for (int i = 0; planned == 0 && i < rules->nfallback && n < max; i++)
        routes[n++] = (pl_route_t){.worker = rules->fallback[i]};
    /* Spare devices that also hold the session take its overflow: after
     * the planned ones, with the dispatcher's own batch (target 0). */
    int nover = plan == NULL           ? 0
                : rules->index != NULL ? (e != NULL ? e->nover : 0)
                                       : plan->noverflow;
    for (int k = 0; k < nover && n < max; k++) {
        const pl_overflow_t *o =
            &plan->overflow[rules->index != NULL ? rules->index->over[e->first_over + k] : k];
        if (o->session_id != session_id)
            continue;
        int worker = worker_at(rules, o->device_id);
        if (worker >= 0 && !listed(routes, n, worker))
            routes[n++] = (pl_route_t){.worker = worker, .overflow = planned > 0};
    }
    return n;
}
