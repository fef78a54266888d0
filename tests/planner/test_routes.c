/* planner/routes.c: the rule both the gateway and the simulator use to turn
 * a placement plan into a session's routes. */
#include <criterion/criterion.h>
#include <pl_dispatch.h>

#include <string.h>

/* Plan device i runs on worker 10 + i (two_workers), usable unless it is
 * "not ready" (ctx). */
static const int two_workers[] = {10, 11};

static int ready(void *ctx, int worker, int64_t model)
{
    const int *not_ready = ctx;
    (void)model;
    return !not_ready[worker - 10];
}

static pl_plan_t two_devices(pl_device_t *dev, pl_alloc_t *a)
{
    /* Session 7 on both devices (batches 4 and 6), session 8 on the second. */
    a[0] = (pl_alloc_t){.session_id = 7, .batch = 4};
    a[1] = (pl_alloc_t){.session_id = 7, .batch = 6};
    a[2] = (pl_alloc_t){.session_id = 8, .batch = 2};
    dev[0] = (pl_device_t){.id = 0, .nallocs = 1, .allocs = &a[0]};
    dev[1] = (pl_device_t){.id = 1, .nallocs = 2, .allocs = &a[1]};
    return (pl_plan_t){.ndevices = 2, .devices = dev};
}

Test(routes, planned_devices_with_their_batches)
{
    pl_device_t dev[2];
    pl_alloc_t a[3];
    pl_plan_t plan = two_devices(dev, a);
    int not_ready[2] = {0, 0}, fallback[] = {99}, fell = -1;
    pl_route_rules_t r = {.workers = two_workers,
                          .nworkers = 2,
                          .usable = ready,
                          .ctx = not_ready,
                          .targets = 1,
                          .fallback = fallback,
                          .nfallback = 1,
                          .used_fallback = &fell};
    pl_route_t routes[4];
    cr_assert_eq(pl_plan_routes(&plan, 7, &r, routes, 4), 2);
    cr_assert_eq(fell, 0);
    cr_assert(routes[0].worker == 10 && routes[0].target_batch == 4);
    cr_assert(routes[1].worker == 11 && routes[1].target_batch == 6);
    cr_assert_eq(pl_plan_routes(&plan, 8, &r, routes, 4), 1);
    cr_assert(routes[0].worker == 11 && routes[0].target_batch == 2);
    /* A plan that saw no traffic leaves the batch to the dispatcher. */
    r.targets = 0;
    cr_assert_eq(pl_plan_routes(&plan, 7, &r, routes, 4), 2);
    cr_assert_eq(routes[1].target_batch, 0);
    /* max bounds what is written. */
    cr_assert_eq(pl_plan_routes(&plan, 7, &r, routes, 1), 1);
}

Test(routes, the_fallback_serves_when_no_planned_device_can)
{
    pl_device_t dev[2];
    pl_alloc_t a[3];
    pl_plan_t plan = two_devices(dev, a);
    int not_ready[2] = {0, 1}, fallback[] = {3, 5}, fell = -1;
    pl_route_rules_t r = {.workers = two_workers,
                          .nworkers = 2,
                          .usable = ready,
                          .ctx = not_ready,
                          .targets = 1,
                          .fallback = fallback,
                          .nfallback = 2,
                          .used_fallback = &fell};
    pl_route_t routes[4];
    /* Session 8's only device still loads its model: every holder serves. */
    cr_assert_eq(pl_plan_routes(&plan, 8, &r, routes, 4), 2);
    cr_assert_eq(fell, 1);
    cr_assert(routes[0].worker == 3 && routes[0].target_batch == 0 && routes[1].worker == 5);
    /* Session 7 keeps its ready device only. */
    cr_assert_eq(pl_plan_routes(&plan, 7, &r, routes, 4), 1);
    cr_assert_eq(routes[0].worker, 10);
    /* Unplaced, or no plan at all. */
    cr_assert_eq(pl_plan_routes(&plan, 9, &r, routes, 4), 2);
    cr_assert_eq(pl_plan_routes(NULL, 7, &r, routes, 4), 2);
    cr_assert_eq(fell, 1);
    r.nfallback = 0;
    cr_assert_eq(pl_plan_routes(NULL, 7, &r, routes, 4), 0);
}

/* Spare devices of plan->overflow are found by their id too (here the
 * planned devices 0 and 1 on workers 10 and 11, the spares 2 and 3 on 22
 * and 23); their routes come after the planned ones, with the dispatcher's
 * own batch, once each. */
static const int spare_workers[] = {10, 11, 22, 23};

