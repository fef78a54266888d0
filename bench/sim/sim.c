/* squish-sim engine (sim.h): the event loop around the real dispatcher core
 * on a virtual clock. Emulated devices take a batch's l(b) (and their
 * link's time) and complete in (end, device) order (common's indexed heap);
 * the loop interleaves completions, arrivals, queries, the planning loop's
 * ticks and the dispatcher's timer, and tallies the run. Calls
 * sim_arrivals.c, sim_pipeline.c, sim_plan.c and sim_result.c (sim_int.h
 * says who calls whom). */
#include "sim_int.h"

#include <time.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sim_opts_default(sim_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->policy = PL_POLICY_DEFERRED;
    o->rate_scale = 1;
    o->routing = SIM_ROUTE_AUTO;
    o->plan_headroom = 1;
    o->plan_burst_quantile = PL_BURST_QUANTILE;
    o->plan_overflow = 1;
}

/* ---- the run ---- */

static void absorb(run_t *r)
{
    const pl_action_t *a;
    size_t n = pl_dispatch_take(r->d, &a);
    sim_result_t *res = r->res;
    int64_t last_at = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind == PL_ACT_TIMER) {
            r->timer_us = a[i].at_us;
        } else if (a[i].kind == PL_ACT_DROP) {
            sim_request_t *q = &res->requests[a[i].request_id];
            q->outcome = SIM_DROPPED;
            q->reason = a[i].reason;
            q->finish_us = a[i].at_us;
            res->dropped++;
            if (q->query >= 0) {
                /* The whole query goes, once the actions are read (taking
                 * its other items out of their queues is a call into the
                 * dispatcher, which ends this list's life). */
                r->pend[r->qoff[q->query] + (size_t)q->stage]--;
                if (r->capkill == r->nkill) {
                    r->capkill = r->capkill ? 2 * r->capkill : 64;
                    r->kill = sq_xrealloc(r->kill, sizeof(int) * r->capkill);
                }
                r->kill[r->nkill++] = q->query;
                last_at = a[i].at_us;
            }
        } else {
            device_t *dv = &r->dev[a[i].worker];
            if (res->nbatches == r->cap_batches) {
                r->cap_batches = r->cap_batches ? r->cap_batches * 2 : 4096;
                res->batches = sq_xrealloc(res->batches, sizeof(sim_batch_t) * r->cap_batches);
            }
            /* Behind a link the batch goes over and its answer comes back:
             * rtt + b * item_bytes / bandwidth (rounded up to whole µs, as
             * the dispatcher assumes), then l(b). */
            int64_t exec = r->exec_us[a[i].session][a[i].count];
            const pl_link_t *l = &dv->link;
            if (l->rtt_us > 0 || l->bytes_per_us > 0)
                exec +=
                    llround(l->rtt_us) +
                    (l->bytes_per_us > 0
                         ? (int64_t)ceil(a[i].count * r->item_bytes[a[i].session] / l->bytes_per_us)
                         : 0);
            sim_batch_t *b = &res->batches[res->nbatches];
            *b = (sim_batch_t){.device = a[i].worker,
                               .session = a[i].session,
                               .start_us = a[i].at_us,
                               .end_us = a[i].at_us + r->o->net_delay_us + exec,
                               .size = a[i].count};
            if (dv->busy) {
                /* The dispatcher gave a busy device a batch: a real device
                 * could not have run it. Stop; the checker reports it. */
                res->nbatches++;
                r->failed = 1;
                return;
            }
            dv->busy = 1;
            dv->used = 1;
            dv->batch_id = a[i].batch_id;
            dv->record = res->nbatches++;
            dv->end_us = b->end_us;
            if (dv->cap_ids < a[i].count) {
                dv->cap_ids = a[i].count;
                dv->ids = sq_xrealloc(dv->ids, sizeof(uint64_t) * (size_t)dv->cap_ids);
            }
            memcpy(dv->ids, a[i].ids, sizeof(uint64_t) * (size_t)a[i].count);
            dv->nids = a[i].count;
            for (int k = 0; k < a[i].count; k++)
                res->requests[a[i].ids[k]].sent_us = a[i].at_us;
            res->busy_us += (double)(b->end_us - b->start_us);
            sq_iheap_set(&r->done, a[i].worker, b->end_us);
        }
    }
    for (size_t k = 0; k < r->nkill; k++)
        sim__query_kill(r, r->kill[k], SIM_DROPPED, last_at);
    r->nkill = 0;
}

