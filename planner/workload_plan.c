/* The planner input built from a loaded workload (wl_plan_input_build*:
 * sessions, prefix groups as one session per SLO, pipelines' stages at
 * their split's budgets) and the plan JSON writer (wl_plan_to_json); see
 * workload.h. Calls the planner core (pl_prefix_profile, pl_query_split*,
 * pl_clump_dispersion); no call into the loader (workload.c). */
#include "workload.h"

#include <sq.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define US_PER_MS 1000.0

/* ---- planner input ------------------------------------------------------- */

static void input_push(wl_plan_input_t *in, int *cap, pl_session_t s, wl_source_t src)
{
    if (in->nsessions == *cap) {
        *cap = *cap ? 2 * *cap : 16;
        in->sessions = sq_xrealloc(in->sessions, sizeof(*in->sessions) * (size_t)*cap);
        in->sources = sq_xrealloc(in->sources, sizeof(*in->sources) * (size_t)*cap);
    }
    s.id = in->nsessions;
    in->sessions[in->nsessions] = s;
    in->sources[in->nsessions] = src;
    in->nsessions++;
}

double wl_stage_dispersion(const wl_pipeline_t *pl, int k, const pl_query_result_t *split)
{
    const wl_stage_t *st = &pl->stages[k];
    if (st->nafter == 0)
        return 1;
    double g = st->gamma[0];
    double var = st->gamma_dist == WL_GAMMA_POISSON ? g : (g - floor(g)) * (ceil(g) - g);
    return pl_clump_dispersion(g, var, split->batch[st->after[0]]);
}

int wl_plan_input_build(wl_plan_input_t *in, wl_workload_t *w)
{
    return wl_plan_input_build_split(in, w, WL_SPLIT_DP);
}

int wl_plan_input_build_split(wl_plan_input_t *in, wl_workload_t *w, wl_split_t split)
{
    memset(in, 0, sizeof(*in));
    in->split = split;
    in->options = (pl_options_t){.k_std = w->k_std,
                                 .device_memory_bytes = w->device_memory_mb * WL_BYTES_PER_MB,
                                 .links = w->device_links,
                                 .nlinks = w->ndevice_links};
    int cap = 0;
    for (int i = 0; i < w->nsessions; i++) {
        const wl_session_t *s = &w->sessions[i];
        const wl_model_t *m = &w->models[s->model];
        if (m->prefix_group >= 0)
            continue;
        input_push(in, &cap,
                   (pl_session_t){.model = s->model,
                                  .name = m->name,
                                  .profile = &m->profile,
                                  .slo_us = s->slo_ms * US_PER_MS,
                                  .rate_rps = s->rate_rps,
                                  .item_bytes = m->item_bytes},
                   (wl_source_t){.kind = WL_SOURCE_SESSION, .name = m->name, .index = i});
    }

    /* Prefix groups: one session per (group, SLO), members in workload order. */
    int *taken = sq_xcalloc((size_t)w->nsessions + 1, sizeof(int));
    in->profiles = sq_xcalloc((size_t)w->nsessions + 1, sizeof(*in->profiles));
    int rc = 0;
    for (int i = 0; i < w->nsessions && rc == 0; i++) {
        const wl_session_t *s = &w->sessions[i];
        int g = w->models[s->model].prefix_group;
        if (g < 0 || taken[i])
            continue;
        wl_source_t src = {.kind = WL_SOURCE_GROUP, .name = w->prefix_groups[g].name, .index = g};
        src.members = sq_xcalloc((size_t)w->nsessions, sizeof(int));
        const pl_profile_t **suffixes = sq_xcalloc((size_t)w->nsessions, sizeof(*suffixes));
        double *rates = sq_xcalloc((size_t)w->nsessions, sizeof(double));
        double total = 0, item_bytes = 0;
        for (int j = i; j < w->nsessions; j++) {
            const wl_session_t *o = &w->sessions[j];
            if (taken[j] || w->models[o->model].prefix_group != g || o->slo_ms != s->slo_ms)
                continue;
            taken[j] = 1;
            suffixes[src.nmembers] = &w->models[o->model].profile;
            rates[src.nmembers] = o->rate_rps;
            src.members[src.nmembers++] = j;
            total += o->rate_rps;
            /* A batch mixes the members: count the largest item. */
            if (w->models[o->model].item_bytes > item_bytes)
                item_bytes = w->models[o->model].item_bytes;
        }
        pl_profile_t *prof = &in->profiles[in->nprofiles];
        rc = pl_prefix_profile(prof, &w->prefix_groups[g].prefix, suffixes, rates, src.nmembers);
        free(suffixes);
        free(rates);
        if (rc < 0) {
            snprintf(w->error, sizeof(w->error),
                     "prefix_groups[%d]: no batch size runs prefix and suffixes together", g);
            free(src.members);
            break;
        }
        in->nprofiles++;
        input_push(in, &cap,
                   (pl_session_t){.model = w->nmodels + in->nprofiles - 1,
                                  .name = w->prefix_groups[g].name,
                                  .profile = prof,
                                  .slo_us = s->slo_ms * US_PER_MS,
                                  .rate_rps = total,
                                  .item_bytes = item_bytes},
                   src);
    }
    free(taken);

    in->nsplits = w->npipelines;
    in->splits = sq_xcalloc((size_t)w->npipelines + 1, sizeof(*in->splits));
    in->split_rc = sq_xcalloc((size_t)w->npipelines + 1, sizeof(int));
    for (int i = 0; i < w->npipelines && rc == 0; i++) {
        const wl_pipeline_t *pl = &w->pipelines[i];
        pl_stage_t *st = sq_xcalloc((size_t)pl->nstages, sizeof(*st));
        for (int k = 0; k < pl->nstages; k++)
            st[k] = (pl_stage_t){.profile = &w->models[pl->stages[k].model].profile,
                                 .nparents = pl->stages[k].nafter,
                                 .parents = pl->stages[k].after,
                                 .gamma = pl->stages[k].gamma};
        if (split == WL_SPLIT_EVEN)
            in->split_rc[i] = pl_query_split_even(&in->splits[i], st, pl->nstages,
                                                  pl->slo_ms * US_PER_MS, pl->rate_rps, w->k_std);
        else {
            in->split_rc[i] =
                pl_query_split(&in->splits[i], st, pl->nstages, pl->slo_ms * US_PER_MS,
                               pl->rate_rps, w->query_epsilon_ms * US_PER_MS, w->k_std);
            /* The slack to where the load is, as squishd does. */
            if (in->split_rc[i] == 0)
                in->split_rc[i] = pl_query_share_slack(&in->splits[i], st, pl->nstages,
                                                       pl->slo_ms * US_PER_MS, w->k_std);
        }
        free(st);
        if (in->split_rc[i] < 0)
            continue;
        for (int k = 0; k < pl->nstages; k++) {
            const wl_model_t *m = &w->models[pl->stages[k].model];
            double disp = wl_stage_dispersion(pl, k, &in->splits[i]);
            input_push(
                in, &cap,
                (pl_session_t){.model = pl->stages[k].model,
                               .name = m->name,
                               .profile = &m->profile,
                               .slo_us = in->splits[i].budget_us[k],
                               .rate_rps = in->splits[i].rate_rps[k],
                               .item_bytes = m->item_bytes,
                               .dispersion = disp},
                (wl_source_t){.kind = WL_SOURCE_STAGE, .name = m->name, .index = i, .stage = k});
        }
    }
    if (rc < 0)
        wl_plan_input_dispose(in);
    return rc;
}

