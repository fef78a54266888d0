/* planner/loop.c: the planning loop's rules one by one, and an epoch's plan
 * on another thread. The loop driven by squish-sim and by squishd is in
 * test_loop_trace.c. */
#include <criterion/criterion.h>

#include "batcher_int.h"
#include "gw_metrics.h"
#include "gw_catalog.h"
#include "sim.h"

#include <pl_loop.h>
#include <unistd.h>
#include <workload.h>

#include <sq.h>

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the rules ---------------------------------------------------------- */

static pl_profile_t linear(double alpha_ms, double beta_ms, int max_batch)
{
    pl_profile_t p;
    pl_profile_init_linear(&p, alpha_ms * 1000, beta_ms * 1000, max_batch);
    return p;
}

static pl_loop_t *one_model_loop(pl_profile_t *prof, int64_t now)
{
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.slo_bucket_ms = pl_loop_slo_bucket_ms;
    pl_loop_t *l = pl_loop_new(&c, now);
    pl_loop_model_set(l, 7,
                      &(pl_loop_model_t){.kind = 0, .profile = prof, .name = "m", .active = 1});
    return l;
}

static double rate_of(const pl_loop_t *l, int64_t model, double slo_ms)
{
    pl_loop_session_info_t si;
    int id = pl_loop_session((pl_loop_t *)l, model, slo_ms, 0);
    cr_assert_geq(id, 0);
    pl_loop_session_by_id(l, id, &si);
    return si.rate_rps;
}

Test(loop, a_rate_goes_up_with_the_last_second_and_down_over_tau)
{
    pl_profile_t prof = linear(1, 5, 32);
    pl_loop_t *l = one_model_loop(&prof, 0);
    /* 10 s at 100 req/s, then one second at 400: planned at 400 at once. */
    for (int s = 1; s <= 10; s++) {
        pl_loop_arrivals(l, 7, 100, 100);
        pl_loop_advance(l, s * 1000000LL);
    }
    double before = rate_of(l, 7, 100);
    cr_assert(before > 60 && before <= 100, "EWMA after 10 s at 100: %f", before);
    pl_loop_arrivals(l, 7, 100, 400);
    pl_loop_advance(l, 11000000);
    cr_assert_float_eq(rate_of(l, 7, 100), 400, 1e-9);
    /* Then silence: the EWMA comes down over tau, not at once. */
    pl_loop_advance(l, 12000000);
    double after = rate_of(l, 7, 100);
    cr_assert(after > 0.8 * before && after < 400, "one quiet second later: %f", after);
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, a_session_is_planned_at_the_least_slo_of_its_requests_not_its_bucket)
{
    /* l(1) = 11 ms: 2 l(1) fits 27 ms but not bucket 25's 25 ms. */
    pl_profile_t prof = linear(1, 10, 8);
    pl_loop_t *l = one_model_loop(&prof, 0);
    cr_assert_float_eq(pl_loop_slo_bucket_ms(27), 25, 1e-9);
    pl_loop_arrivals(l, 7, 27, 20);
    cr_assert_eq(pl_loop_advance(l, 1000000), 0u, "no plan yet, nothing due");
    int keys[2] = {0, 1};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 2, .keys = keys}, 1000000), 0);
    const pl_plan_t *plan = pl_loop_current(l, 0);
    cr_assert_eq(plan->nunplaced, 0, "planned at 27 ms it has a batch");
    cr_assert_eq(plan->ndevices, 1);
    int n;
    const pl_session_t *ss = pl_loop_planned_sessions(l, 0, &n);
    cr_assert_eq(n, 1);
    cr_assert_float_eq(ss[0].slo_us, 27000, 1e-6);
    cr_assert_str_eq(ss[0].name, "m");
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, an_idle_session_beside_a_busy_one_of_its_model_is_not_planned)
{
    pl_profile_t prof = linear(1, 5, 32);
    pl_loop_t *l = one_model_loop(&prof, 0);
    pl_loop_session(l, 7, 400, 1);
    pl_loop_arrivals(l, 7, 100, 50);
    pl_loop_advance(l, 1000000);
    int keys[2] = {0, 1};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 2, .keys = keys}, 1000000), 0);
    int n;
    const pl_session_t *ss = pl_loop_planned_sessions(l, 0, &n);
    cr_assert_eq(n, 1, "the 400 ms session without traffic stays out");
    cr_assert_float_eq(ss[0].slo_us, 100000, 1e-6);
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, a_stage_rate_moves_with_its_budget_at_once_and_re_plans)
{
    pl_profile_t det = linear(4, 6, 32), cls = linear(1, 2, 32);
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.slo_bucket_ms = pl_loop_slo_bucket_ms;
    pl_loop_t *l = pl_loop_new(&c, 0);
    pl_loop_model_set(l, 1, &(pl_loop_model_t){.profile = &det, .name = "det", .active = 1});
    pl_loop_model_set(l, 2, &(pl_loop_model_t){.profile = &cls, .name = "cls", .active = 1});
    pl_loop_stage_t st[2] = {{.model = 1, .parent = -1, .budget_ms = 200},
                             {.model = 2, .parent = 0, .gamma = 2, .budget_ms = 100}};
    pl_loop_pipeline_set(l, 9, 300, st, 2);
    pl_loop_stage_arrivals(l, 9, 1, 300, 2, 200);
    pl_loop_advance(l, 1000000);
    cr_assert_float_eq(rate_of(l, 2, 100), 200, 1e-9);
    int keys[2] = {0, 1};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 2, .keys = keys}, 1000000), 0);
    cr_assert_eq(pl_loop_dirty(l), 0u);
    /* The split moves the classifier to 150 ms: all of its rate there. */
    st[0].budget_ms = 150;
    st[1].budget_ms = 150;
    pl_loop_pipeline_set(l, 9, 300, st, 2);
    cr_assert_float_eq(rate_of(l, 2, 150), 200, 1e-9);
    cr_assert_float_eq(rate_of(l, 2, 100), 0, 1e-9);
    cr_assert_eq(pl_loop_dirty(l), 1u);
    cr_assert_str_eq(pl_loop_reason(l, 0), "pipeline split moved");
    pl_loop_free(l);
    pl_profile_dispose(&det);
    pl_profile_dispose(&cls);
}

