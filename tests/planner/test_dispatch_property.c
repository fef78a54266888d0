/* Properties of every policy on random workloads, on the rig of
 * dispatch_test.h: no batch misses its earliest deadline, and goodput. */
#include "dispatch_test.h"

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    /* splitmix64: deterministic everywhere */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static double rng_unit(void)
{
    return (double)(rng_next() >> 11) / 9007199254740992.0;
}

/* Both policies, seeded random load (bursty, two sessions sharing workers,
 * with a margin on a table profile): every batch finishes by its earliest
 * deadline under the profile, no worker runs two batches, every request
 * gets exactly one outcome. With links: about half the workers sit behind a
 * random link (round trip up to 3 ms, 20 to 2000 bytes/µs; 1 to 50 kB per
 * item) that the rig's devices pay on top of the latency, and one link
 * changes halfway: the same holds with the transfer counted. */
static void property_run(pl_policy_t policy, uint64_t seed, int links, int prio)
{
    rng_state = seed;
    rig_t *r = malloc(sizeof(*r));
    memset(r, 0, sizeof(*r));
    pl_dispatch_opts_t o = {.policy = policy, .k_std = 2, .net_delay_us = 300};
    r->d = pl_dispatch_new(&o);
    r->timer_us = PL_NEVER;
    int nworkers = 2 + (int)(rng_next() % 4);
    add_workers(r, nworkers);
    pl_profile_t lin;
    pl_profile_init_linear(&lin, 500 + rng_next() % 2000, 2000 + rng_next() % 6000, 32);
    pl_profile_row_t rows[] = {{1, 4000, 300}, {2, 5000, 300}, {4, 7000, 500}, {8, 11000, 800}};
    pl_profile_t tab;
    cr_assert_eq(pl_profile_init_table(&tab, rows, 4), 0);
    int64_t slo[2] = {20000 + (int64_t)(rng_next() % 40000), 25000 + (int64_t)(rng_next() % 40000)};
    if (links)
        for (int k = 0; k < 2; k++)
            r->item_bytes[k] = 1000 + (int64_t)(rng_next() % 50000);
    pl_session_cfg_t c0 = {.profile = &lin, .slo_us = slo[0], .item_bytes = r->item_bytes[0]};
    pl_session_cfg_t c1 = {.profile = &tab, .slo_us = slo[1], .item_bytes = r->item_bytes[1]};
    /* prio: the sessions at two priorities, either way round (the workers
     * they share mix them). */
    c0.priority = prio ? (int)(seed % 2) * 2 + 1 : 0;
    c1.priority = prio ? 4 - c0.priority : 0;
    int s0 = pl_dispatch_session_add(r->d, &c0), s1 = pl_dispatch_session_add(r->d, &c1);
    cr_assert(s0 >= 0 && s1 >= 0);
    if (links) {
        for (int w = 0; w < nworkers; w++)
            if (rng_next() % 2)
                rig_link(r, 0, w, (int64_t)(rng_next() % 3000), 20 + (double)(rng_next() % 1980));
        absorb(r);
    }
    pl_route_t routes[MAXW];
    for (int w = 0; w < nworkers; w++)
        routes[w] = (pl_route_t){.worker = w, .target_batch = 0};
    cr_assert_eq(pl_dispatch_route_set(r->d, 0, s0, routes, nworkers), 0);
    cr_assert_eq(pl_dispatch_route_set(r->d, 0, s1, routes + nworkers / 2, nworkers - nworkers / 2),
                 0);
    absorb(r);
    int narr = 3000;
    arrival_t *arr = malloc(sizeof(*arr) * (size_t)narr);
    int64_t *deadline = malloc(sizeof(int64_t) * (size_t)(narr + 1));
    double t = 0;
    for (int i = 0; i < narr; i++) {
        /* Phases of light and heavy load, exponential gaps. */
        double mean_gap = ((i / 500) % 2) ? 150 : 1500;
        t += -mean_gap * log(1 - rng_unit());
        int s = (int)(rng_next() % 2);
        arr[i] = (arrival_t){.at_us = (int64_t)t, .session = s, .deadline_us = (int64_t)t + slo[s]};
        deadline[i + 1] = arr[i].deadline_us;
    }
    if (links) {
        /* Half the arrivals, then worker 0's link changes (or appears). */
        int64_t now = arr[narr / 2 - 1].at_us;
        rig_run_from(r, arr, 0, narr / 2, nworkers, now);
        rig_link(r, now, 0, 500 + (int64_t)(rng_next() % 2000), 50 + (double)(rng_next() % 500));
        absorb(r);
        rig_run_from(r, arr, narr / 2, narr, nworkers, PL_NEVER);
    } else {
        rig_run(r, arr, narr, nworkers);
    }
    cr_assert_eq(r->overlap, 0);
    char *seen = calloc((size_t)narr + 1, 1);
    for (int k = 0; k < r->nsent; k++) {
        sent_t *b = &r->sent[k];
        int64_t cost = pl_dispatch_worker_batch_cost_us(r->d, b->session, b->worker, b->count);
        if (!links || b->worker != 0)
            cr_assert_eq(b->finish_us, b->at_us + cost);
        cr_assert_leq(r->true_finish[k], b->finish_us);
        for (int j = 0; j < b->count; j++) {
            uint64_t id = b->ids[j];
            cr_assert_leq(b->finish_us, deadline[id], "seed %llu batch %d misses request %llu",
                          (unsigned long long)seed, k, (unsigned long long)id);
            cr_assert_leq(r->true_finish[k], deadline[id],
                          "seed %llu batch %d (worker %d) late for request %llu",
                          (unsigned long long)seed, k, b->worker, (unsigned long long)id);
            cr_assert_eq(seen[id], 0);
            seen[id] = 1;
        }
    }
    for (int k = 0; k < r->ndropped; k++) {
        cr_assert_eq(seen[r->dropped[k].id], 0);
        seen[r->dropped[k].id] = 1;
    }
    for (int i = 1; i <= narr; i++)
        cr_assert_eq(seen[i], 1, "request %d has no outcome", i);
    cr_assert_gt(r->nsent, 0);
    free(seen);
    free(arr);
    free(deadline);
    pl_profile_dispose(&lin);
    pl_profile_dispose(&tab);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, no_batch_ever_misses_its_earliest_deadline_deferred)
{
    for (uint64_t seed = 1; seed <= 12; seed++)
        property_run(PL_POLICY_DEFERRED, seed, 0, 0);
}

