/* squish-sim WORKLOAD.json [--policy deferred|adaptive|early-drop] [--seed N]
 *           [--search-goodput] [--dump] [--scale X] [--duration S]
 *           [--routing auto|all|plan] [--plan-headroom X] [--net-delay-us N]
 *           [--eager-load X] [--plan-burst-quantile P] [--no-overflow]
 *           [--overflow-devices N]
 *           [--epoch-s S] [--split dp|even]
 * Prints the simulation summary JSON (DESIGN.md) on stdout. Exit status: 0,
 * 1 (workload or simulation error), 2 (usage), 3 (the no-overlap checker
 * found a device running two batches at once). */
#include "sim.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: squish-sim WORKLOAD.json [options]\n"
            "Runs squish's dispatcher core (the code squishd runs) against simulated devices\n"
            "that take exactly a profile's l(b) per batch, and prints a JSON summary (goodput,\n"
            "drops, lateness, batch sizes, latency percentiles per model) on stdout.\n"
            "\n"
            "WORKLOAD.json (schemas/workload.schema.json; examples in bench/workloads/):\n"
            "  devices (count, or hosts with rtt_ms and bandwidth_mbps), models with their\n"
            "  profiles (alpha/beta ms, or a latency table), sessions (model, slo_ms, and\n"
            "  rate_rps for Poisson arrivals or times_ms for a trace), pipelines (stages of\n"
            "  models under one end-to-end SLO, each item fanning out gamma items to the\n"
            "  next stage), k_std, seed.\n"
            "\n"
            "options:\n"
            "  --policy P         deferred (Symphony), adaptive (deferred under load, at once\n"
            "                     when arrivals are sparse; squishd's default) or early-drop\n"
            "                     (Nexus); default deferred\n"
            "  --eager-load X     adaptive: dispatch at once below this share of the greedy\n"
            "                     capacity (default 0.9, PL_DEFAULT_EAGER_LOAD, as squishd)\n"
            "  --seed N           arrival seed (default: the workload's)\n"
            "  --scale X          multiply every arrival rate by X (default 1)\n"
            "  --duration S       seconds of arrivals: every session's and pipeline's arrival\n"
            "                     segments stretched or shrunk in proportion to last S (their\n"
            "                     rates kept), a times_ms trace cut at S, a session given only\n"
            "                     rate_rps Poisson for S (default: the workload's durations;\n"
            "                     10 s for a session given only rate_rps)\n"
            "  --search-goodput   find the largest scale at which >= 99%% of requests finish\n"
            "                     within their SLO (with pipelines: >= 99%% of each\n"
            "                     pipeline's queries are good, and of the sessions'\n"
            "                     requests), and print that run\n"
            "  --routing R        which devices hold which model: auto (the plan when the\n"
            "                     workload has more than one model, else all), all, plan\n"
            "  --plan-headroom X  the planner sees every rate times X (>= 1; default 1)\n"
            "  --plan-burst-quantile P\n"
            "                     each planned batch covers the P-quantile of the Poisson count\n"
            "                     arriving in its duty cycle (0: mean rates; default 0.99)\n"
            "  --no-overflow      spare devices (the plan needs fewer than there are) stay\n"
            "                     unrouted; default: they also hold the busiest sessions\n"
            "  --overflow-devices N\n"
            "                     at most N devices take one session's overflow (default 0:\n"
            "                     every device while sessions x devices <= 65536, else 16)\n"
            "  --epoch-s S        re-plan by squishd's planning loop with an epoch period of\n"
            "                     S seconds of simulated time (rates every second, early\n"
            "                     epochs on rate changes); the first plan takes the\n"
            "                     workload's rates at time 0 (default 0: one plan at the\n"
            "                     mean rates). Needs the workload's devices.count. The\n"
            "                     summary then has \"steps\":\n"
            "                     per rate step (segment boundaries), the share within SLO,\n"
            "                     drops, late, planned devices and each device's busy share\n"
            "  --split S          how a pipeline's SLO is split among its stages: dp (Nexus's\n"
            "                     dynamic programming, pl_query_split; default) or even (equal\n"
            "                     shares of the longest root-to-leaf path)\n"
            "  --net-delay-us N   fixed delay added to every batch (default 0)\n"
            "  --dump             also print every request and batch\n"
            "  --help             this text\n"
            "  --version          print the version and exit\n"
            "Exit status: 0; 1 workload or simulation error; 2 usage; 3 a device ran two\n"
            "batches at once (the checker).\n");
}

static int parse_double(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return *s && *end == '\0' ? 0 : -1;
}

