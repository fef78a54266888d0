/* The dispatcher core's routes index (planner/dispatch_core.c,
 * dispatch_int.h): d->busy_bits, each session's route_bits and busy_heap.
 * Random calls through the public API, on more than 64 workers (several
 * words) and every policy; after each, the index agrees with the workers
 * and routes (pl__index_ok) and its answers with a scan of the routes, the
 * way the core found them before the index. */
#include <criterion/criterion.h>
#include <dispatch_int.h>
#include <pl_dispatch.h>
#include <sq.h>

#include <stdlib.h>
#include <string.h>

#define NW 150 /* worker ids 0..NW-1: three words */
#define NS 3

typedef struct {
    pl_dispatch_t *d;
    int present[NW];
    int busy[NW];
    uint64_t batch[NW];
    int64_t done_at[NW];
    uint64_t foreign_next[NW]; /* foreign work after the batch: its id, length */
    int64_t foreign_us[NW];
    uint64_t next_id;
    uint32_t rng;
} fuzz_t;

static uint32_t rnd(fuzz_t *f, uint32_t n)
{
    f->rng = f->rng * 1664525u + 1013904223u;
    return (f->rng >> 8) % n;
}

static void absorb(fuzz_t *f)
{
    const pl_action_t *a;
    size_t n = pl_dispatch_take(f->d, &a);
    for (size_t i = 0; i < n; i++) {
        if (a[i].kind != PL_ACT_SEND)
            continue;
        cr_assert(!f->busy[a[i].worker], "a busy worker got a batch");
        f->busy[a[i].worker] = 1;
        f->batch[a[i].worker] = a[i].batch_id;
        f->done_at[a[i].worker] = a[i].finish_us;
    }
}

/* The index against the routes, scanned as the core did before it. */
static void check(const pl_dispatch_t *d, int64_t now)
{
    cr_assert(pl__index_ok(d), "the routes index disagrees with the workers and routes");
    for (int sid = 0; sid < d->nsessions; sid++) {
        const session_t *s = &d->sessions[sid];
        int first = -1;
        int64_t least = PL_NEVER;
        for (int i = 0; i < s->nroutes; i++) {
            const worker_t *w = &d->workers[s->routes[i].worker];
            if (!w->busy && first < 0)
                first = s->routes[i].worker;
            if (w->busy && w->busy_until < least)
                least = w->busy_until;
        }
        cr_assert_eq(pl__free_route_from(d, s, 0), first);
        if (d->any_net)
            continue; /* the heaps are not kept, earliest_finish1 is by link */
        cr_assert_eq(pl__busy_min_except(d, s, -1), least);
        for (int i = 0; i < s->nroutes; i++) {
            int except = s->routes[i].worker, next = -1;
            int64_t least_except = PL_NEVER;
            for (int j = 0; j < s->nroutes; j++) {
                int wid = s->routes[j].worker;
                const worker_t *w = &d->workers[wid];
                if (!w->busy && next < 0 && wid > except)
                    next = wid;
                if (wid != except && w->busy && w->busy_until < least_except)
                    least_except = w->busy_until;
            }
            cr_assert_eq(pl__free_route_from(d, s, except + 1), next);
            cr_assert_eq(pl__busy_min_except(d, s, except), least_except);
        }
        int fw;
        int64_t f1 = earliest_finish1(d, s, now, &fw);
        cr_assert_eq(fw, first);
        if (first >= 0)
            cr_assert_eq(f1, now + s->cost[1]);
        else if (least == PL_NEVER)
            cr_assert_eq(f1, PL_NEVER);
        else
            cr_assert_eq(f1, (least > now ? least : now) + s->cost[1]);
    }
}

static void route_random(fuzz_t *f, int64_t now, int sid)
{
    pl_route_t routes[NW];
    int n = 0;
    int every = 1 + (int)rnd(f, 12); /* a twelfth (no heap) to all of them (a heap) */
    for (int w = 0; w < NW; w++)
        if (f->present[w] && rnd(f, (uint32_t)every) == 0)
            routes[n++] = (pl_route_t){.worker = w, .target_batch = 0};
    cr_assert_eq(pl_dispatch_route_set(f->d, now, sid, routes, n), 0);
}