int sim_run(const wl_workload_t *w, const sim_opts_t *o, sim_result_t *res)
{
    memset(res, 0, sizeof(*res));
    res->overlap_batch = -1;
    unsigned long long seed = o->seed_given ? o->seed : w->seed;
    run_t r = {.w = w, .o = o, .res = res, .timer_us = PL_NEVER};
    int rc = 0;
    size_t nsreq = 0;

    if ((rc = sim__sessions_setup(&r)) < 0)
        goto out;
    res->nsessions = r.nss;
    res->session_model = sq_xcalloc((size_t)r.nss + 1, sizeof(int));
    for (int s = 0; s < r.nss; s++)
        res->session_model[s] = r.ss[s].model;

    double horizon = sim__arrivals_build(&r, seed, &nsreq);
    struct timespec cpu0, cpu1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu0);

    pl_dispatch_opts_t dopts = {.policy = o->policy,
                                .k_std = w->k_std,
                                .net_delay_us = o->net_delay_us,
                                .eager_load = o->eager_load};
    r.d = pl_dispatch_new(&dopts);
    r.exec_us = sq_xcalloc((size_t)r.nss + 1, sizeof(int64_t *));
    r.item_bytes = sq_xcalloc((size_t)r.nss + 1, sizeof(double));
    for (int s = 0; s < r.nss; s++) {
        const pl_profile_t *p = &w->models[r.ss[s].model].profile;
        r.item_bytes[s] = w->models[r.ss[s].model].item_bytes;
        pl_session_cfg_t cfg = {.profile = p,
                                .slo_us = llround(r.ss[s].slo_us),
                                .item_bytes = llround(r.item_bytes[s])};
        if (pl_dispatch_session_add(r.d, &cfg) != s) {
            rc = SQ_INVAL;
            goto out;
        }
        r.exec_us[s] = sq_xcalloc((size_t)p->max_batch + 1, sizeof(int64_t));
        for (int b = 1; b <= p->max_batch; b++)
            r.exec_us[s][b] = (int64_t)ceil(pl_latency_us(p, b, 0));
    }
    if ((rc = sim__routes_setup(&r, &res->ndevices)) < 0)
        goto out;
    /* Devices behind a link: the dispatcher counts it, the devices pay it. */
    for (int k = 0; k < res->ndevices && k < w->ndevice_links; k++) {
        pl_link_t l = w->device_links[k];
        if (!(l.rtt_us > 0) && !(l.bytes_per_us > 0))
            continue;
        r.dev[k].link = l;
        pl_dispatch_worker_net(r.d, 0, k, llround(l.rtt_us), l.bytes_per_us);
    }
    sq_iheap_reserve(&r.done, res->ndevices);
    absorb(&r);
    /* Epochs: the loop's ticks (its rate steps) while arrivals run. */
    int64_t horizon_us = llround(horizon * 1e6);
    r.next_tick_us = r.planning && o->epoch_s > 0 && r.tick_us > 0 && r.tick_us < horizon_us
                         ? r.tick_us
                         : PL_NEVER;

    size_t next = 0, nextq = 0;
    while (!r.failed) {
        int64_t t_done = sq_iheap_top_key(&r.done, PL_NEVER);
        int64_t t_arr = next < nsreq ? res->requests[next].arrival_us : PL_NEVER;
        int64_t t_q = nextq < res->nqueries ? res->queries[nextq].arrival_us : PL_NEVER;
        int64_t now = t_done < t_arr ? t_done : t_arr;
        if (t_q < now)
            now = t_q;
        if (r.next_tick_us < now)
            now = r.next_tick_us;
        if (r.timer_us < now)
            now = r.timer_us;
        if (now == PL_NEVER)
            break;
        if (t_done == now) {
            /* One completion per device at most (a device is busy until
             * its batch ends): (end_us, device) order, as the heap's. */
            int c_device = sq_iheap_top(&r.done);
            int64_t c_end_us = t_done;
            sq_iheap_remove(&r.done, c_device);
            device_t *dv = &r.dev[c_device];
            for (int k = 0; k < dv->nids; k++) {
                sim_request_t *q = &res->requests[dv->ids[k]];
                q->finish_us = c_end_us;
                q->outcome = c_end_us <= q->deadline_us ? SIM_OK : SIM_LATE;
                if (q->outcome == SIM_OK)
                    res->ok++;
                else
                    res->late++;
            }
            dv->busy = 0;
            int nids = dv->nids;
            dv->nids = 0;
            pl_dispatch_batch_done(r.d, now, c_device, dv->batch_id);
            /* The batch's pipeline items: their children are ready now
             * (item_push may move res->requests). */
            for (int k = 0; k < nids; k++)
                if (res->requests[dv->ids[k]].query >= 0)
                    sim__item_done(&r, (size_t)dv->ids[k], now);
        } else if (t_arr == now) {
            sim_request_t *q = &res->requests[next];
            pl_dispatch_request(r.d, now, next, q->session, q->arrival_us, q->deadline_us);
            if (r.loop != NULL)
                pl_loop_arrivals(r.loop, r.ss[q->session].model, r.ss[q->session].slo_us / 1000.0,
                                 1);
            next++;
        } else if (t_q == now) {
            sim__query_arrive(&r, (int)nextq++, now);
        } else if (r.next_tick_us == now) {
            /* The loop's ticks run while arrivals do (ties: after
             * completions and arrivals, before the dispatcher's timer). */
            if (pl_loop_advance(r.loop, now) & 1u) {
                if ((rc = sim__plan_at(&r, now)) < 0)
                    goto out;
                res->epochs++;
            }
            r.next_tick_us += r.tick_us;
            if (r.next_tick_us >= horizon_us)
                r.next_tick_us = PL_NEVER;
        } else {
            r.timer_us = PL_NEVER;
            pl_dispatch_timer(r.d, now);
        }
        absorb(&r);
    }
    res->offered_rps = horizon > 0 ? (double)res->nrequests / horizon : 0;
    for (size_t i = 0; i < res->nrequests; i++) {
        const sim_request_t *q = &res->requests[i];
        res->pending += q->outcome == SIM_PENDING;
        if (q->query < 0) {
            res->session_requests++;
            res->session_ok += q->outcome == SIM_OK;
        }
    }
    for (size_t i = 0; i < res->nqueries; i++) {
        const sim_query_t *q = &res->queries[i];
        sim_pipeline_result_t *pr = &res->pipelines[q->pipeline];
        pr->queries++;
        pr->ok += q->outcome == SIM_OK;
        pr->dropped += q->outcome == SIM_DROPPED;
        pr->late += q->outcome == SIM_LATE;
        pr->pending += q->outcome == SIM_PENDING;
    }
    for (int k = 0; k < res->ndevices; k++)
        res->devices_used += r.dev[k].used;
    res->overlap_batch = sim_check_overlap(res->batches, res->nbatches, res->ndevices);
    sim__steps_fill(&r, res);
    if (r.failed && res->overlap_batch < 0)
        res->overlap_batch = (long)res->nbatches - 1;
    if (r.failed)
        rc = SQ_INTERNAL;
out:
    if (r.exec_us)
        for (int s = 0; s < r.nss; s++)
            free(r.exec_us[s]);
    free(r.exec_us);
    free(r.item_bytes);
    if (r.dev)
        for (int k = 0; k < res->ndevices; k++)
            free(r.dev[k].ids);
    free(r.dev);
    sq_iheap_dispose(&r.done);
    free(r.plan_at_us);
    free(r.plan_devices);
    if (r.stages)
        for (int p = 0; p < w->npipelines; p++) {
            if (r.stages[p])
                for (int k = 0; k < w->pipelines[p].nstages; k++)
                    free(r.stages[p][k].children);
            free(r.stages[p]);
        }
    free(r.stages);
    free(r.ss);
    free(r.qoff);
    free(r.pend);
    free(r.created);
    free(r.fired);
    free(r.complete);
    free(r.qhead);
    free(r.inext);
    free(r.qrng);
    free(r.kill);
    free(r.clump);
    pl_loop_free(r.loop);
    pl_dispatch_free(r.d);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu1);
    res->cpu_s = (double)(cpu1.tv_sec - cpu0.tv_sec) + (double)(cpu1.tv_nsec - cpu0.tv_nsec) / 1e9;
    return rc;
}