Test(loop, an_unplaced_session_falls_back_to_the_devices_holding_its_model)
{
    pl_profile_t prof = linear(1, 5, 32);
    pl_loop_t *l = one_model_loop(&prof, 0);
    pl_loop_arrivals(l, 7, 100, 10);
    pl_loop_advance(l, 1000000);
    pl_route_t r[8];
    int holders[2] = {3, 5}, fell = 0;
    pl_loop_route_env_t env = {.holders = holders, .nholders = 2, .used_fallback = &fell};
    int n = pl_loop_routes(l, 7, 100, &env, r, 8);
    cr_assert_eq(n, 2, "no plan yet: the holders");
    cr_assert_eq(r[0].worker, 3);
    cr_assert_eq(r[1].worker, 5);
    cr_assert_eq(fell, 1);
    int keys[1] = {5};
    cr_assert_eq(pl_loop_plan(l, 0, &(pl_loop_devices_t){.n = 1, .keys = keys}, 1000000), 0);
    n = pl_loop_routes(l, 7, 100, &env, r, 8);
    cr_assert_eq(n, 1, "planned: its device, named by its key");
    cr_assert_eq(r[0].worker, 5);
    cr_assert_eq(r[0].target_batch, pl_loop_current(l, 0)->devices[0].allocs[0].batch);
    cr_assert_eq(fell, 0);
    int held[4];
    cr_assert_eq(pl_loop_holders(l, 0, 7, held, 4), 1);
    cr_assert_eq(held[0], 5);
    pl_loop_free(l);
    pl_profile_dispose(&prof);
}

Test(loop, the_even_split_gives_each_stage_its_longest_paths_share)
{
    /* a -> b -> c and a -> d: squishd's old even split gave d 100 ms too
     * (the SLO over the deepest path); d's path has two stages. */
    int pa = 0, pb = 1;
    pl_stage_t st[4] = {{.nparents = 0},
                        {.nparents = 1, .parents = &pa},
                        {.nparents = 1, .parents = &pb},
                        {.nparents = 1, .parents = &pa}};
    double b[4];
    cr_assert_eq(pl_query_even_budgets(st, 4, 300000, b), 0);
    cr_assert_float_eq(b[0], 100000, 1e-6);
    cr_assert_float_eq(b[1], 100000, 1e-6);
    cr_assert_float_eq(b[2], 100000, 1e-6);
    cr_assert_float_eq(b[3], 150000, 1e-6);
}