/* With `links`, worker 1 is behind a link from the start. */
static void fuzz(pl_policy_t policy, uint32_t seed, int links)
{
    fuzz_t f;
    memset(&f, 0, sizeof(f));
    f.rng = seed;
    pl_dispatch_opts_t o = {.policy = policy};
    f.d = pl_dispatch_new(&o);
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 16);
    for (int s = 0; s < NS; s++) {
        pl_session_cfg_t cfg = {.profile = &p, .slo_us = 25000 + 10000 * s};
        cr_assert_eq(pl_dispatch_session_add(f.d, &cfg), s);
    }
    pl_profile_dispose(&p);
    int64_t now = 0;
    for (int w = 0; w < NW; w += 1 + (int)rnd(&f, 2)) {
        cr_assert_eq(pl_dispatch_worker_add(f.d, now, w, 0), 0);
        f.present[w] = 1;
    }
    if (links) {
        cr_assert_eq(pl_dispatch_worker_add(f.d, now, 1, 0), 0);
        f.present[1] = 1;
        cr_assert_eq(pl_dispatch_worker_net(f.d, now, 1, 200, 1250), 0);
    }
    for (int s = 0; s < NS; s++)
        route_random(&f, now, s);
    absorb(&f);
    check(f.d, now);
    for (int step = 0; step < 4000; step++) {
        now += rnd(&f, 300);
        /* Batches end on time. */
        for (int w = 0; w < NW; w++) {
            if (f.busy[w] && f.done_at[w] <= now) {
                f.busy[w] = 0;
                cr_assert_eq(pl_dispatch_batch_done(f.d, now, w, f.batch[w]), 0);
                if (f.foreign_next[w] != 0) {
                    f.busy[w] = 1;
                    f.batch[w] = f.foreign_next[w];
                    f.done_at[w] = now + f.foreign_us[w];
                    f.foreign_next[w] = 0;
                }
                absorb(&f);
            }
        }
        uint32_t op = rnd(&f, 100);
        int w = (int)rnd(&f, NW), sid = (int)rnd(&f, NS);
        if (op < 70) {
            cr_assert_eq(
                pl_dispatch_request(f.d, now, ++f.next_id, sid, now, now + 25000 + 10000 * sid), 0);
        } else if (op < 80) {
            pl_dispatch_timer(f.d, now);
        } else if (op < 84) {
            route_random(&f, now, sid);
        } else if (op < 88 && f.present[w]) {
            int64_t len = 1 + rnd(&f, 5000);
            uint64_t id = pl_dispatch_worker_foreign(f.d, now, w, len, 1);
            if (id != 0 && !f.busy[w]) {
                f.busy[w] = 1;
                f.batch[w] = id;
                f.done_at[w] = now + len;
            } else if (id != 0) {
                f.foreign_next[w] = id; /* runs once the batch in flight is done */
                f.foreign_us[w] = len;
            }
        } else if (op < 91 && f.present[w]) {
            cr_assert_eq(pl_dispatch_worker_lost(f.d, now, w), 0);
            f.present[w] = 0;
            f.busy[w] = 0;
            f.foreign_next[w] = 0;
        } else if (op < 94 && f.present[w]) {
            cr_assert_eq(pl_dispatch_worker_remove(f.d, now, w), 0);
            f.present[w] = 0;                  /* a busy one drains: its batch_done still comes */
        } else if (op < 98 && !f.present[w]) { /* a draining one comes back */
            cr_assert_eq(pl_dispatch_worker_add(f.d, now, w, 0), 0);
            f.present[w] = 1;
        }
        absorb(&f);
        check(f.d, now);
    }
    pl_dispatch_free(f.d);
}

Test(dispatch_core, routes_index_deferred)
{
    fuzz(PL_POLICY_DEFERRED, 1, 0);
    fuzz(PL_POLICY_DEFERRED, 2, 0);
}

Test(dispatch_core, routes_index_adaptive)
{
    fuzz(PL_POLICY_ADAPTIVE, 3, 0);
}

Test(dispatch_core, routes_index_early_drop)
{
    fuzz(PL_POLICY_EARLY_DROP, 4, 0);
}

Test(dispatch_core, routes_index_with_links)
{
    /* Only the bits are kept: matchmaking goes by link. */
    fuzz(PL_POLICY_DEFERRED, 5, 1);
    fuzz(PL_POLICY_EARLY_DROP, 6, 1);
}

Test(dispatch_core, routes_index_words)
{
    /* Routes that end in a higher word than others, a session without
     * routes, and a worker id past the last route's word. */
    pl_dispatch_opts_t o = {.policy = PL_POLICY_DEFERRED};
    pl_dispatch_t *d = pl_dispatch_new(&o);
    pl_profile_t p;
    pl_profile_init_linear(&p, 1000, 5000, 8);
    pl_session_cfg_t cfg = {.profile = &p, .slo_us = 50000};
    int a = pl_dispatch_session_add(d, &cfg), b = pl_dispatch_session_add(d, &cfg);
    pl_profile_dispose(&p);
    for (int w = 0; w < 200; w++)
        cr_assert_eq(pl_dispatch_worker_add(d, 0, w, 0), 0);
    pl_route_t ra[] = {{.worker = 63}, {.worker = 64}, {.worker = 130}};
    cr_assert_eq(pl_dispatch_route_set(d, 0, a, ra, 3), 0);
    cr_assert(pl__index_ok(d));
    const session_t *s = &d->sessions[a];
    cr_assert_eq(pl__free_route_from(d, s, 0), 63);
    cr_assert_eq(pl__free_route_from(d, s, 64), 64);
    cr_assert_eq(pl__free_route_from(d, s, 65), 130);
    cr_assert_eq(pl__free_route_from(d, s, 131), -1);
    cr_assert_eq(pl__free_route_from(d, s, 199), -1);
    cr_assert_eq(pl__free_route_from(d, &d->sessions[b], 0), -1);
    cr_assert_eq(pl__busy_min_except(d, &d->sessions[b], -1), PL_NEVER);
    /* Three requests that must go at once (l(1) = 6 ms): each worker takes one. */
    pl_request_t r[3] = {{.id = 1, .deadline_us = 6000},
                         {.id = 2, .arrival_us = 10, .deadline_us = 6010},
                         {.id = 3, .arrival_us = 20, .deadline_us = 6020}};
    cr_assert_eq(pl_dispatch_requests(d, 0, a, r, 1), 0);
    cr_assert(pl__index_ok(d));
    cr_assert_eq(pl__free_route_from(d, s, 0), 64, "63 took the first");
    cr_assert_eq(pl__busy_min_except(d, s, -1), 6000);
    cr_assert_eq(pl__busy_min_except(d, s, 63), PL_NEVER);
    cr_assert_eq(pl_dispatch_requests(d, 10, a, r + 1, 1), 0);
    cr_assert_eq(pl_dispatch_requests(d, 20, a, r + 2, 1), 0);
    cr_assert(pl__index_ok(d));
    cr_assert_eq(pl__free_route_from(d, s, 0), -1);
    cr_assert_eq(pl__busy_min_except(d, s, -1), 6000);
    cr_assert_eq(pl__busy_min_except(d, s, 63), 6010);
    cr_assert_eq(pl__busy_min_except(d, s, 130), 6000);
    pl_dispatch_free(d);
}
