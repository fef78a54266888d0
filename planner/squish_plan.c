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
               "Prints the plan (devices, sessions, batch sizes, duty cycles, lower bound,\n"
               "pipeline budgets, advice) as JSON on stdout.\n");
}

int main(int argc, char **argv)
{
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
