/* The worker's OpenMP runtime (worker/omp_pool.c), called the way
 * compiled `#pragma omp parallel` code and oneDNN call it: GOMP_parallel
 * and GOMP_barrier, and the omp_* queries. That oneDNN's regions land here
 * is test_backend_cpu's onednn_runs_its_regions_on_the_workers_pool. */
#include <criterion/criterion.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

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

/* Runs phases on a team of 3, spinning (hot) and sleeping (cold), the
 * leader alone or not: nobody leaves a barrier early. */
static void barriers_hold(bool alone)
{
    for (int hot = 0; hot < 2; hot++) {
        wk_omp_hot(hot);
        wk_omp_alone(alone);
        phases_t p = {0};
        GOMP_parallel(phases, &p, 3, 0);
        cr_expect_eq(atomic_load(&p.wrong), 0, "hot %d alone %d: %d threads left a barrier early",
                     hot, alone, atomic_load(&p.wrong));
        cr_expect_eq(atomic_load(&p.arrived), 3 * PHASES);
    }
    wk_omp_alone(false);
    wk_omp_hot(false);
}

/* Nobody leaves a barrier before the whole team reached it, phase after
 * phase, spinning (hot) or sleeping (cold). */
Test(omp_pool, barriers_hold_every_thread_until_the_team_arrived)
{
    barriers_hold(false);
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

typedef struct {
    atomic_int seen[TEAM];
    atomic_int elsewhere;
    pthread_t leader;
} where_t;

static void where(void *arg)
{
    where_t *w = arg;
    int t = omp_get_thread_num();
    if (t >= 0 && t < TEAM)
        atomic_fetch_add(&w->seen[t], 1);
    if (!pthread_equal(pthread_self(), w->leader))
        atomic_fetch_add(&w->elsewhere, 1);
}

/* Alone (a neighbour holds the other cores), the leader runs every share
 * of the team itself, each under its own number, and wakes no worker. */
Test(omp_pool, alone_the_leader_runs_every_share_under_its_own_number)
{
    where_t w = {.leader = pthread_self()};
    wk_omp_alone(true);
    for (int r = 0; r < 100; r++)
        GOMP_parallel(where, &w, TEAM, 0);
    wk_omp_alone(false);
    for (int t = 0; t < TEAM; t++)
        cr_expect_eq(atomic_load(&w.seen[t]), 100, "share %d ran %d times", t,
                     atomic_load(&w.seen[t]));
    cr_expect_eq(atomic_load(&w.elsewhere), 0, "%d shares ran on a worker",
                 atomic_load(&w.elsewhere));
    /* and the team is back after it */
    who_t v = {0};
    GOMP_parallel(who, &v, TEAM, 0);
    for (int t = 0; t < TEAM; t++)
        cr_expect_eq(atomic_load(&v.seen[t]), 1);
}

/* A region with barriers cannot run its shares one after the other: alone,
 * the first share to wait at a barrier calls the workers for the others,
 * and every phase still holds everyone until the team arrived. */
Test(omp_pool, alone_a_region_with_barriers_calls_the_workers)
{
    barriers_hold(true);
}

/* A worker held off its core: a signal whose handler waits for release,
 * as a neighbour's process would hold the core the worker sleeps on. */
static atomic_int g_held, g_release;
static pthread_t g_worker;

static void hold_here(int sig)
{
    (void)sig;
    atomic_store(&g_held, 1);
    while (!atomic_load(&g_release))
        ;
}

/* On the leader, a share lasts 100 us: time for a sleeping worker to wake
 * and claim the other (with shares of nothing the leader ran both before
 * it woke, in 3 of 30 runs of this test on a quiet 2-vCPU guest). */
static void find_worker(void *arg)
{
    pthread_t *leader = arg;
    if (!pthread_equal(pthread_self(), *leader)) {
        g_worker = pthread_self();
        return;
    }
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 100000L);
}

/* A share whose thread does not come is run by the thread that finished
 * its own: the region ends while its worker is still held. */
Test(omp_pool, a_share_whose_thread_does_not_come_is_run_by_the_leader)
{
    omp_set_num_threads(2);
    wk_omp_alone(false);
    /* the worker's thread: a region whose share 1 it took (the leader
     * takes it when the worker is not up yet) */
    pthread_t me = pthread_self();
    g_worker = me;
    for (int r = 0; r < 10000 && pthread_equal(g_worker, me); r++)
        GOMP_parallel(find_worker, &me, 2, 0);
    cr_assert(!pthread_equal(g_worker, me), "no share ran on a worker");
    struct sigaction sa = {.sa_handler = hold_here};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    cr_assert_eq(pthread_kill(g_worker, SIGUSR1), 0);
    while (!atomic_load(&g_held))
        ;
    where_t w = {.leader = pthread_self()};
    for (int r = 0; r < 10; r++)
        GOMP_parallel(where, &w, 2, 0);
    atomic_store(&g_release, 1);
    cr_expect_eq(atomic_load(&w.seen[0]), 10);
    cr_expect_eq(atomic_load(&w.seen[1]), 10, "share 1 ran %d of 10 times",
                 atomic_load(&w.seen[1]));
    cr_expect_eq(atomic_load(&w.elsewhere), 0);
    /* the worker, released, takes its shares again */
    who_t v = {0};
    for (int r = 0; r < 200; r++)
        GOMP_parallel(who, &v, 2, 0);
    cr_expect_eq(atomic_load(&v.runs), 400);
}