Test(loop, the_split_floors_the_rate_and_steps_at_most_a_thousandth_of_the_slo)
{
    pl_profile_t det = linear(23.778, 9.729, 128), cls = linear(1.964, 8.771, 128);
    int p0 = 0;
    double g = 1;
    pl_stage_t st[2] = {{.profile = &det},
                        {.profile = &cls, .nparents = 1, .parents = &p0, .gamma = &g}};
    pl_loop_split_in_t in = {.stages = st, .nstages = 2, .slo_us = 300000, .epsilon_us = 1000};
    double at0[2], at1[2], at100[2], at200[2];
    pl_loop_split_why_t why;
    int missing;
    cr_assert_eq(pl_loop_split(&in, at0, &why, &missing, NULL), 0);
    cr_assert_eq(why, PL_LOOP_SPLIT_DP);
    in.rate_qps = 1;
    pl_loop_split(&in, at1, &why, &missing, NULL);
    in.rate_qps = 100;
    pl_loop_split(&in, at100, &why, &missing, NULL);
    in.rate_qps = 200;
    pl_loop_split(&in, at200, &why, &missing, NULL);
    for (int k = 0; k < 2; k++) {
        cr_assert_float_eq(at0[k], at1[k], 1e-9, "rate 0 plans as 1 q/s");
        /* Linear profiles: the cheapest split is the same at any rate, and
         * at several devices' load (2.4 and 4.8 for the detector) the
         * split keeps to it. */
        cr_assert_float_eq(at100[k], at200[k], 1e-6, "the split does not move with the rate");
    }
    /* At 1 q/s, on the one device any split needs, each stage gets its
     * floor (2 l(1)) and an equal share of the rest. */
    double slack_det = at1[0] - 2 * pl_latency_us(&det, 1, 0),
           slack_cls = at1[1] - 2 * pl_latency_us(&cls, 1, 0);
    cr_assert_float_eq(slack_det, slack_cls, 1e-6, "slack %f and %f us", slack_det, slack_cls);
    cr_assert(fabs(at1[0] - at100[0]) > 1000, "the cheapest split is another");
    /* A 0.3 ms step at 300 ms: a budget off the 1 ms grid. */
    cr_assert(fabs(at100[0] / 1000 - round(at100[0] / 1000)) > 1e-6, "detect %f us", at100[0]);
    /* A missing profile: the even split, and no result. */
    st[1].profile = NULL;
    pl_query_result_t res;
    cr_assert_eq(pl_loop_split(&in, at0, &why, &missing, &res), SQ_DEADLINE);
    cr_assert_eq(why, PL_LOOP_SPLIT_EVEN_NO_PROFILE);
    cr_assert_eq(missing, 1);
    cr_assert_float_eq(at0[0], 150000, 1e-6);
    pl_profile_dispose(&det);
    pl_profile_dispose(&cls);
}

/* ---- an epoch's plan on another thread ---------------------------------- */

static void plan_assert_eq(const pl_plan_t *a, const pl_plan_t *b)
{
    cr_assert_eq(a->ndevices, b->ndevices);
    for (int i = 0; i < a->ndevices; i++) {
        const pl_device_t *x = &a->devices[i], *y = &b->devices[i];
        cr_assert_eq(x->id, y->id);
        cr_assert_eq(x->saturated, y->saturated);
        cr_assert(x->duty_cycle_us == y->duty_cycle_us && x->occupancy == y->occupancy &&
                  x->memory_bytes == y->memory_bytes && x->rtt_us == y->rtt_us &&
                  x->bytes_per_us == y->bytes_per_us);
        cr_assert_eq(x->nallocs, y->nallocs);
        for (int k = 0; k < x->nallocs; k++) {
            const pl_alloc_t *p = &x->allocs[k], *q = &y->allocs[k];
            cr_assert(p->session == q->session && p->session_id == q->session_id &&
                      p->model == q->model && p->batch == q->batch &&
                      p->latency_us == q->latency_us && p->transfer_us == q->transfer_us &&
                      p->rate_rps == q->rate_rps);
        }
    }
    cr_assert_eq(a->nunplaced, b->nunplaced);
    for (int u = 0; u < a->nunplaced; u++)
        cr_assert(a->unplaced[u].session == b->unplaced[u].session &&
                  a->unplaced[u].session_id == b->unplaced[u].session_id &&
                  a->unplaced[u].rate_rps == b->unplaced[u].rate_rps &&
                  a->unplaced[u].reason == b->unplaced[u].reason);
    cr_assert(a->lower_bound_devices == b->lower_bound_devices);
    cr_assert(a->moved == b->moved && a->evicted == b->evicted && a->released == b->released);
    cr_assert_eq(a->noverflow, b->noverflow);
    for (int o = 0; o < a->noverflow; o++)
        cr_assert(a->overflow[o].device_id == b->overflow[o].device_id &&
                  a->overflow[o].session == b->overflow[o].session &&
                  a->overflow[o].session_id == b->overflow[o].session_id &&
                  a->overflow[o].model == b->overflow[o].model);
}

