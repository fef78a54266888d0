/* squish-plan: offline capacity planning. Reads a workload JSON, runs the
 * same placement core as squishd and prints the plan JSON that /v1/plan
 * serves. */
#include "pl.h"
#include "workload.h"

#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: squish-plan WORKLOAD.json\n"
               "Plans a workload offline with squishd's planner (Nexus's squishy bin packing,\n"
               "complex-query latency split, Symphony's links) and prints the plan as JSON on\n"
               "stdout (schemas/plan.schema.json): devices with their sessions, batch sizes,\n"
               "duty cycles, occupancy and memory; the lower bound on devices; sessions left\n"
               "unplaced and why; each pipeline's SLO split; advice on devices to add or release.\n"
               "\n"
               "WORKLOAD.json (schemas/workload.schema.json; examples in bench/workloads/):\n"
               "  \"devices\": count, or hosts (count, rtt_ms, bandwidth_mbps each: devices\n"
               "             behind a link), and memory_mb per device;\n"
               "  \"models\": name, max_batch, memory_mb, and a profile: alpha_ms/beta_ms\n"
               "             (l(b) = alpha b + beta) or batch/latency_ms tables;\n"
               "  \"prefix_groups\": models sharing a backbone, planned as one;\n"
               "  \"sessions\": model, slo_ms and the rate (rate_rps, or arrival segments);\n"
               "  \"pipelines\": stages with their models and gamma (fan-out), an end-to-end\n"
               "             slo_ms and a rate; optional k_std (latency margin) and seed.\n"
               "Options: --help (this text), --version. Exit status: 0; 1 a bad workload; 2\n"
               "usage.\n");
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        printf("squish-plan %s\n", SQUISH_VERSION);
        return 0;
    }
    if (argc != 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc == 2 ? stdout : stderr);
        return argc == 2 ? 0 : 2;
    }
    wl_workload_t w;
    int rc = wl_load_file(&w, argv[1]);
    if (rc < 0) {
        fprintf(stderr, "squish-plan: %s: %s\n", argv[1], w.error);
        return 1;
    }
    wl_plan_input_t in;
    if ((rc = wl_plan_input_build(&in, &w)) < 0) {
        fprintf(stderr, "squish-plan: %s: %s\n", argv[1], w.error);
        wl_workload_dispose(&w);
        return 1;
    }
    /* First without a cap, to know how many devices the workload needs (the
     * advice), then within the devices the workload has. */
    pl_plan_t plan;
    rc = pl_plan(&plan, in.sessions, in.nsessions, NULL, &in.options);
    if (rc == 0 && w.device_count > 0 && plan.ndevices > w.device_count) {
        int needed = plan.ndevices;
        pl_plan_dispose(&plan);
        pl_options_t capped = in.options;
        capped.max_devices = w.device_count;
        rc = pl_plan(&plan, in.sessions, in.nsessions, NULL, &capped);
        if (rc == 0) {
            char *json = wl_plan_to_json(&w, &in, &plan, needed);
            puts(json);
            free(json);
            pl_plan_dispose(&plan);
        }
    } else if (rc == 0) {
        char *json = wl_plan_to_json(&w, &in, &plan, plan.ndevices);
        puts(json);
        free(json);
        pl_plan_dispose(&plan);
    }
    if (rc < 0)
        fprintf(stderr, "squish-plan: %s: planning failed: %s\n", argv[1], sq_err_msg(rc));
    wl_plan_input_dispose(&in);
    wl_workload_dispose(&w);
    return rc < 0 ? 1 : 0;
}