Test(dispatch, no_batch_ever_misses_its_earliest_deadline_adaptive)
{
    for (uint64_t seed = 1; seed <= 12; seed++)
        property_run(PL_POLICY_ADAPTIVE, seed, 0, 0);
    for (uint64_t seed = 1; seed <= 12; seed++)
        property_run(PL_POLICY_ADAPTIVE, seed, 1, 0);
}

Test(dispatch, no_batch_ever_misses_its_earliest_deadline_early_drop)
{
    for (uint64_t seed = 1; seed <= 12; seed++)
        property_run(PL_POLICY_EARLY_DROP, seed, 0, 0);
}

Test(dispatch, no_batch_ever_misses_its_earliest_deadline_with_links_deferred)
{
    for (uint64_t seed = 1; seed <= 24; seed++)
        property_run(PL_POLICY_DEFERRED, seed, 1, 0);
}

Test(dispatch, no_batch_ever_misses_its_earliest_deadline_with_priorities)
{
    for (uint64_t seed = 1; seed <= 12; seed++) {
        property_run(PL_POLICY_DEFERRED, seed, 0, 1);
        property_run(PL_POLICY_ADAPTIVE, seed, 0, 1);
        property_run(PL_POLICY_DEFERRED, seed, 1, 1);
        property_run(PL_POLICY_EARLY_DROP, seed, 0, 1);
    }
}

Test(dispatch, no_batch_ever_misses_its_earliest_deadline_with_links_early_drop)
{
    for (uint64_t seed = 1; seed <= 24; seed++)
        property_run(PL_POLICY_EARLY_DROP, seed, 1, 0);
}