static void loops_assert_eq(const pl_loop_t *a, const pl_loop_t *b, int kind)
{
    cr_assert_eq(pl_loop_epochs(a), pl_loop_epochs(b));
    plan_assert_eq(pl_loop_current(a, kind), pl_loop_current(b, kind));
    for (int d = 0; d < pl_loop_current(a, kind)->ndevices + 2; d++)
        cr_assert_eq(pl_loop_device_key(a, kind, d), pl_loop_device_key(b, kind, d));
    int na, nb;
    const pl_session_t *sa = pl_loop_planned_sessions(a, kind, &na);
    const pl_session_t *sb = pl_loop_planned_sessions(b, kind, &nb);
    cr_assert_eq(na, nb);
    for (int i = 0; i < na; i++) {
        cr_assert(sa[i].id == sb[i].id && sa[i].model == sb[i].model &&
                  sa[i].slo_us == sb[i].slo_us && sa[i].rate_rps == sb[i].rate_rps &&
                  sa[i].item_bytes == sb[i].item_bytes && sa[i].dispersion == sb[i].dispersion);
        cr_assert_str_eq(sa[i].name, sb[i].name);
        cr_assert(pl_latency_us(sa[i].profile, 1, 0) == pl_latency_us(sb[i].profile, 1, 0));
    }
}

/* Models 1..4 (kinds 0, 0, 0, 1), each at two SLOs; names and profiles
 * on the heap, so that ASan sees a job reading them after they go. */
typedef struct {
    pl_profile_t *prof[5];
    char *name[5];
} models_t;

static pl_loop_t *multi_loop(models_t *m)
{
    pl_loop_config_t c;
    pl_loop_config_default(&c);
    c.slo_bucket_ms = pl_loop_slo_bucket_ms;
    c.nkinds = 2;
    pl_loop_t *l = pl_loop_new(&c, 0);
    for (int k = 1; k <= 4; k++) {
        m->prof[k] = sq_xmalloc(sizeof(pl_profile_t));
        *m->prof[k] = linear(0.5 * k, 2 + k, 32);
        char buf[16];
        snprintf(buf, sizeof(buf), "model-%d", k);
        m->name[k] = sq_xstrdup(buf);
        pl_loop_model_set(l, k,
                          &(pl_loop_model_t){.kind = k == 4,
                                             .profile = m->prof[k],
                                             .name = m->name[k],
                                             .item_bytes = 1000,
                                             .active = 1});
    }
    for (int s = 1; s <= 3; s++) {
        for (int k = 1; k <= 4; k++) {
            pl_loop_arrivals(l, k, 100, 40.0 * k * s);
            pl_loop_arrivals(l, k, 400, 300.0 / k);
        }
        pl_loop_advance(l, s * 1000000LL);
    }
    return l;
}

static void models_free(models_t *m)
{
    for (int k = 1; k <= 4; k++) {
        if (m->prof[k] != NULL)
            pl_profile_dispose(m->prof[k]);
        free(m->prof[k]);
        free(m->name[k]);
        m->prof[k] = NULL;
        m->name[k] = NULL;
    }
}

