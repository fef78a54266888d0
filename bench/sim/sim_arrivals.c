/* squish-sim's arrivals: each session's and each pipeline's stream (Poisson,
 * gamma, uniform segments, or a trace's times; sim_rng.h seeded per
 * stream), and the run's request and query tables built from them. Calls
 * no other file of the engine (sim_int.h). */
#include "sim_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t at_us;
    int session;
    uint32_t seq; /* per session, keeps the sort stable */
} arrival_t;

typedef struct {
    arrival_t *v;
    size_t n, cap;
} arrivals_t;

static void arrivals_push(arrivals_t *a, int64_t at_us, int session, uint32_t seq)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 4096;
        a->v = sq_xrealloc(a->v, sizeof(*a->v) * a->cap);
    }
    a->v[a->n++] = (arrival_t){.at_us = at_us, .session = session, .seq = seq};
}

static int arrival_cmp(const void *x, const void *y)
{
    const arrival_t *a = x, *b = y;
    if (a->at_us != b->at_us)
        return a->at_us < b->at_us ? -1 : 1;
    if (a->session != b->session)
        return a->session < b->session ? -1 : 1;
    return (a->seq > b->seq) - (a->seq < b->seq);
}

double sim__segments_stretch(const wl_arrivals_t *a, const sim_opts_t *o)
{
    if (o->duration_s <= 0 || a->process == WL_ARRIVALS_NONE || a->process == WL_ARRIVALS_TIMES)
        return 1;
    double total_s = 0;
    for (int k = 0; k < a->nsegments; k++)
        total_s += a->segments[k].duration_s;
    return total_s > 0 ? o->duration_s / total_s : 1;
}

/* Appends the arrivals of session idx (a pipeline's queries: idx past the
 * sessions) with process a and mean rate rate_rps; returns its span in
 * seconds. Gaps are drawn with mean 1 and divided by the rate, so a higher
 * scale replays the same pattern compressed in time (the goodput search
 * stays smooth). */
static double gen_arrivals(arrivals_t *out, const wl_arrivals_t *a, double rate_rps, int idx,
                           unsigned long long seed, const sim_opts_t *o)
{
    sim_rng_t rng;
    uint64_t mix = seed ^ (0xd1b54a32d192ed03ULL * (uint64_t)(idx + 1));
    sim_rng_seed(&rng, sim_splitmix64(&mix));
    uint32_t seq = 0;
    if (a->process == WL_ARRIVALS_TIMES) {
        int n = 0;
        for (; n < a->ntimes; n++) {
            double at_us = a->times_ms[n] * 1000 / o->rate_scale;
            if (o->duration_s > 0 && at_us >= o->duration_s * 1e6)
                break;
            arrivals_push(out, llround(at_us), idx, seq++);
        }
        return n ? a->times_ms[n - 1] / 1000 / o->rate_scale : 0;
    }
    wl_segment_t only = {.duration_s = o->duration_s > 0 ? o->duration_s : SIM_DEFAULT_DURATION_S,
                         .rate_rps = rate_rps};
    double stretch = sim__segments_stretch(a, o);
    const wl_segment_t *segs = a->process == WL_ARRIVALS_NONE ? &only : a->segments;
    int nsegs = a->process == WL_ARRIVALS_NONE ? 1 : a->nsegments;
    wl_process_t proc = a->process == WL_ARRIVALS_NONE ? WL_ARRIVALS_POISSON : a->process;
    double start_us = 0;
    for (int k = 0; k < nsegs; k++) {
        double end_us = start_us + segs[k].duration_s * stretch * 1e6;
        double rate_per_us = segs[k].rate_rps * o->rate_scale / 1e6;
        if (rate_per_us > 0) {
            double t = start_us;
            for (uint64_t i = 0;; i++) {
                double gap;
                if (proc == WL_ARRIVALS_UNIFORM)
                    gap = i == 0 ? 0 : 1;
                else if (proc == WL_ARRIVALS_GAMMA)
                    gap = sim_rng_gamma_mean1(&rng, a->shape);
                else
                    gap = sim_rng_exp(&rng);
                t = proc == WL_ARRIVALS_UNIFORM ? start_us + (double)i / rate_per_us
                                                : t + gap / rate_per_us;
                if (t >= end_us)
                    break;
                arrivals_push(out, llround(t), idx, seq++);
            }
        }
        start_us = end_us;
    }
    return start_us / 1e6;
}

