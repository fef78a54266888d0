/* The batcher's intake: items submitted (from other threads, posted here;
 * a frontend's, on this thread) are admitted one by one (the model's
 * record, its twin or prefix group, activation, a first load) and queued
 * per model as one arrival; and the commands placement emitted are
 * drained (ds_commands_drain): placement never calls the batcher. Above
 * batches.c; dispatch thread. */
#include "batcher_int.h"

#include <stdlib.h>
#include <string.h>

/* Whether a worker of dm's kind being restarted should be back, and run a
 * batch of one, before the item's deadline. */
static int back_in_time(gw_dispatch_t *ds, const ds_model_t *dm, const gw_item_t *it)
{
    if (dm->kind < 0 || ds->pub.fleet.coming[dm->kind] == 0)
        return 0;
    double l1 = dm->m->has_profile[dm->kind] ? pl_latency_us(&dm->m->profile[dm->kind], 1, 0) : 0;
    int64_t back = ds->pub.fleet.back_at_us[dm->kind];
    return back != INT64_MAX && back + (int64_t)l1 < it->ask.deadline_us;
}

/* The record whose loads serve dm's requests (its twin, then the prefix
 * group it runs in, with its index there in *member, -1 when none), made
 * active at SLO bucket_ms the first time: placed by the planner. NULL
 * when no worker that can run it is up. */
ds_model_t *ds_serving_record(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms,
                              const gw_item_t *it, int *member)
{
    ds_model_t *t = ds_twin_of(ds, dm);
    if (t != NULL)
        dm = t;
    ds_model_t *g = ds_group_of(ds, dm);
    *member = g != NULL ? ds_group_member_index(g, dm->m) : -1;
    if (g != NULL)
        dm = g;
    if (!dm->active) {
        dm->kind = ds_kind_of_model(ds, dm->m);
        if (dm->kind < 0)
            return NULL;
        dm->active = 1;
        dm->routes_stale = 1;
        ds_plan_activate(ds, dm, bucket_ms, it, sq_now_us());
    }
    return dm;
}

/* One submitted item on the dispatch thread: the record of the model that
 * serves it when it is to be queued now; NULL when it was answered (failed)
 * or waits for a load (pending). */
static ds_model_t *admit(gw_dispatch_t *ds, gw_item_t *it)
{
    gw_model_t *m = it->ask.model;
    if (ds->aborted) {
        ds_fail_item(ds, it, SQ_SHUTTING_DOWN, "squishd is shutting down");
        return NULL;
    }
    if (it->times.ready_us >= it->ask.deadline_us) {
        ds_fail_item(ds, it, SQ_DEADLINE, "the deadline passed during preprocessing");
        return NULL;
    }
    if (ds_withdrawn(ds, it))
        return NULL;
    ds_model_t *dm = ds_model_find(ds, m->key);
    if (dm == NULL) {
        /* New here, or deleted (or unloaded) and forgotten (see reclaim)
         * while the item was decoded: only a model still in service gets a
         * record. */
        if (ds_fail_out_of_service(ds, it, 0))
            return NULL;
        dm = ds_model_get(ds, m);
    }
    if (dm->removed && ds_fail_out_of_service(ds, it, 1))
        return NULL;
    if (dm->poisoned) {
        ds_fail_item(ds, it, SQ_MODEL_FAILED, dm->failed_why);
        return NULL;
    }
    int member;
    dm = ds_serving_record(ds, dm, gw_slo_bucket_ms(it->ask.slo_ms), it, &member);
    if (dm == NULL) {
        ds_fail_item(ds, it, SQ_NO_WORKER, "no worker that can run this model is up");
        return NULL;
    }
    if (member >= 0)
        it->held.member = member;
    int loading;
    if (ds_loaded_anywhere(ds, dm, &loading) > 0)
        return dm;
    if (loading == 0)
        ds_spread_loads(ds, dm); /* the plan placed it nowhere yet: any worker will do */
    ds_loaded_anywhere(ds, dm, &loading);
    if (loading == 0 && !back_in_time(ds, dm, it)) {
        ds_fail_item(ds, it, SQ_NO_WORKER,
                     ds->pub.fleet.coming[dm->kind] > 0
                         ? "no worker is up, and none is back before the deadline"
                         : "no worker could load the model");
        return NULL;
    }
    /* Waits for the load, for the worker holding it to finish measuring,
     * or for a worker being restarted (bounded by its deadline, see
     * on_tick). */
    if (dm->npending == dm->cappending) {
        dm->cappending = dm->cappending ? 2 * dm->cappending : 16;
        dm->pending = sq_xrealloc(dm->pending, sizeof(*dm->pending) * (size_t)dm->cappending);
    }
    dm->pending[dm->npending++] = it;
    return NULL;
}