void wl_plan_input_dispose(wl_plan_input_t *in)
{
    if (!in)
        return;
    for (int i = 0; i < in->nsessions; i++)
        free(in->sources[i].members);
    free(in->sources);
    free(in->sessions);
    for (int i = 0; i < in->nprofiles; i++)
        pl_profile_dispose(&in->profiles[i]);
    free(in->profiles);
    for (int i = 0; i < in->nsplits; i++)
        pl_query_result_dispose(&in->splits[i]);
    free(in->splits);
    free(in->split_rc);
    memset(in, 0, sizeof(*in));
}

/* ---- plan JSON ----------------------------------------------------------- */

/* The fields every session entry carries: what it is and where it came from. */
static json_t *session_json(const wl_workload_t *w, const wl_plan_input_t *in, int s)
{
    const pl_session_t *ps = &in->sessions[s];
    const wl_source_t *src = &in->sources[s];
    json_t *o = json_object();
    json_object_set_new(o, "session", json_integer(ps->id));
    json_object_set_new(o, "model", json_string(ps->name));
    json_object_set_new(o, "slo_ms", json_real(ps->slo_us / US_PER_MS));
    if (src->kind == WL_SOURCE_GROUP) {
        json_t *mem = json_array();
        for (int k = 0; k < src->nmembers; k++) {
            const wl_session_t *ws = &w->sessions[src->members[k]];
            json_t *m = json_object();
            json_object_set_new(m, "model", json_string(w->models[ws->model].name));
            json_object_set_new(m, "rate_rps", json_real(ws->rate_rps));
            json_array_append_new(mem, m);
        }
        json_object_set_new(o, "prefix_group", json_string(src->name));
        json_object_set_new(o, "members", mem);
    } else if (src->kind == WL_SOURCE_STAGE) {
        json_object_set_new(o, "pipeline", json_string(w->pipelines[src->index].name));
        json_object_set_new(o, "stage",
                            json_string(w->pipelines[src->index].stages[src->stage].id));
    }
    return o;
}

