/* squish-sim's results: the steps of a run (sim_step_t), the checker
 * (sim_check_overlap), the ok fractions and sim_result_dispose. Calls no
 * other file of the engine (sim_int.h). */
#include "sim_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- steps ---- */

static int dbl_less(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The steps (sim_step_t): cut [0, horizon] at every session's segment
 * boundaries; count each step's requests by arrival, its devices' batch
 * time, and the most devices a plan in force used. */
void sim__steps_fill(const run_t *r, sim_result_t *res)
{
    int cap = 2;
    for (int s = 0; s < r->nss; s++)
        if (r->ss[s].arrivals->process != WL_ARRIVALS_NONE &&
            r->ss[s].arrivals->process != WL_ARRIVALS_TIMES)
            cap += r->ss[s].arrivals->nsegments;
    double *cut = sq_xmalloc(sizeof(double) * (size_t)cap);
    int nc = 0;
    cut[nc++] = 0;
    cut[nc++] = res->horizon_s;
    for (int s = 0; s < r->nss; s++) {
        const wl_arrivals_t *a = r->ss[s].arrivals;
        if (a->process == WL_ARRIVALS_NONE || a->process == WL_ARRIVALS_TIMES)
            continue;
        double t = 0, stretch = sim__segments_stretch(a, r->o);
        for (int k = 0; k < a->nsegments; k++) {
            t += a->segments[k].duration_s * stretch;
            if (t < res->horizon_s)
                cut[nc++] = t;
        }
    }
    qsort(cut, (size_t)nc, sizeof(double), dbl_less);
    res->steps = sq_xcalloc((size_t)nc, sizeof(*res->steps));
    for (int i = 1; i < nc; i++) {
        if (cut[i] <= cut[i - 1])
            continue;
        sim_step_t *st = &res->steps[res->nsteps++];
        st->start_s = cut[i - 1];
        st->end_s = cut[i];
        st->busy_fraction = sq_xcalloc((size_t)(res->ndevices ? res->ndevices : 1), sizeof(double));
    }
    free(cut);
    for (size_t i = 0; i < res->nrequests; i++) {
        const sim_request_t *q = &res->requests[i];
        double t = (double)q->arrival_us / 1e6;
        for (int k = 0; k < res->nsteps; k++) {
            sim_step_t *st = &res->steps[k];
            if (t < st->start_s || (t >= st->end_s && k < res->nsteps - 1))
                continue;
            st->requests++;
            st->ok += q->outcome == SIM_OK;
            st->dropped += q->outcome == SIM_DROPPED;
            st->late += q->outcome == SIM_LATE;
            break;
        }
    }
    for (int k = 0; k < res->nsteps; k++) {
        sim_step_t *st = &res->steps[k];
        int64_t a = llround(st->start_s * 1e6), b = llround(st->end_s * 1e6);
        for (size_t i = 0; i < res->nbatches; i++) {
            const sim_batch_t *bt = &res->batches[i];
            int64_t lo = bt->start_us > a ? bt->start_us : a;
            int64_t hi = bt->end_us < b ? bt->end_us : b;
            if (hi > lo && bt->device >= 0 && bt->device < res->ndevices)
                st->busy_fraction[bt->device] += (double)(hi - lo);
        }
        for (int d = 0; d < res->ndevices; d++)
            st->busy_fraction[d] /= (double)(b - a);
        for (int p = 0; p < r->nplans; p++) {
            int in_force = r->plan_at_us[p] < b && (p + 1 == r->nplans || r->plan_at_us[p + 1] > a);
            if (in_force && r->plan_devices[p] > st->planned_devices)
                st->planned_devices = r->plan_devices[p];
        }
    }
}

double sim_step_ok_fraction(const sim_step_t *step)
{
    return step->requests ? (double)step->ok / (double)step->requests : 1;
}

void sim_result_dispose(sim_result_t *res)
{
    if (res == NULL)
        return;
    free(res->requests);
    free(res->batches);
    for (int k = 0; k < res->nsteps; k++)
        free(res->steps[k].busy_fraction);
    free(res->steps);
    free(res->session_model);
    free(res->queries);
    for (int p = 0; p < res->npipelines; p++) {
        free(res->pipelines[p].budget_us);
        free(res->pipelines[p].rate_rps);
        free(res->pipelines[p].drawn);
        free(res->pipelines[p].parents);
    }
    free(res->pipelines);
    res->requests = NULL;
    res->batches = NULL;
    res->steps = NULL;
    res->nsteps = 0;
    res->session_model = NULL;
    res->queries = NULL;
    res->pipelines = NULL;
    res->npipelines = 0;
}

double sim_ok_fraction(const sim_result_t *res)
{
    if (res->npipelines == 0)
        return res->nrequests ? (double)res->ok / (double)res->nrequests : 1;
    double f = res->session_requests ? (double)res->session_ok / (double)res->session_requests : 1;
    for (int p = 0; p < res->npipelines; p++) {
        const sim_pipeline_result_t *pr = &res->pipelines[p];
        double g = pr->queries ? (double)pr->ok / (double)pr->queries : 1;
        if (g < f)
            f = g;
    }
    return f;
}

/* ---- checker ---- */

typedef struct {
    int device;
    int64_t start_us, end_us;
    size_t index;
} span_t;

static int span_cmp(const void *x, const void *y)
{
    const span_t *a = x, *b = y;
    if (a->device != b->device)
        return a->device < b->device ? -1 : 1;
    if (a->start_us != b->start_us)
        return a->start_us < b->start_us ? -1 : 1;
    return (a->index > b->index) - (a->index < b->index);
}

long sim_check_overlap(const sim_batch_t *batches, size_t nbatches, int ndevices)
{
    if (nbatches == 0)
        return -1;
    span_t *s = sq_xmalloc(sizeof(*s) * nbatches);
    for (size_t i = 0; i < nbatches; i++)
        s[i] = (span_t){.device = batches[i].device,
                        .start_us = batches[i].start_us,
                        .end_us = batches[i].end_us,
                        .index = i};
    qsort(s, nbatches, sizeof(*s), span_cmp);
    long bad = -1;
    for (size_t i = 0; i < nbatches && bad < 0; i++) {
        if (s[i].device < 0 || s[i].device >= ndevices || s[i].end_us < s[i].start_us)
            bad = (long)s[i].index;
        else if (i > 0 && s[i].device == s[i - 1].device && s[i].start_us < s[i - 1].end_us)
            bad = (long)s[i].index;
    }
    free(s);
    return bad;
}