Test(loop, begin_run_finish_gives_the_plan_pl_loop_plan_gives)
{
    models_t ma = {0}, mb = {0};
    pl_loop_t *a = multi_loop(&ma), *b = multi_loop(&mb);
    int keys1[6] = {10, 11, 12, 13, 14, 15};
    pl_link_t links[6] = {{0, 0}, {0, 0}, {100, 1000}, {0, 0}, {200, 500}, {0, 0}};
    pl_loop_devices_t d1 = {.n = 6, .keys = keys1, .links = links, .nlinks = 6};
    cr_assert_eq(pl_loop_plan(a, 0, &d1, 3000000), 0);
    int rc;
    pl_loop_job_t *j = pl_loop_plan_begin(b, 0, &d1, 3000000, &rc);
    cr_assert_not_null(j);
    pl_loop_job_run(j);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0);
    loops_assert_eq(a, b, 0);
    /* An incremental epoch on other devices (one gone, one new), kind 1
     * uncapped. */
    for (int k = 1; k <= 4; k++) {
        pl_loop_arrivals(a, k, 100, 90.0 * k);
        pl_loop_arrivals(b, k, 100, 90.0 * k);
    }
    pl_loop_advance(a, 4000000);
    pl_loop_advance(b, 4000000);
    int keys2[6] = {15, 11, 16, 10, 13, 12};
    pl_loop_devices_t d2 = {.n = 6, .keys = keys2};
    cr_assert_eq(pl_loop_plan(a, 0, &d2, 4000000), 0);
    j = pl_loop_plan_begin(b, 0, &d2, 4000000, &rc);
    pl_loop_job_run(j);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0);
    loops_assert_eq(a, b, 0);
    pl_loop_devices_t un = {.uncapped = 1};
    cr_assert_eq(pl_loop_plan(a, 1, &un, 4000000), 0);
    j = pl_loop_plan_begin(b, 1, &un, 4000000, &rc);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0, "finish runs a job not run");
    loops_assert_eq(a, b, 1);
    /* No device: 1 and no job, as pl_loop_plan. */
    pl_loop_devices_t none = {.n = 0};
    cr_assert_eq(pl_loop_plan(a, 0, &none, 5000000), 1);
    cr_assert_null(pl_loop_plan_begin(b, 0, &none, 5000000, &rc));
    cr_assert_eq(rc, 1);
    loops_assert_eq(a, b, 0);
    pl_loop_free(a);
    pl_loop_free(b);
    models_free(&ma);
    models_free(&mb);
}

static void *run_job(void *j)
{
    pl_loop_job_run(j);
    return NULL;
}