int main(int argc, char **argv)
{
    sim_opts_t opts;
    sim_opts_default(&opts);
    const char *path = NULL;
    int search = 0, dump = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--version") == 0) {
            printf("squish-sim %s\n", SQUISH_VERSION);
            return 0;
        } else if (strcmp(a, "--search-goodput") == 0) {
            search = 1;
        } else if (strcmp(a, "--epoch-s") == 0 && v) {
            if (parse_double(v, &x) < 0 || !(x >= 0)) {
                fprintf(stderr, "squish-sim: --epoch-s: must be >= 0 seconds\n");
                return 2;
            }
            opts.epoch_s = x;
            i++;
        } else if (strcmp(a, "--no-overflow") == 0) {
            opts.plan_overflow = 0;
        } else if (strcmp(a, "--overflow-devices") == 0 && v) {
            opts.plan_overflow_devices = atoi(v);
            if (opts.plan_overflow_devices < 0) {
                fprintf(stderr, "squish-sim: --overflow-devices wants N >= 0\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--dump") == 0) {
            dump = 1;
        } else if (strcmp(a, "--policy") == 0 && v) {
            if (pl_policy_parse(v, &opts.policy) < 0) {
                fprintf(stderr, "squish-sim: --policy: unknown policy \"%s\"\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--seed") == 0 && v) {
            char *end;
            opts.seed = strtoull(v, &end, 10);
            if (!*v || *end) {
                fprintf(stderr, "squish-sim: --seed: not a number: %s\n", v);
                return 2;
            }
            opts.seed_given = 1;
            i++;
        } else if (strcmp(a, "--scale") == 0 && v) {
            if (parse_double(v, &x) < 0 || !(x > 0)) {
                fprintf(stderr, "squish-sim: --scale: must be > 0\n");
                return 2;
            }
            opts.rate_scale = x;
            i++;
        } else if (strcmp(a, "--duration") == 0 && v) {
            if (parse_double(v, &x) < 0 || !(x > 0)) {
                fprintf(stderr, "squish-sim: --duration: must be > 0 seconds\n");
                return 2;
            }
            opts.duration_s = x;
            i++;
        } else if (strcmp(a, "--net-delay-us") == 0 && v) {
            if (parse_double(v, &x) < 0 || !(x >= 0)) {
                fprintf(stderr, "squish-sim: --net-delay-us: must be >= 0\n");
                return 2;
            }
            opts.net_delay_us = (int64_t)x;
            i++;
        } else if (strcmp(a, "--eager-load") == 0 && v) {
            if (parse_double(v, &x) < 0 || !(x > 0) || x > 1) {
                fprintf(stderr, "squish-sim: --eager-load: must be in (0, 1]\n");
                return 2;
            }
            opts.eager_load = x;
            i++;
        } else if (strcmp(a, "--plan-headroom") == 0 && v) {
            if (parse_double(v, &x) < 0 || !(x >= 1)) {
                fprintf(stderr, "squish-sim: --plan-headroom: must be >= 1\n");
                return 2;
            }
            opts.plan_headroom = x;
            i++;
        } else if (strcmp(a, "--plan-burst-quantile") == 0 && v) {
            if (parse_double(v, &x) < 0 || !(x >= 0) || !(x < 1)) {
                fprintf(stderr, "squish-sim: --plan-burst-quantile: must be in [0, 1)\n");
                return 2;
            }
            opts.plan_burst_quantile = x;
            i++;
        } else if (strcmp(a, "--split") == 0 && v) {
            if (strcmp(v, "dp") == 0)
                opts.split = WL_SPLIT_DP;
            else if (strcmp(v, "even") == 0)
                opts.split = WL_SPLIT_EVEN;
            else {
                fprintf(stderr, "squish-sim: --split: dp or even\n");
                return 2;
            }
            i++;
        } else if (strcmp(a, "--routing") == 0 && v) {
            if (strcmp(v, "auto") == 0)
                opts.routing = SIM_ROUTE_AUTO;
            else if (strcmp(v, "all") == 0)
                opts.routing = SIM_ROUTE_ALL;
            else if (strcmp(v, "plan") == 0)
                opts.routing = SIM_ROUTE_PLAN;
            else {
                fprintf(stderr, "squish-sim: --routing: auto, all or plan\n");
                return 2;
            }
            i++;
        } else if (a[0] != '-' && path == NULL) {
            path = a;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (path == NULL) {
        usage(stderr);
        return 2;
    }
    wl_workload_t w;
    int rc = wl_load_file(&w, path);
    if (rc < 0) {
        fprintf(stderr, "squish-sim: %s: %s\n", path, w.error[0] ? w.error : sq_err_msg(rc));
        wl_workload_dispose(&w);
        return 1;
    }
    if (opts.epoch_s > 0 && w.device_count < 1) {
        /* Re-planning moves sessions among a fixed set of devices; a
         * workload without a count takes as many as its one plan asks. */
        fprintf(stderr,
                "squish-sim: %s: --epoch-s re-plans on a fixed number of devices, and this "
                "workload has none (devices.count 0: as many as the plan asks); give "
                "devices.count, or leave --epoch-s out\n",
                path);
        wl_workload_dispose(&w);
        return 2;
    }
    sim_result_t res;
    double scale = 0;
    int runs = 0;
    if (search)
        rc = sim_search_goodput(&w, &opts, 0.99, &scale, &runs, &res);
    else
        rc = sim_run(&w, &opts, &res);
    int status = 0;
    if (rc < 0 && res.overlap_batch < 0) {
        fprintf(stderr, "squish-sim: simulation failed: %s\n", sq_err_msg(rc));
        status = 1;
    } else {
        char *text = sim_summary_json(&w, &opts, &res, search ? scale : 0, runs, dump);
        fputs(text, stdout);
        fputc('\n', stdout);
        free(text);
        if (res.overlap_batch >= 0) {
            fprintf(stderr, "squish-sim: device %d runs two batches at once (batch %ld)\n",
                    res.batches[res.overlap_batch].device, res.overlap_batch);
            status = 3;
        }
    }
    sim_result_dispose(&res);
    wl_workload_dispose(&w);
    return status;
}