Test(routes, spare_devices_take_overflow_after_the_planned_ones)
{
    pl_device_t dev[2];
    pl_alloc_t a[3];
    pl_plan_t plan = two_devices(dev, a);
    pl_overflow_t ov[] = {{.device_id = 2, .session_id = 7},
                          {.device_id = 2, .session_id = 8},
                          {.device_id = 3, .session_id = 7},
                          {.device_id = 3, .session_id = 7},
                          {.device_id = 2, .session_id = 9}};
    plan.overflow = ov;
    plan.noverflow = 5;
    pl_route_rules_t r = {.workers = spare_workers, .nworkers = 4, .targets = 1};
    pl_route_t routes[8];
    cr_assert_eq(pl_plan_routes(&plan, 7, &r, routes, 8), 4);
    cr_assert(routes[0].worker == 10 && routes[0].target_batch == 4);
    cr_assert(routes[1].worker == 11 && routes[1].target_batch == 6);
    cr_assert(routes[2].worker == 22 && routes[2].target_batch == 0);
    cr_assert(routes[3].worker == 23 && routes[3].target_batch == 0);
    /* Planned elsewhere: the spares only take its overflow (the dispatcher
     * keeps such batches short where other sessions are planned). */
    cr_assert(!routes[0].overflow && !routes[1].overflow);
    cr_assert(routes[2].overflow && routes[3].overflow);
    cr_assert_eq(pl_plan_routes(&plan, 8, &r, routes, 8), 2);
    cr_assert_eq(routes[1].worker, 22);
    cr_assert_eq(pl_plan_routes(&plan, 7, &r, routes, 3), 3, "max bounds what is written");
    /* Placed nowhere (unplaced): the spare is all it has, not its overflow. */
    cr_assert_eq(pl_plan_routes(&plan, 9, &r, routes, 8), 1);
    cr_assert(routes[0].worker == 22 && !routes[0].overflow);
}

/* A plan read by session (pl_plan_index_t) lists what a scan of the plan
 * finds, in plan order, and routes by it exactly as without it. */
Test(routes, the_plan_index_lists_what_a_scan_finds)
{
    enum { ND = 9, NS = 40 };
    pl_device_t dev[ND];
    pl_alloc_t a[ND][6];
    pl_overflow_t ov[64];
    pl_unplaced_t un[3] = {{.session_id = 103, .rate_rps = 5},
                           {.session_id = 139, .rate_rps = 2},
                           {.session_id = 103, .rate_rps = 1}};
    unsigned x = 12345;
    for (int i = 0; i < ND; i++) {
        int n = 1 + i % 6;
        for (int k = 0; k < n; k++) {
            x = x * 1103515245u + 12345u;
            a[i][k] = (pl_alloc_t){
                .session_id = 100 + (int)(x >> 16) % NS, .batch = 1 + k, .rate_rps = 1.5 * k};
        }
        dev[i] =
            (pl_device_t){.id = i, .duty_cycle_us = 1000 * (i + 1), .nallocs = n, .allocs = a[i]};
    }
    for (int o = 0; o < 64; o++) {
        x = x * 1103515245u + 12345u;
        ov[o] = (pl_overflow_t){.device_id = ND + o % 5, .session_id = 100 + (int)(x >> 16) % NS};
    }
    pl_plan_t plan = {.ndevices = ND,
                      .devices = dev,
                      .noverflow = 64,
                      .overflow = ov,
                      .nunplaced = 3,
                      .unplaced = un};
    /* Planned devices on workers 10 + id, the spares on 20 + id. */
    int workers[ND + 5];
    for (int id = 0; id < ND + 5; id++)
        workers[id] = id < ND ? 10 + id : 20 + id;
    pl_plan_index_t ix;
    pl_plan_index_build(&ix, &plan);
    cr_assert_null(pl_plan_index_get(&ix, 99));
    cr_assert_null(pl_plan_index_get(&ix, 100 + NS));
    for (int sid = 100; sid < 100 + NS; sid++) {
        const pl_plan_entry_t *e = pl_plan_index_get(&ix, sid);
        double packed = 0, unplaced = 0;
        int na = 0, no = 0;
        for (int i = 0; i < ND; i++)
            for (int k = 0; k < dev[i].nallocs; k++)
                if (dev[i].allocs[k].session_id == sid) {
                    cr_assert_not_null(e);
                    cr_assert_eq(ix.alloc_device[e->first_alloc + na], i, "plan order");
                    cr_assert_eq(ix.alloc_ix[e->first_alloc + na], k);
                    packed += dev[i].allocs[k].rate_rps;
                    na++;
                }
        for (int o = 0; o < 64; o++)
            if (ov[o].session_id == sid) {
                cr_assert_not_null(e);
                cr_assert_eq(ix.over[e->first_over + no], o, "plan order");
                no++;
            }
        for (int u = 0; u < 3; u++)
            unplaced += un[u].session_id == sid ? un[u].rate_rps : 0;
        if (e == NULL)
            continue;
        cr_assert_eq(e->nallocs, na, "session %d", sid);
        cr_assert_eq(e->nover, no, "session %d", sid);
        cr_assert_float_eq(e->packed_rps, packed, 1e-9);
        cr_assert_float_eq(e->unplaced_rps, unplaced, 1e-9);
        cr_assert_float_eq(e->capacity_rps, pl_plan_capacity_rps(&plan, sid), 1e-9);
        pl_route_rules_t r = {.workers = workers, .nworkers = ND + 5, .targets = 1};
        pl_route_t scan[32], fast[32];
        int n1 = pl_plan_routes(&plan, sid, &r, scan, 32);
        r.index = &ix;
        int n2 = pl_plan_routes(&plan, sid, &r, fast, 32);
        cr_assert_eq(n1, n2, "session %d", sid);
        cr_assert_arr_eq(scan, fast, sizeof(pl_route_t) * (size_t)n1, "session %d", sid);
    }
    pl_plan_index_dispose(&ix);
}
