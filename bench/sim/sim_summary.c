/* squish-sim's JSON summary (sim_summary_json): totals, steps, drop
 * reasons, per model and per pipeline goodput and latency percentiles, and
 * with dump every request and batch. Calls sim_result.c (the ok
 * fractions). */
#include "sim.h"

#include <pl.h>
#include <sq.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static json_t *num(double x)
{
    /* Three decimals: µs resolution on ms values, and stable text. */
    return json_real(round(x * 1000) / 1000);
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *reason_name(int reason)
{
    return reason == SIM_REASON_QUERY ? "query_dropped" : sq_err_name(reason);
}

static const char *outcome_name(int o)
{
    switch (o) {
    case SIM_OK:
        return "ok";
    case SIM_LATE:
        return "late";
    case SIM_DROPPED:
        return "dropped";
    default:
        return "pending";
    }
}

char *sim_summary_json(const wl_workload_t *w, const sim_opts_t *opts, const sim_result_t *res,
                       double search_scale, int search_runs, int dump)
{
    json_t *root = json_object();
    double horizon = res->horizon_s > 0 ? res->horizon_s : 1;
    size_t bad = res->dropped + res->late + res->pending;
    json_object_set_new(root, "policy", json_string(pl_policy_name(opts->policy)));
    json_object_set_new(root, "seed",
                        json_integer((json_int_t)(opts->seed_given ? opts->seed : w->seed)));
    json_object_set_new(root, "devices", json_integer(res->ndevices));
    json_object_set_new(root, "rate_scale",
                        num(search_scale > 0 ? search_scale : opts->rate_scale));
    json_object_set_new(root, "horizon_s", num(res->horizon_s));
    json_object_set_new(root, "request_count", json_integer((json_int_t)res->nrequests));
    json_object_set_new(root, "offered_rps", num(res->offered_rps));
    json_object_set_new(root, "cpu_s", num(res->cpu_s));
    json_object_set_new(root, "cpu_us_per_request",
                        num(res->nrequests ? res->cpu_s * 1e6 / (double)res->nrequests : 0));
    double goodput = search_scale > 0 ? res->offered_rps : (double)res->ok / horizon;
    json_object_set_new(root, "goodput_rps", num(goodput));
    json_object_set_new(root, "bad_rate",
                        num(res->nrequests ? (double)bad / (double)res->nrequests : 0));
    json_object_set_new(root, "ok", json_integer((json_int_t)res->ok));
    json_object_set_new(root, "dropped", json_integer((json_int_t)res->dropped));
    json_object_set_new(root, "late", json_integer((json_int_t)res->late));
    json_object_set_new(root, "pending", json_integer((json_int_t)res->pending));
    double span_us = res->horizon_s * 1e6;
    for (size_t i = 0; i < res->nbatches; i++)
        if ((double)res->batches[i].end_us > span_us)
            span_us = (double)res->batches[i].end_us;
    json_object_set_new(
        root, "devices_busy_fraction",
        num(span_us > 0 && res->ndevices > 0 ? res->busy_us / (span_us * res->ndevices) : 0));
    json_object_set_new(root, "devices_used", json_integer(res->devices_used));
    if (res->planned_devices > 0)
        json_object_set_new(root, "planned_devices", json_integer(res->planned_devices));
    json_object_set_new(root, "unplaced_sessions", json_integer(res->unplaced_sessions));
    json_object_set_new(root, "batch_count", json_integer((json_int_t)res->nbatches));
    if (opts->epoch_s > 0)
        json_object_set_new(root, "epochs", json_integer(res->epochs));
    if (res->nsteps > 1 || opts->epoch_s > 0) {
        json_t *steps = json_array();
        for (int k = 0; k < res->nsteps; k++) {
            const sim_step_t *st = &res->steps[k];
            json_t *busy = json_array();
            for (int d = 0; d < res->ndevices; d++)
                json_array_append_new(busy, num(st->busy_fraction[d]));
            json_t *so =
                json_pack("{s:o, s:o, s:I, s:o, s:I, s:I, s:o}", "start_s", num(st->start_s),
                          "end_s", num(st->end_s), "requests", (json_int_t)st->requests,
                          "ok_fraction", json_real(round(sim_step_ok_fraction(st) * 1e6) / 1e6),
                          "dropped", (json_int_t)st->dropped, "late", (json_int_t)st->late,
                          "device_busy_fraction", busy);
            if (st->planned_devices > 0)
                json_object_set_new(so, "planned_devices", json_integer(st->planned_devices));
            json_array_append_new(steps, so);
        }
        json_object_set_new(root, "steps", steps);
    }
    json_object_set_new(root, "overlap_batch", json_integer(res->overlap_batch));
    if (search_scale > 0)
        json_object_set_new(root, "search",
                            json_pack("{s:f, s:i, s:f}", "target_ok_fraction", 0.99, "runs",
                                      search_runs, "ok_fraction", sim_ok_fraction(res)));

    json_t *reasons = json_object();
    for (size_t i = 0; i < res->nrequests; i++) {
        if (res->requests[i].outcome != SIM_DROPPED)
            continue;
        const char *name = reason_name(res->requests[i].reason);
        json_t *c = json_object_get(reasons, name);
        json_object_set_new(reasons, name, json_integer(c ? json_integer_value(c) + 1 : 1));
    }
    json_object_set_new(root, "drop_reasons", reasons);

    /* Per model: sessions of one model add up. */
    json_t *models = json_array();
    int nm = w->nmodels;
    size_t *req = sq_xcalloc((size_t)nm, sizeof(size_t)),
           *okc = sq_xcalloc((size_t)nm, sizeof(size_t));
    size_t *nb = sq_xcalloc((size_t)nm, sizeof(size_t)),
           *items = sq_xcalloc((size_t)nm, sizeof(size_t));
    size_t *drp = sq_xcalloc((size_t)nm, sizeof(size_t)),
           *lat = sq_xcalloc((size_t)nm, sizeof(size_t));
    for (size_t i = 0; i < res->nrequests; i++) {
        int m = res->session_model[res->requests[i].session];
        req[m]++;
        okc[m] += res->requests[i].outcome == SIM_OK;
        drp[m] += res->requests[i].outcome == SIM_DROPPED;
        lat[m] += res->requests[i].outcome == SIM_LATE;
    }
    for (size_t i = 0; i < res->nbatches; i++) {
        int m = res->session_model[res->batches[i].session];
        nb[m]++;
        items[m] += (size_t)res->batches[i].size;
    }
    double *qd = sq_xmalloc(sizeof(double) * (res->nrequests ? res->nrequests : 1));
    for (int m = 0; m < nm; m++) {
        int has = 0;
        for (int s = 0; s < res->nsessions; s++)
            has |= res->session_model[s] == m;
        if (!has)
            continue;
        size_t nq = 0;
        for (size_t i = 0; i < res->nrequests; i++)
            if (res->session_model[res->requests[i].session] == m && res->requests[i].sent_us >= 0)
                qd[nq++] = (double)(res->requests[i].sent_us - res->requests[i].arrival_us) / 1000;
        qsort(qd, nq, sizeof(double), dbl_cmp);
        double p99 = nq ? qd[(size_t)ceil(0.99 * (double)nq) - 1] : 0;
        /* Latency of the answered requests (in time or late): arrival to
         * the end of their batch. */
        size_t na = 0;
        for (size_t i = 0; i < res->nrequests; i++)
            if (res->session_model[res->requests[i].session] == m &&
                res->requests[i].outcome != SIM_DROPPED && res->requests[i].sent_us >= 0)
                qd[na++] =
                    (double)(res->requests[i].finish_us - res->requests[i].arrival_us) / 1000;
        qsort(qd, na, sizeof(double), dbl_cmp);
        double l50 = na ? qd[(size_t)ceil(0.50 * (double)na) - 1] : 0;
        double l99 = na ? qd[(size_t)ceil(0.99 * (double)na) - 1] : 0;
        json_t *mo = json_object();
        json_object_set_new(mo, "name", json_string(w->models[m].name));
        json_object_set_new(mo, "requests", json_integer((json_int_t)req[m]));
        json_object_set_new(mo, "offered_rps", num((double)req[m] / horizon));
        json_object_set_new(mo, "goodput_rps", num((double)okc[m] / horizon));
        json_object_set_new(mo, "bad_rate",
                            num(req[m] ? (double)(req[m] - okc[m]) / (double)req[m] : 0));
        json_object_set_new(mo, "dropped", json_integer((json_int_t)drp[m]));
        json_object_set_new(mo, "late", json_integer((json_int_t)lat[m]));
        json_object_set_new(mo, "batches", json_integer((json_int_t)nb[m]));
        json_object_set_new(mo, "batch_size_mean",
                            num(nb[m] ? (double)items[m] / (double)nb[m] : 0));
        json_object_set_new(mo, "queue_ms_p99", num(p99));
        json_object_set_new(mo, "latency_ms_p50", num(l50));
        json_object_set_new(mo, "latency_ms_p99", num(l99));
        json_array_append_new(models, mo);
    }
    free(qd);
    free(req);
    free(okc);
    free(nb);
    free(items);
    free(drp);
    free(lat);
    json_object_set_new(root, "models", models);

    /* Batch size distribution over all batches. */
    json_t *hist = json_object();
    for (size_t i = 0; i < res->nbatches; i++) {
        char key[16];
        snprintf(key, sizeof(key), "%d", res->batches[i].size);
        json_t *c = json_object_get(hist, key);
        json_object_set_new(hist, key, json_integer(c ? json_integer_value(c) + 1 : 1));
    }
    json_object_set_new(root, "batch_sizes", hist);

    if (res->npipelines > 0) {
        json_t *pls = json_array();
        double *ql = sq_xmalloc(sizeof(double) * (res->nqueries ? res->nqueries : 1));
        for (int p = 0; p < res->npipelines; p++) {
            const wl_pipeline_t *pl = &w->pipelines[p];
            const sim_pipeline_result_t *pr = &res->pipelines[p];
            double offered = (double)pr->queries / horizon;
            size_t qbad = pr->dropped + pr->late + pr->pending;
            json_t *po = json_object();
            json_object_set_new(po, "name", json_string(pl->name));
            json_object_set_new(po, "split",
                                json_string(opts->split == WL_SPLIT_EVEN ? "even" : "dp"));
            json_object_set_new(po, "queries", json_integer((json_int_t)pr->queries));
            json_object_set_new(po, "offered_qps", num(offered));
            json_object_set_new(po, "goodput_qps",
                                num(search_scale > 0 ? offered : (double)pr->ok / horizon));
            json_object_set_new(po, "bad_rate",
                                num(pr->queries ? (double)qbad / (double)pr->queries : 0));
            json_object_set_new(po, "ok", json_integer((json_int_t)pr->ok));
            json_object_set_new(po, "dropped", json_integer((json_int_t)pr->dropped));
            json_object_set_new(po, "late", json_integer((json_int_t)pr->late));
            json_object_set_new(po, "pending", json_integer((json_int_t)pr->pending));
            json_t *gm = json_object(), *bm = json_object();
            for (int k = 0; k < pl->nstages && k < pr->nstages; k++) {
                if (pl->stages[k].nafter > 0)
                    json_object_set_new(
                        gm, pl->stages[k].id,
                        num(pr->parents[k] > 0 ? pr->drawn[k] / pr->parents[k] : 0));
                json_object_set_new(bm, pl->stages[k].id, num(pr->budget_us[k] / 1000));
            }
            json_object_set_new(po, "gamma_measured", gm);
            json_object_set_new(po, "budgets_ms", bm);
            json_object_set_new(po, "cost_devices", num(pr->cost_devices));
            /* End-to-end latency of the good queries: arrival to their last
             * item done (at low load, what a user waits; near the SLO when
             * items wait to be batched). */
            size_t nl = 0;
            for (size_t i = 0; i < res->nqueries; i++)
                if (res->queries[i].pipeline == p && res->queries[i].outcome == SIM_OK)
                    ql[nl++] =
                        (double)(res->queries[i].finish_us - res->queries[i].arrival_us) / 1000;
            qsort(ql, nl, sizeof(double), dbl_cmp);
            json_object_set_new(po, "latency_ms_p50",
                                num(nl ? ql[(size_t)ceil(0.50 * (double)nl) - 1] : 0));
            json_object_set_new(po, "latency_ms_p99",
                                num(nl ? ql[(size_t)ceil(0.99 * (double)nl) - 1] : 0));
            json_array_append_new(pls, po);
        }
        free(ql);
        json_object_set_new(root, "pipelines", pls);
    }

    if (dump) {
        json_t *rq = json_array();
        for (size_t i = 0; i < res->nrequests; i++) {
            const sim_request_t *q = &res->requests[i];
            json_t *o = json_object();
            json_object_set_new(o, "model",
                                json_string(w->models[res->session_model[q->session]].name));
            json_object_set_new(o, "arrival_ms", num((double)q->arrival_us / 1000));
            json_object_set_new(o, "outcome", json_string(outcome_name(q->outcome)));
            json_object_set_new(o, "finish_ms",
                                q->finish_us >= 0 ? num((double)q->finish_us / 1000) : json_null());
            if (q->outcome == SIM_DROPPED)
                json_object_set_new(o, "reason", json_string(reason_name(q->reason)));
            if (q->query >= 0) {
                const wl_pipeline_t *pl = &w->pipelines[res->queries[q->query].pipeline];
                json_object_set_new(o, "pipeline", json_string(pl->name));
                json_object_set_new(o, "stage", json_string(pl->stages[q->stage].id));
                json_object_set_new(o, "query", json_integer(q->query));
            }
            json_array_append_new(rq, o);
        }
        json_object_set_new(root, "requests", rq);
        json_t *bs = json_array();
        for (size_t i = 0; i < res->nbatches; i++) {
            const sim_batch_t *b = &res->batches[i];
            json_array_append_new(bs,
                                  json_pack("{s:i, s:s, s:o, s:o, s:i}", "device", b->device,
                                            "model", w->models[res->session_model[b->session]].name,
                                            "start_ms", num((double)b->start_us / 1000), "end_ms",
                                            num((double)b->end_us / 1000), "size", b->size));
        }
        json_object_set_new(root, "batches", bs);
    }
    char *text = sq_json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    return text;
}