Test(loop, a_job_runs_on_a_thread_while_the_loop_changes)
{
    models_t ma = {0}, mb = {0};
    pl_loop_t *a = multi_loop(&ma), *b = multi_loop(&mb);
    int *keys = sq_xmalloc(sizeof(int) * 4);
    pl_link_t *links = sq_xmalloc(sizeof(pl_link_t) * 4);
    for (int i = 0; i < 4; i++) {
        keys[i] = 20 + i;
        links[i] = (pl_link_t){.rtt_us = 50.0 * i, .bytes_per_us = 1000};
    }
    pl_loop_devices_t d = {.n = 4, .keys = keys, .links = links, .nlinks = 4};
    /* A first plan in force: the job plans incrementally from it. */
    cr_assert_eq(pl_loop_plan(a, 0, &d, 3000000), 0);
    cr_assert_eq(pl_loop_plan(b, 0, &d, 3000000), 0);
    for (int k = 1; k <= 4; k++) {
        pl_loop_arrivals(a, k, 100, 60.0 * k);
        pl_loop_arrivals(b, k, 100, 60.0 * k);
    }
    pl_loop_advance(a, 4000000);
    pl_loop_advance(b, 4000000);
    /* a: the plan of the begin-time loop, on one thread. */
    cr_assert_eq(pl_loop_plan(a, 0, &d, 4000000), 0);
    int rc;
    pl_loop_job_t *j = pl_loop_plan_begin(b, 0, &d, 4000000, &rc);
    cr_assert_not_null(j);
    /* The devices, the models' profiles and names go while it runs. */
    free(keys);
    free(links);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, run_job, j), 0);
    pl_loop_model_forget(b, 2);
    pl_profile_dispose(mb.prof[2]);
    free(mb.prof[2]);
    free(mb.name[2]);
    mb.prof[2] = NULL;
    mb.name[2] = NULL;
    pl_profile_t *np = sq_xmalloc(sizeof(*np));
    *np = linear(3, 9, 16);
    char *nn = sq_xstrdup("model-1-again");
    pl_loop_model_set(b, 1, &(pl_loop_model_t){.kind = 0, .profile = np, .name = nn, .active = 1});
    pl_profile_dispose(mb.prof[1]);
    free(mb.prof[1]);
    free(mb.name[1]);
    mb.prof[1] = np;
    mb.name[1] = nn;
    for (int s = 0; s < 200; s++) {
        pl_loop_arrivals(b, 1 + s % 4, 50 + s, 3);
        pl_loop_seed(b, 5 + s % 7, 100, 10, 1);
    }
    pl_loop_advance(b, 5000000);
    pl_loop_devices_t un = {.uncapped = 1};
    cr_assert_eq(pl_loop_plan(b, 1, &un, 5000000), 0, "another kind plans meanwhile");
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_eq(pl_loop_plan_finish(b, j), 0);
    /* The plan of the begin-time snapshot, its sessions' names and
     * profiles the loop's own copies. */
    plan_assert_eq(pl_loop_current(a, 0), pl_loop_current(b, 0));
    int na, nb;
    const pl_session_t *sa = pl_loop_planned_sessions(a, 0, &na);
    const pl_session_t *sb = pl_loop_planned_sessions(b, 0, &nb);
    cr_assert_eq(na, nb);
    for (int i = 0; i < na; i++) {
        cr_assert(sa[i].id == sb[i].id && sa[i].rate_rps == sb[i].rate_rps);
        cr_assert_str_eq(sb[i].name, sa[i].name, "the name at begin, not the one set since");
        cr_assert(pl_latency_us(sb[i].profile, 4, 0) == pl_latency_us(sa[i].profile, 4, 0));
    }
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pl_loop_device_key(b, 0, i), 20 + i);
    cr_assert_eq(pl_loop_epochs(b), pl_loop_epochs(a) + 1, "kind 1's epoch too");
    pl_loop_free(a);
    pl_loop_free(b);
    models_free(&ma);
    models_free(&mb);
}

Test(loop, a_second_job_for_a_kind_in_flight_is_refused)
{
    models_t m = {0};
    pl_loop_t *l = multi_loop(&m);
    int keys[3] = {1, 2, 3};
    pl_loop_devices_t d = {.n = 3, .keys = keys};
    pl_loop_devices_t un = {.uncapped = 1};
    int rc;
    pl_loop_job_t *j0 = pl_loop_plan_begin(l, 0, &d, 3000000, &rc);
    cr_assert_not_null(j0);
    cr_assert_null(pl_loop_plan_begin(l, 0, &d, 3000000, &rc));
    cr_assert_eq(rc, SQ_EXISTS);
    cr_assert_eq(pl_loop_plan(l, 0, &d, 3000000), SQ_EXISTS);
    pl_loop_job_t *j1 = pl_loop_plan_begin(l, 1, &un, 3000000, &rc);
    cr_assert_not_null(j1, "another kind's job may be in flight");
    pl_loop_job_run(j0);
    cr_assert_null(pl_loop_plan_begin(l, 0, &d, 3000000, &rc), "run, not finished");
    cr_assert_eq(pl_loop_plan_finish(l, j0), 0);
    j0 = pl_loop_plan_begin(l, 0, &d, 3500000, &rc);
    cr_assert_not_null(j0, "finished: a next job may begin");
    /* Abandoned: freed unfinished, the kind free again and dirty. */
    pl_loop_job_free(l, j1);
    cr_assert(pl_loop_dirty(l) & 2u);
    cr_assert_null(pl_loop_current(l, 1));
    j1 = pl_loop_plan_begin(l, 1, &un, 3500000, &rc);
    cr_assert_not_null(j1);
    pl_loop_job_run(j1);
    cr_assert_eq(pl_loop_plan_finish(l, j1), 0);
    cr_assert_eq(pl_loop_epochs(l), 2);
    /* A job outliving its loop (shutdown). */
    pl_loop_free(l);
    pl_loop_job_run(j0);
    pl_loop_job_free(NULL, j0);
    models_free(&m);
}