char *wl_plan_to_json(const wl_workload_t *w, const wl_plan_input_t *in, const pl_plan_t *plan,
                      int devices_needed)
{
    json_t *root = json_object();
    json_t *devs = json_array();
    for (int i = 0; i < plan->ndevices; i++) {
        const pl_device_t *d = &plan->devices[i];
        json_t *dj = json_object();
        json_object_set_new(dj, "id", json_integer(d->id));
        json_object_set_new(dj, "duty_cycle_ms", json_real(d->duty_cycle_us / US_PER_MS));
        json_object_set_new(dj, "occupancy", json_real(d->occupancy));
        json_object_set_new(dj, "memory_mb", json_real(d->memory_bytes / WL_BYTES_PER_MB));
        json_object_set_new(dj, "saturated", json_boolean(d->saturated));
        int remote = d->rtt_us > 0 || d->bytes_per_us > 0;
        if (remote) {
            json_object_set_new(dj, "rtt_ms", json_real(d->rtt_us / US_PER_MS));
            json_object_set_new(dj, "bandwidth_mbps", json_real(d->bytes_per_us * 8));
        }
        json_t *ss = json_array();
        for (int a = 0; a < d->nallocs; a++) {
            const pl_alloc_t *al = &d->allocs[a];
            json_t *sj = session_json(w, in, al->session);
            json_object_set_new(sj, "rate_rps", json_real(al->rate_rps));
            json_object_set_new(sj, "batch", json_integer(al->batch));
            json_object_set_new(sj, "latency_ms", json_real(al->latency_us / US_PER_MS));
            if (remote)
                json_object_set_new(sj, "transfer_ms", json_real(al->transfer_us / US_PER_MS));
            json_array_append_new(ss, sj);
        }
        json_object_set_new(dj, "sessions", ss);
        json_array_append_new(devs, dj);
    }
    json_object_set_new(root, "devices", devs);
    json_object_set_new(root, "devices_used", json_integer(plan->ndevices));
    json_object_set_new(root, "lower_bound_devices", json_real(plan->lower_bound_devices));
    json_object_set_new(
        root, "efficiency",
        json_real(plan->ndevices > 0 ? plan->lower_bound_devices / plan->ndevices : 1.0));
    json_t *un = json_array();
    for (int i = 0; i < plan->nunplaced; i++) {
        const pl_unplaced_t *u = &plan->unplaced[i];
        json_t *uj = session_json(w, in, u->session);
        json_object_set_new(uj, "rate_rps", json_real(u->rate_rps));
        json_object_set_new(uj, "reason", json_string(pl_unplaced_code(u->reason)));
        char dev[32], words[512];
        snprintf(dev, sizeof(dev), "device %d", u->device_id);
        const char *blocker =
            u->blocker_session >= 0 ? in->sessions[u->blocker_session].name : NULL;
        json_object_set_new(
            uj, "detail",
            json_string(pl_unplaced_words(words, sizeof(words), u, in->sessions[u->session].slo_us,
                                          plan->ndevices, dev, blocker)));
        json_array_append_new(un, uj);
    }
    json_object_set_new(root, "unplaced", un);
    if (plan->noverflow > 0) {
        json_t *ov = json_array();
        for (int i = 0; i < plan->noverflow; i++) {
            json_t *oj = session_json(w, in, plan->overflow[i].session);
            json_object_set_new(oj, "device", json_integer(plan->overflow[i].device_id));
            json_array_append_new(ov, oj);
        }
        json_object_set_new(root, "overflow", ov);
    }
    json_t *pls = json_array();
    for (int i = 0; i < in->nsplits; i++) {
        const wl_pipeline_t *pl = &w->pipelines[i];
        json_t *pj = json_object();
        json_object_set_new(pj, "name", json_string(pl->name));
        json_t *budgets = json_object(), *rates = json_object();
        if (in->split_rc[i] == 0) {
            for (int k = 0; k < pl->nstages; k++) {
                json_object_set_new(budgets, pl->stages[k].id,
                                    json_real(in->splits[i].budget_us[k] / US_PER_MS));
                json_object_set_new(rates, pl->stages[k].id, json_real(in->splits[i].rate_rps[k]));
            }
            json_object_set_new(pj, "cost_devices", json_real(in->splits[i].cost_devices));
        } else {
            json_object_set_new(pj, "error",
                                json_string(in->split_rc[i] == SQ_DEADLINE
                                                ? "no split of the SLO fits"
                                                : "not a fork-join pipeline"));
        }
        json_object_set_new(pj, "budgets_ms", budgets);
        json_object_set_new(pj, "rates_rps", rates);
        json_array_append_new(pls, pj);
    }
    json_object_set_new(root, "pipelines", pls);
    json_t *adv = json_object();
    int delta = w->device_count > 0 ? devices_needed - w->device_count : 0;
    json_object_set_new(adv, "devices_delta", json_integer(delta));
    json_object_set_new(adv, "devices_needed", json_integer(devices_needed));
    json_object_set_new(adv, "devices_available", json_integer(w->device_count));
    json_object_set_new(root, "advice", adv);
    char *s = sq_json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!s)
        abort(); /* a plan nests a few levels: a bug */
    return s;
}