/* An item, or a clump (items linked through clump_next, ready together):
 * each is admitted on its own, and those to queue now enter the core
 * together per model (ds_enqueue_items), so that a clump is one arrival
 * there. */
void ds_submit_chain(gw_dispatch_t *ds, gw_item_t *first)
{
    int n = 0;
    for (const gw_item_t *it = first; it != NULL; it = it->owner.clump_next)
        n++;
    gw_item_t *one_item, *one_group;
    ds_model_t *one_dm;
    gw_item_t **items = n == 1 ? &one_item : sq_xmalloc(sizeof(*items) * (size_t)n);
    gw_item_t **group = n == 1 ? &one_group : sq_xmalloc(sizeof(*group) * (size_t)n);
    ds_model_t **dms = n == 1 ? &one_dm : sq_xmalloc(sizeof(*dms) * (size_t)n);
    int64_t now = sq_now_us();
    int k = 0;
    for (gw_item_t *it = first, *next; it != NULL; it = next) {
        /* Read before admit: an item answered there may be freed. */
        next = it->owner.clump_next;
        it->owner.clump_next = NULL;
        it->times.ready_us = now;
        ds_model_t *dm = admit(ds, it);
        if (dm != NULL) {
            items[k] = it;
            dms[k++] = dm;
        }
    }
    /* Per model, in the order submitted (a clump is one model's, but a
     * query's frames may go to several root stages). */
    for (int i = 0; i < k; i++) {
        ds_model_t *dm = dms[i];
        if (dm == NULL)
            continue;
        int g = 0;
        for (int j = i; j < k; j++) {
            if (dms[j] == dm) {
                group[g++] = items[j];
                dms[j] = NULL;
            }
        }
        ds_enqueue_items(ds, dm, group, g);
    }
    if (n > 1) {
        free(items);
        free(group);
        free(dms);
    }
    ds_pump(ds);
}

static void on_submit(sq_loop_t *loop, void *arg)
{
    gw_item_t *first = arg;
    (void)loop;
    ds_submit_chain(first->held.holder, first);
}

void ds_submit_post(gw_dispatch_t *ds, gw_item_t *first)
{
    first->held.holder = ds;
    sq_loop_post(ds->loop, on_submit, first);
}

/* ---- commands ------------------------------------------------------------- */

void ds_commands_drain(gw_dispatch_t *ds)
{
    /* A command may emit more (a route's pump, a flush that fails items):
     * drained until none is left. */
    while (ds->ncmds > 0 || ds->pump_due) {
        ds_cmd_t *cmds = ds->cmds;
        int n = ds->ncmds;
        ds->cmds = NULL;
        ds->ncmds = ds->capcmds = 0;
        for (int i = 0; i < n; i++) {
            ds_cmd_t *c = &cmds[i];
            ds_model_t *dm = c->dm;
            switch (c->kind) {
            case DS_CMD_ROUTE:
                if (dm->routes_stale)
                    ds_update_routes(ds, dm);
                break;
            case DS_CMD_FLUSH_PENDING:
                ds_flush_pending(ds, dm);
                break;
            case DS_CMD_FAIL_PENDING:
                ds_fail_pending(ds, dm, c->rc, c->why);
                break;
            case DS_CMD_RESUBMIT:
                /* Through submission again, on a later turn of the loop
                 * (as from another thread). */
                ds_submit_post(ds, c->item);
                break;
            }
        }
        free(cmds);
        if (ds->ncmds == 0 && ds->pump_due) {
            ds->pump_due = 0;
            ds_pump(ds);
        }
    }
}

void ds_commands_on_post(sq_loop_t *loop, void *arg)
{
    gw_dispatch_t *ds = arg;
    (void)loop;
    ds->drain_posted = 0;
    ds_commands_drain(ds);
}
