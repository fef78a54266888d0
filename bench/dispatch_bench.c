/* squish-dispatch-bench [REQUESTS]: how many requests per second one core
 * pushes through the dispatcher core (planner/dispatch.c), timer, batch and
 * drop handling included, on a virtual clock (no sleeping: the clock jumps
 * to the next event), per second of this thread's CPU time. Scenarios: the Symphony table-2
 * workload (one model, 8 workers, Poisson at ~95% of the staggered bound) and a mixed one (37
 * sessions on 64 workers), both policies; then both with half the workers behind a link
 * (pl_dispatch_worker_net). Prints one JSON object. */
#include <pl_dispatch.h>
#include <sq.h>

#include "sim/sim_rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPU time of this thread: on a shared 2-core box wall time mostly measures
 * the neighbours; the core is single-threaded, so its CPU time is its cost. */
static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

typedef struct {
    int64_t end_us;
    int worker;
} done_t;

/* Runs n requests; returns the CPU seconds this thread spent in the loop. */
static double run(pl_policy_t policy, int nsessions, int nworkers, int nremote, double rate_rps,
                  long n, uint64_t *batches_out, uint64_t *dropped_out)
{
    pl_dispatch_opts_t o = {.policy = policy};
    pl_dispatch_t *d = pl_dispatch_new(&o);
    pl_profile_t p;
    /* ResNet50 on a 1080Ti (Symphony table 2); SLO 25 ms. */
    pl_profile_init_linear(&p, 1053, 5072, 64);
    for (int s = 0; s < nsessions; s++) {
        /* 224x224x3 uint8 in, 1000 floats out. */
        pl_session_cfg_t cfg = {.profile = &p, .slo_us = 25000, .item_bytes = 154528};
        pl_dispatch_session_add(d, &cfg);
    }
    pl_route_t *routes = malloc(sizeof(*routes) * (size_t)nworkers);
    for (int k = 0; k < nworkers; k++) {
        pl_dispatch_worker_add(d, 0, k, 0);
        routes[k] = (pl_route_t){.worker = k};
        /* The last nremote behind 0.2 ms and 10 Gbit/s. */
        if (k >= nworkers - nremote)
            pl_dispatch_worker_net(d, 0, k, 200, 1250);
    }
    /* Each session on 8 workers (a sub-cluster), spread over the pool. */
    int per = nworkers < 8 ? nworkers : 8;
    for (int s = 0; s < nsessions; s++) {
        pl_route_t r[8];
        for (int k = 0; k < per; k++)
            r[k] = (pl_route_t){.worker = (s * 3 + k) % nworkers};
        for (int a = 1; a < per; a++)
            for (int b = a; b > 0 && r[b - 1].worker > r[b].worker; b--) {
                pl_route_t t = r[b];
                r[b] = r[b - 1];
                r[b - 1] = t;
            }
        pl_dispatch_route_set(d, 0, s, r, per);
    }
    const pl_action_t *acts;
    pl_dispatch_take(d, &acts);
    done_t *heap = malloc(sizeof(*heap) * (size_t)nworkers);
    uint64_t *batch = calloc((size_t)nworkers, sizeof(uint64_t));
    int nheap = 0;
    int64_t timer = PL_NEVER;
    sim_rng_t rng;
    sim_rng_seed(&rng, 42);
    double t_arr = 0;
    long next = 0;
    uint64_t batches = 0, dropped = 0;
    double mean_gap_us = 1e6 / rate_rps;
    int64_t next_arr_us = 0;
    int64_t t0 = thread_cpu_ns();
    for (;;) {
        int64_t t_done = nheap ? heap[0].end_us : PL_NEVER;
        int64_t t_a = next < n ? next_arr_us : PL_NEVER;
        int64_t now = t_done < t_a ? t_done : t_a;
        if (timer < now)
            now = timer;
        if (now == PL_NEVER)
            break;
        if (t_done == now) {
            done_t top = heap[0];
            heap[0] = heap[--nheap];
            for (int i = 0;;) {
                int l = 2 * i + 1, r = l + 1, m = i;
                if (l < nheap && heap[l].end_us < heap[m].end_us)
                    m = l;
                if (r < nheap && heap[r].end_us < heap[m].end_us)
                    m = r;
                if (m == i)
                    break;
                done_t t = heap[i];
                heap[i] = heap[m];
                heap[m] = t;
                i = m;
            }
            pl_dispatch_batch_done(d, now, top.worker, batch[top.worker]);
        } else if (t_a == now) {
            int s = (int)(sim_rng_next(&rng) % (uint64_t)nsessions);
            pl_dispatch_request(d, now, (uint64_t)next, s, now, now + 25000);
            next++;
            t_arr += sim_rng_exp(&rng) * mean_gap_us;
            next_arr_us = (int64_t)t_arr;
        } else {
            timer = PL_NEVER;
            pl_dispatch_timer(d, now);
        }
        size_t na = pl_dispatch_take(d, &acts);
        for (size_t i = 0; i < na; i++) {
            if (acts[i].kind == PL_ACT_TIMER) {
                timer = acts[i].at_us;
            } else if (acts[i].kind == PL_ACT_DROP) {
                dropped++;
            } else {
                batches++;
                batch[acts[i].worker] = acts[i].batch_id;
                int j = nheap++;
                heap[j] = (done_t){.end_us = acts[i].finish_us, .worker = acts[i].worker};
                while (j > 0 && heap[(j - 1) / 2].end_us > heap[j].end_us) {
                    done_t t = heap[j];
                    heap[j] = heap[(j - 1) / 2];
                    heap[(j - 1) / 2] = t;
                    j = (j - 1) / 2;
                }
            }
        }
    }
    double secs = (double)(thread_cpu_ns() - t0) / 1e9;
    *batches_out = batches;
    *dropped_out = dropped;
    free(heap);
    free(batch);
    free(routes);
    pl_profile_dispose(&p);
    pl_dispatch_free(d);
    return secs;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    if (n <= 0) {
        fprintf(stderr, "usage: squish-dispatch-bench [REQUESTS]\n");
        return 2;
    }
    struct {
        const char *name;
        int nsessions, nworkers, nremote;
        double rate_rps;
    } cases[] = {
        {"resnet50_8dev_5550rps", 1, 8, 0, 5550},
        {"resnet50_8dev_overload_11000rps", 1, 8, 0, 11000},
        {"37sessions_64dev_40000rps", 37, 64, 0, 40000},
        /* Half the workers behind a link (0.2 ms, 10 Gbit/s, 154528 bytes
         * a request): the links' cost in the core. */
        {"resnet50_8dev_half_remote_5100rps", 1, 8, 4, 5100},
        {"37sessions_64dev_half_remote_40000rps", 37, 64, 32, 40000},
    };
    printf("{\n  \"requests_per_case\": %ld,\n  \"cases\": [\n", n);
    int first = 1;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int pol = 0; pol < 2; pol++) {
            uint64_t batches, dropped;
            double secs = run((pl_policy_t)pol, cases[c].nsessions, cases[c].nworkers,
                              cases[c].nremote, cases[c].rate_rps, n, &batches, &dropped);
            printf("%s    {\"case\": \"%s\", \"policy\": \"%s\", \"cpu_seconds\": %.3f, "
                   "\"requests_per_s\": %.0f, \"batches\": %llu, \"dropped\": %llu}",
                   first ? "" : ",\n", cases[c].name, pl_policy_name((pl_policy_t)pol), secs,
                   (double)n / secs, (unsigned long long)batches, (unsigned long long)dropped);
            first = 0;
        }
    }
    printf("\n  ]\n}\n");
    return 0;
}
