/* The worker's OpenMP runtime (worker/omp_pool.c), called the way
 * compiled `#pragma omp parallel` code and oneDNN call it: GOMP_parallel
 * and GOMP_barrier, and the omp_* queries. That oneDNN's regions land here
 * is test_backend_cpu's onednn_runs_its_regions_on_the_workers_pool. */
#include <criterion/criterion.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include <wk_omp.h>

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void GOMP_barrier(void);

#define TEAM 4

typedef struct {
    atomic_int seen[TEAM];
    atomic_int bad_team, in_parallel, runs;
} who_t;

static void who(void *arg)
{
    who_t *w = arg;
    int t = omp_get_thread_num();
    if (t >= 0 && t < TEAM)
        atomic_fetch_add(&w->seen[t], 1);
    if (omp_get_num_threads() != TEAM)
        atomic_fetch_add(&w->bad_team, 1);
    atomic_fetch_add(&w->in_parallel, omp_in_parallel());
    atomic_fetch_add(&w->runs, 1);
}

Test(omp_pool, a_region_runs_every_thread_once_under_its_own_number)
{
    unsigned long before = wk_omp_regions();
    who_t w = {0};
    cr_expect_eq(omp_in_parallel(), 0);
    GOMP_parallel(who, &w, TEAM, 0);
    for (int t = 0; t < TEAM; t++)
        cr_expect_eq(atomic_load(&w.seen[t]), 1, "thread %d ran %d times", t,
                     atomic_load(&w.seen[t]));
    cr_expect_eq(atomic_load(&w.bad_team), 0);
    cr_expect_eq(atomic_load(&w.in_parallel), TEAM);
    cr_expect_eq(omp_get_num_threads(), 1, "outside a region the team is the caller");
    cr_expect_eq(omp_get_thread_num(), 0);
    cr_expect_eq(omp_in_parallel(), 0);
    cr_expect_eq(wk_omp_regions(), before + 1);
}

static void count(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, omp_get_num_threads());
}

/* num_threads 0 takes the caller's omp_set_num_threads; a team of one
 * runs on the caller and wakes no one. */
Test(omp_pool, the_team_is_the_callers_thread_count)
{
    omp_set_num_threads(3);
    cr_expect_eq(omp_get_max_threads(), 3);
    atomic_int n = 0;
    GOMP_parallel(count, &n, 0, 0);
    cr_expect_eq(atomic_load(&n), 9, "3 threads saw a team of 3");
    omp_set_num_threads(1);
    unsigned long before = wk_omp_regions();
    atomic_store(&n, 0);
    GOMP_parallel(count, &n, 0, 0);
    cr_expect_eq(atomic_load(&n), 1);
    cr_expect_eq(wk_omp_regions(), before);
}

#define PHASES 2000

typedef struct {
    atomic_int arrived;
    atomic_int wrong;
} phases_t;

static void phases(void *arg)
{
    phases_t *p = arg;
    int n = omp_get_num_threads();
    for (int k = 0; k < PHASES; k++) {
        atomic_fetch_add(&p->arrived, 1);
        GOMP_barrier();
        if (atomic_load(&p->arrived) != n * (k + 1))
            atomic_fetch_add(&p->wrong, 1);
        GOMP_barrier();
    }
}

/* Nobody leaves a barrier before the whole team reached it, phase after
 * phase, spinning (hot) or sleeping (cold). */
Test(omp_pool, barriers_hold_every_thread_until_the_team_arrived)
{
    for (int hot = 0; hot < 2; hot++) {
        wk_omp_hot(hot);
        phases_t p = {0};
        GOMP_parallel(phases, &p, 3, 0);
        cr_expect_eq(atomic_load(&p.wrong), 0, "hot %d: %d threads left a barrier early", hot,
                     atomic_load(&p.wrong));
        cr_expect_eq(atomic_load(&p.arrived), 3 * PHASES);
    }
    wk_omp_hot(false);
}

static void inner(void *arg)
{
    who_t *w = arg;
    if (omp_get_num_threads() != 1 || omp_get_thread_num() != 0 || !omp_in_parallel())
        atomic_fetch_add(&w->bad_team, 1);
    atomic_fetch_add(&w->runs, 1);
}

static void outer(void *arg)
{
    who_t *w = arg;
    int t = omp_get_thread_num();
    GOMP_parallel(inner, w, TEAM, 0);
    /* the region's own numbers are back after the nested one */
    if (omp_get_thread_num() != t || omp_get_num_threads() != 2)
        atomic_fetch_add(&w->bad_team, 1);
}

/* A region inside a region runs on its caller alone (libgomp's default
 * without OMP_NESTED), inside the outer one. */
Test(omp_pool, a_nested_region_runs_on_its_caller_alone)
{
    who_t w = {0};
    GOMP_parallel(outer, &w, 2, 0);
    cr_expect_eq(atomic_load(&w.runs), 2);
    cr_expect_eq(atomic_load(&w.bad_team), 0);
}

#define REGIONS 5000

static void *leader(void *arg)
{
    who_t *w = arg;
    omp_set_num_threads(TEAM);
    wk_omp_hot(true);
    for (int r = 0; r < REGIONS; r++)
        GOMP_parallel(who, w, 0, 0);
    wk_omp_hot(false);
    return NULL;
}

/* Two threads lead regions at once (the worker's loader plans while its
 * executor runs): each has a pool of its own; every region runs whole. */
Test(omp_pool, two_leaders_run_regions_at_once)
{
    who_t w[2] = {0};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, leader, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(atomic_load(&w[i].runs), REGIONS * TEAM);
        cr_expect_eq(atomic_load(&w[i].bad_team), 0);
        for (int t = 0; t < TEAM; t++)
            cr_expect_eq(atomic_load(&w[i].seen[t]), REGIONS, "leader %d thread %d", i, t);
    }
}
