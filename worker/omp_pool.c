/* The cpu worker's OpenMP runtime: the six entry points oneDNN calls
 * (GOMP_parallel, GOMP_barrier, omp_get_max_threads, omp_get_num_threads,
 * omp_get_thread_num, omp_in_parallel) and omp_set_num_threads, over one
 * fork-join pool per leading thread.
 *
 * Why not libgomp's: libgomp decides at start-up, for the whole process,
 * how long a thread spins for the next parallel region before it sleeps
 * (GOMP_SPINCOUNT, OMP_WAIT_POLICY). A small graph at batch 1 is ~85
 * regions a few tens of microseconds apart; sleeping between them (passive,
 * what squishd set so that idle workers leave the cores to their
 * neighbours) cost mobilenet_v3_large 5.5 ms a run against 4.3 with a short
 * spin, and spinning between batches took the cores from squishd's decode
 * threads (bench/RESULTS.md, "wait policy"). This pool spins only while its
 * leading thread says so (wk_omp_hot: the cpu backend does for the runs
 * of a graph where spinning measured faster, see backend_cpu.c), for at most
 * SQUISH_CPU_SPIN_US between regions, and otherwise sleeps on a futex at
 * once. Debian's oneDNN is built for OpenMP only; its threadpool runtime
 * would mean building oneDNN here.
 *
 * How it takes libgomp's place: these definitions are in the executable
 * (libsqworker.a, exported by worker/meson.build), and the dynamic linker
 * binds libdnnl's references to them before libgomp's (an executable's
 * symbols come first, and an unversioned definition satisfies a versioned
 * reference). libgomp is still loaded, as libdnnl's dependency, and never
 * called. The tests worker/omp_symbols (libdnnl calls nothing else of
 * libgomp) and backend_cpu's onednn_runs_its_regions_on_the_workers_pool
 * check that it holds.
 *
 * The pool: the workers wait for the generation counter `gen` to move;
 * the leader publishes the region (function, data, then the `claim` word:
 * the region's serial number, its team and the next thread number not
 * taken), bumps gen unless it runs alone, runs shares itself until none
 * is left, and waits until every share returned (`done` reaches the
 * team). Any thread takes thread numbers one at a time, so a share whose
 * thread is not scheduled (a neighbour holds its core) is run by one that
 * finished its own, and no thread waits for a worker that has nothing to
 * do. A late worker cannot take a number of a region that ended: the
 * serial number is part of the word it swaps. A nested region runs on the
 * calling thread alone, as libgomp does without OMP_NESTED. */
#include "wk_omp.h"

#include <sq_clock.h>

#include <limits.h>
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_THREADS 256
#define DEFAULT_SPIN_US 50

typedef struct pool {
    /* The region, written by the leader before `claim` names it. */
    void (*fn)(void *);
    void *data;
    /* The region's thread numbers, taken one at a time: the region's
     * serial number (high 32 bits), its team (16) and the next number not
     * yet taken (low 16). A thread takes one by compare-and-swap of the
     * whole word, so that it never takes a number of a region that ended. */
    _Atomic uint64_t claim;
    atomic_int done; /* thread numbers of this region that returned */
    atomic_uint gen; /* moves when the workers are called to a region */
    atomic_int gen_sleepers;
    atomic_uint joined; /* moves when `done` reaches the team */
    atomic_int joined_sleepers;
    atomic_int arrived; /* the team's barrier */
    atomic_uint bar_gen;
    atomic_int bar_sleepers;
    atomic_int hot;   /* the leader runs a graph: spin between regions */
    atomic_int alone; /* the leader runs regions without calling the workers */
    atomic_bool quit;
    unsigned serial;
    int n_workers;
    pthread_t workers[MAX_THREADS];
} pool_t;

typedef struct {
    pool_t *pool;
    unsigned seen;
} worker_arg_t;

static _Thread_local pool_t *tl_pool;      /* the pool this thread leads */
static _Thread_local pool_t *tl_team_pool; /* the pool of the region this thread is in */
static _Thread_local int tl_tid, tl_team = 1, tl_active;
static _Thread_local int tl_nthreads; /* omp_set_num_threads; 0: the default */

static atomic_ulong g_regions;
static int g_default_threads;
static int64_t g_spin_ns;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_pool_key;