/* The sessions' requests first (sorted by arrival), then the pipelines'
 * queries in their own streams, seeded past the sessions'. */
double sim__arrivals_build(run_t *r, unsigned long long seed, size_t *nsession_requests)
{
    const wl_workload_t *w = r->w;
    const sim_opts_t *o = r->o;
    sim_result_t *res = r->res;
    arrivals_t arr = {0}, qarr = {0};
    double horizon = 0;
    for (int s = 0; s < w->nsessions; s++) {
        double span =
            gen_arrivals(&arr, &w->sessions[s].arrivals, w->sessions[s].rate_rps, s, seed, o);
        if (span > horizon)
            horizon = span;
    }
    if (arr.n)
        qsort(arr.v, arr.n, sizeof(*arr.v), arrival_cmp);
    /* Pipeline queries: their own streams, seeded past the sessions'. */
    for (int p = 0; p < w->npipelines; p++) {
        double span = gen_arrivals(&qarr, &w->pipelines[p].arrivals, w->pipelines[p].rate_rps,
                                   w->nsessions + p, seed, o);
        if (span > horizon)
            horizon = span;
    }
    if (qarr.n)
        qsort(qarr.v, qarr.n, sizeof(*qarr.v), arrival_cmp);
    res->horizon_s = horizon;
    res->nrequests = arr.n;
    r->cap_requests = arr.n ? arr.n : 1;
    if (qarr.n)
        r->cap_requests += 4 * qarr.n;
    res->requests = sq_xcalloc(r->cap_requests, sizeof(*res->requests));
    r->inext = sq_xcalloc(r->cap_requests, sizeof(long));
    for (size_t i = 0; i < arr.n; i++) {
        const wl_session_t *ws = &w->sessions[arr.v[i].session];
        res->requests[i] =
            (sim_request_t){.session = arr.v[i].session,
                            .arrival_us = arr.v[i].at_us,
                            .deadline_us = arr.v[i].at_us + llround(ws->slo_ms * 1000),
                            .sent_us = -1,
                            .finish_us = -1,
                            .query = -1,
                            .stage = -1};
    }
    res->nqueries = qarr.n;
    res->queries = sq_xcalloc(qarr.n + 1, sizeof(*res->queries));
    r->qoff = sq_xcalloc(qarr.n + 1, sizeof(size_t));
    r->qhead = sq_xcalloc(qarr.n + 1, sizeof(long));
    r->qrng = sq_xcalloc(qarr.n + 1, sizeof(sim_rng_t));
    size_t nstate = 0;
    for (size_t i = 0; i < qarr.n; i++) {
        int p = qarr.v[i].session - w->nsessions; /* gen_arrivals' idx */
        res->queries[i] =
            (sim_query_t){.pipeline = p,
                          .arrival_us = qarr.v[i].at_us,
                          .deadline_us = qarr.v[i].at_us + llround(w->pipelines[p].slo_ms * 1000),
                          .finish_us = -1,
                          .outcome = SIM_PENDING};
        r->qoff[i] = nstate;
        nstate += (size_t)w->pipelines[p].nstages;
        r->qhead[i] = -1;
        /* A query's fan-outs depend on the query (its pipeline and its
         * place in the pipeline's stream), not on the order things finish:
         * a higher scale replays the same queries. */
        uint64_t mix = seed ^ (0x9e6c63d0676a9a99ULL * (uint64_t)(p + 1)) ^
                       (0xd1b54a32d192ed03ULL * (uint64_t)(qarr.v[i].seq + 1));
        sim_rng_seed(&r->qrng[i], sim_splitmix64(&mix));
    }
    r->pend = sq_xcalloc(nstate + 1, sizeof(int));
    r->created = sq_xcalloc(nstate + 1, sizeof(size_t));
    r->fired = sq_xcalloc(nstate + 1, 1);
    r->complete = sq_xcalloc(nstate + 1, 1);
    *nsession_requests = arr.n;
    free(arr.v);
    free(qarr.v);
    return horizon;
}