/* Goodput at a load the workers can serve: the properties above hold for a
 * core that drops almost everything, this does not. One session, linear
 * l(b) = alpha b + beta, SLO L, n workers, every worker routed. A request
 * can wait for the batch running on its worker and then run in its own
 * (plus the network delay each way), so a batch size b keeps every deadline
 * when 2 l(b) + 2 net <= L; the n workers then serve n b / l(b) requests/s
 * (b the largest such size). Poisson arrivals at half of that: more than
 * twice the mean in one SLO window (about 20 requests where 40 would
 * overflow) has a probability near 1e-4, so at least 99% of the requests
 * must be served by their deadline, under either policy. */
static void goodput_run(pl_policy_t policy, uint64_t seed, int nworkers, double alpha_us,
                        double beta_us, int64_t slo_us)
{
    const int64_t net_us = 300;
    rng_state = seed;
    rig_t *r = malloc(sizeof(*r));
    memset(r, 0, sizeof(*r));
    pl_dispatch_opts_t o = {.policy = policy, .k_std = 2, .net_delay_us = net_us};
    r->d = pl_dispatch_new(&o);
    r->timer_us = PL_NEVER;
    add_workers(r, nworkers);
    int sid = add_linear_session(r->d, alpha_us, beta_us, 32, slo_us);
    cr_assert_geq(sid, 0);
    route_all(r, sid, nworkers, 0);
    int best_b = 0;
    for (int b = 1; b <= 32; b++)
        if (2 * (alpha_us * b + beta_us) + 2 * (double)net_us <= (double)slo_us)
            best_b = b;
    cr_assert_gt(best_b, 0, "the SLO admits a batch of one");
    double capacity_rps = nworkers * best_b / ((alpha_us * best_b + beta_us) / 1e6);
    double rate_rps = capacity_rps / 2;
    int narr = 3000;
    arrival_t *arr = malloc(sizeof(*arr) * (size_t)narr);
    int64_t *deadline = malloc(sizeof(int64_t) * (size_t)(narr + 1));
    double t = 0;
    for (int i = 0; i < narr; i++) {
        t += -(1e6 / rate_rps) * log(1 - rng_unit());
        arr[i] =
            (arrival_t){.at_us = (int64_t)t, .session = sid, .deadline_us = (int64_t)t + slo_us};
        deadline[i + 1] = arr[i].deadline_us;
    }
    rig_run(r, arr, narr, nworkers);
    cr_assert_eq(r->overlap, 0);
    int good = 0;
    for (int k = 0; k < r->nsent; k++) {
        const sent_t *b = &r->sent[k];
        for (int j = 0; j < b->count; j++)
            good += b->finish_us <= deadline[b->ids[j]];
    }
    cr_assert_eq(good + r->ndropped >= narr, 1, "every request has an outcome");
    cr_assert_geq(good, narr * 99 / 100,
                  "policy %d seed %llu: %d of %d served in time at %.0f of %.0f req/s "
                  "(%d dropped)",
                  (int)policy, (unsigned long long)seed, good, narr, rate_rps, capacity_rps,
                  r->ndropped);
    free(arr);
    free(deadline);
    pl_dispatch_free(r->d);
    free(r);
}

Test(dispatch, half_the_capacity_is_served_in_time_deferred)
{
    for (uint64_t seed = 1; seed <= 6; seed++) {
        goodput_run(PL_POLICY_DEFERRED, seed, 2, 1000, 5000, 50000);
        goodput_run(PL_POLICY_DEFERRED, seed, 4, 500, 8000, 30000);
    }
}

Test(dispatch, half_the_capacity_is_served_in_time_adaptive)
{
    for (uint64_t seed = 1; seed <= 6; seed++) {
        goodput_run(PL_POLICY_ADAPTIVE, seed, 2, 1000, 5000, 50000);
        goodput_run(PL_POLICY_ADAPTIVE, seed, 4, 500, 8000, 30000);
    }
}

Test(dispatch, half_the_capacity_is_served_in_time_early_drop)
{
    for (uint64_t seed = 1; seed <= 6; seed++) {
        goodput_run(PL_POLICY_EARLY_DROP, seed, 2, 1000, 5000, 50000);
        goodput_run(PL_POLICY_EARLY_DROP, seed, 4, 500, 8000, 30000);
    }
}