static void futex_wait(atomic_uint *w, unsigned old)
{
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAIT_PRIVATE, old, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *w)
{
    syscall(SYS_futex, (unsigned *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Waits until *w is no longer old: while the pool is hot, spins for at
 * most the spin budget, then sleeps. sleepers counts the sleeping, so that
 * a waker that sees none skips the system call (both sides order their
 * store and load sequentially consistent: either the waker sees the
 * sleeper or the sleeper sees the new value). */
static void wait_change(pool_t *p, atomic_uint *w, unsigned old, atomic_int *sleepers)
{
    if (atomic_load(w) != old)
        return;
    bool hot = atomic_load_explicit(&p->hot, memory_order_relaxed);
    int64_t t0 = hot ? sq_now_ns() : 0;
    if (hot) {
        for (unsigned i = 1;; i++) {
            if (atomic_load_explicit(w, memory_order_acquire) != old)
                return;
            cpu_relax();
            if ((i & 31) == 0 && (!atomic_load_explicit(&p->hot, memory_order_relaxed) ||
                                  sq_now_ns() - t0 > g_spin_ns))
                break;
        }
    }
    atomic_fetch_add(sleepers, 1);
    while (atomic_load(w) == old)
        futex_wait(w, old);
    atomic_fetch_sub(sleepers, 1);
}

static void bump(atomic_uint *w, atomic_int *sleepers)
{
    atomic_fetch_add(w, 1);
    if (atomic_load(sleepers) > 0)
        futex_wake(w);
}

#define CLAIM_TEAM(c) ((int)(((c) >> 16) & 0xFFFF))
#define CLAIM_NEXT(c) ((int)((c)&0xFFFF))

/* Takes the next thread number of the pool's current region, or returns
 * -1 when all are taken. */
static int take(pool_t *p, uint64_t *team_out)
{
    uint64_t c = atomic_load(&p->claim);
    while (CLAIM_NEXT(c) < CLAIM_TEAM(c)) {
        if (atomic_compare_exchange_weak(&p->claim, &c, c + 1)) {
            *team_out = (uint64_t)CLAIM_TEAM(c);
            return CLAIM_NEXT(c);
        }
    }
    return -1;
}

/* Runs thread numbers of the current region while any is left: a thread
 * that finished its share takes a share nobody started (its thread was
 * not scheduled yet: a neighbour holds its core). A region with barriers
 * cannot hand a number over this way, since nobody returns from it before
 * every number reached each barrier, so every number was taken. */
static void run_shares(pool_t *p)
{
    uint64_t team;
    int tid;
    while ((tid = take(p, &team)) >= 0) {
        tl_tid = tid;
        tl_team = (int)team;
        tl_team_pool = p;
        tl_active = 1;
        p->fn(p->data);
        tl_tid = 0;
        tl_team = 1;
        tl_team_pool = NULL;
        tl_active = 0;
        if (atomic_fetch_add(&p->done, 1) + 1 == (int)team)
            bump(&p->joined, &p->joined_sleepers);
    }
}

static void *worker_main(void *arg)
{
    worker_arg_t a = *(worker_arg_t *)arg;
    free(arg);
    pool_t *p = a.pool;
    for (;;) {
        wait_change(p, &p->gen, a.seen, &p->gen_sleepers);
        a.seen = atomic_load(&p->gen);
        if (atomic_load(&p->quit))
            return NULL;
        run_shares(p);
    }
}

/* A leading thread that ends takes its workers with it. */
static void pool_free(void *arg)
{
    pool_t *p = arg;
    atomic_store(&p->quit, true);
    bump(&p->gen, &p->gen_sleepers);
    for (int i = 0; i < p->n_workers; i++)
        pthread_join(p->workers[i], NULL);
    free(p);
}

static void init_once(void)
{
    cpu_set_t set;
    int n = 0;
    const char *e = getenv("OMP_NUM_THREADS");
    if (e != NULL)
        n = atoi(e);
    if (n <= 0 && sched_getaffinity(0, sizeof(set), &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0)
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    g_default_threads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
    const char *s = getenv("SQUISH_CPU_SPIN_US");
    long us = s != NULL ? strtol(s, NULL, 10) : DEFAULT_SPIN_US;
    g_spin_ns = us < 0 ? 0 : us > 100000 ? 100000000 : us * 1000;
    pthread_key_create(&g_pool_key, pool_free);
}

/* The calling thread's pool with at least n - 1 workers, or NULL when no
 * thread could be started (the region then runs on the caller alone). */
static pool_t *pool_of_caller(int n)
{
    pthread_once(&g_once, init_once);
    pool_t *p = tl_pool;
    if (p == NULL) {
        if ((p = calloc(1, sizeof(*p))) == NULL)
            return NULL;
        tl_pool = p;
        pthread_setspecific(g_pool_key, p);
    }
    while (p->n_workers < n - 1) {
        worker_arg_t *a = malloc(sizeof(*a));
        if (a == NULL)
            break;
        *a = (worker_arg_t){p, atomic_load(&p->gen)};
        if (pthread_create(&p->workers[p->n_workers], NULL, worker_main, a) != 0) {
            free(a);
            break;
        }
        p->n_workers++;
    }
    return p;
}

static void run_alone(void (*fn)(void *), void *data)
{
    int tid = tl_tid, team = tl_team;
    pool_t *tp = tl_team_pool;
    tl_tid = 0;
    tl_team = 1;
    tl_team_pool = NULL;
    fn(data);
    tl_tid = tid;
    tl_team = team;
    tl_team_pool = tp;
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
void GOMP_barrier(void);

/* The leader publishes the region (fn, data, then `claim` with a new
 * serial number and the team), calls the workers unless it runs alone,
 * runs shares itself until none is left, and waits until every share
 * returned. Alone, the leader runs the team's shares one after the other
 * on its own core (a neighbour holds the others': measured faster, see
 * backend_cpu.c), unless a share waits at a barrier for shares nobody
 * took: GOMP_barrier calls the workers then. */
void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags)
{
    (void)flags; /* proc_bind: threads are not bound */
    int n = num_threads > 0 ? (int)num_threads : omp_get_max_threads();
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    pool_t *p = tl_active || n <= 1 ? NULL : pool_of_caller(n);
    if (p != NULL && p->n_workers + 1 < n)
        n = p->n_workers + 1;
    if (p == NULL || n <= 1) {
        run_alone(fn, data);
        return;
    }
    atomic_fetch_add_explicit(&g_regions, 1, memory_order_relaxed);
    p->fn = fn;
    p->data = data;
    atomic_store(&p->arrived, 0);
    atomic_store(&p->done, 0);
    unsigned j = atomic_load(&p->joined);
    p->serial++;
    atomic_store(&p->claim, ((uint64_t)p->serial << 32) | ((uint64_t)n << 16));
    if (!atomic_load_explicit(&p->alone, memory_order_relaxed))
        bump(&p->gen, &p->gen_sleepers);
    run_shares(p);
    wait_change(p, &p->joined, j, &p->joined_sleepers);
}

void wk_omp_run(void (*fn)(void *), void *data)
{
    GOMP_parallel(fn, data, 0, 0);
}

void GOMP_barrier(void)
{
    pool_t *p = tl_team_pool;
    if (p == NULL || tl_team <= 1)
        return;
    unsigned g = atomic_load(&p->bar_gen);
    if (atomic_fetch_add(&p->arrived, 1) == tl_team - 1) {
        atomic_store(&p->arrived, 0);
        bump(&p->bar_gen, &p->bar_sleepers);
    } else {
        /* Shares nobody took cannot reach the barrier on their own. */
        uint64_t c = atomic_load(&p->claim);
        if (CLAIM_NEXT(c) < CLAIM_TEAM(c))
            bump(&p->gen, &p->gen_sleepers);
        wait_change(p, &p->bar_gen, g, &p->bar_sleepers);
    }
}

int omp_get_max_threads(void)
{
    pthread_once(&g_once, init_once);
    return tl_nthreads > 0 ? tl_nthreads : g_default_threads;
}

void omp_set_num_threads(int n)
{
    pthread_once(&g_once, init_once);
    tl_nthreads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
}

int omp_get_num_threads(void)
{
    return tl_team;
}

int omp_get_thread_num(void)
{
    return tl_tid;
}

int omp_in_parallel(void)
{
    return tl_active;
}

/* The calling thread's pool, made (with no workers yet) when on asks for
 * it; NULL when off and there is none. */
static pool_t *leaders_pool(bool on)
{
    pthread_once(&g_once, init_once);
    return tl_pool != NULL || !on ? tl_pool : pool_of_caller(1);
}

void wk_omp_hot(bool on)
{
    pool_t *p = leaders_pool(on);
    if (p != NULL)
        atomic_store(&p->hot, on && g_spin_ns > 0 ? 1 : 0);
}

void wk_omp_alone(bool on)
{
    pool_t *p = leaders_pool(on);
    if (p != NULL)
        atomic_store(&p->alone, on ? 1 : 0);
}

bool wk_omp_spins(void)
{
    pthread_once(&g_once, init_once);
    return g_spin_ns > 0;
}

unsigned long wk_omp_regions(void)
{
    return atomic_load_explicit(&g_regions, memory_order_relaxed);
}
