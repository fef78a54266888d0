#include <criterion/criterion.h>
#include <jansson.h>
#include <pl.h>
#include <sq.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <workload.h>

static const char *FULL =
    "{\"devices\": {\"count\": 8, \"memory_mb\": 11264},"
    " \"models\": ["
    "  {\"name\": \"A\", \"memory_mb\": 300,"
    "   \"profile\": {\"batch\": [16, 4, 8], \"latency_ms\": [100, 50, 75],"
    "                 \"latency_std_ms\": [2, 1, 1.5]}},"
    "  {\"name\": \"resnet50\", \"max_batch\": 64, \"memory_per_item_mb\": 2,"
    "   \"profile\": {\"alpha_ms\": 1.053, \"beta_ms\": 5.072}},"
    "  {\"name\": \"ft1\", \"profile\": {\"alpha_ms\": 0.1, \"beta_ms\": 1}},"
    "  {\"name\": \"ft2\", \"profile\": {\"alpha_ms\": 0.1, \"beta_ms\": 1}}],"
    " \"prefix_groups\": [{\"name\": \"ft\", \"models\": [\"ft1\", \"ft2\"], \"memory_mb\": 90,"
    "   \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 5}}],"
    " \"sessions\": ["
    "  {\"model\": \"A\", \"slo_ms\": 200, \"rate_rps\": 64},"
    "  {\"model\": \"resnet50\", \"slo_ms\": 25,"
    "   \"arrivals\": {\"process\": \"poisson\", \"segments\": [{\"duration_s\": 30, \"rate_rps\": "
    "5000},"
    "                                                       {\"duration_s\": 10, \"rate_rps\": "
    "1000}]}},"
    "  {\"model\": \"resnet50\", \"slo_ms\": 25, \"arrivals\": {\"times_ms\": [1.5, 0, 0.75]}},"
    "  {\"model\": \"A\", \"slo_ms\": 300, \"rate_rps\": 10,"
    "   \"arrivals\": {\"process\": \"gamma\", \"shape\": 0.5, \"segments\": [{\"duration_s\": 1, "
    "\"rate_rps\": 3}]}},"
    "  {\"model\": \"ft1\", \"slo_ms\": 50, \"rate_rps\": 30},"
    "  {\"model\": \"ft2\", \"slo_ms\": 50, \"rate_rps\": 10}],"
    " \"pipelines\": [{\"name\": \"traffic\", \"slo_ms\": 400, \"rate_rps\": 100,"
    "   \"stages\": [{\"id\": \"det\", \"model\": \"A\"},"
    "              {\"id\": \"car\", \"model\": \"resnet50\", \"after\": \"det\", \"gamma\": 1.5},"
    "              {\"id\": \"face\", \"model\": \"resnet50\", \"after\": [\"det\"], \"gamma\": "
    "[0.5]},"
    "              {\"id\": \"join\", \"model\": \"A\", \"after\": [\"car\", \"face\"]}]}],"
    " \"planner\": {\"k_std\": 1},"
    " \"seed\": 7}";

Test(workload, full_example_loads_into_structs)
{
    wl_workload_t w;
    cr_assert_eq(wl_load_string(&w, FULL), 0, "%s", w.error);
    cr_assert_eq(w.device_count, 8);
    cr_assert_float_eq(w.device_memory_mb, 11264, 1e-9);
    cr_assert_eq(w.seed, 7);
    cr_assert_float_eq(w.k_std, 1, 1e-12);
    cr_assert_float_eq(w.query_epsilon_ms, 1, 1e-12);
    cr_assert_eq(w.nmodels, 4);
    cr_assert_str_eq(w.models[0].name, "A");
    cr_assert_eq(w.models[0].profile.nrows, 3);
    cr_assert_eq(w.models[0].profile.max_batch, 16);
    cr_assert_float_eq(pl_latency_us(&w.models[0].profile, 8, 1), 76500, 1e-6);
    cr_assert_float_eq(w.models[0].profile.memory_bytes, 300 * WL_BYTES_PER_MB, 1e-3);
    cr_assert(w.models[1].profile.linear);
    cr_assert_eq(w.models[1].profile.max_batch, 64);
    cr_assert_float_eq(pl_latency_us(&w.models[1].profile, 16, 0), 1053 * 16 + 5072, 1e-6);
    cr_assert_float_eq(w.models[1].profile.memory_per_item_bytes, 2 * WL_BYTES_PER_MB, 1e-3);
    cr_assert_eq(w.models[2].profile.max_batch, WL_DEFAULT_MAX_BATCH);
    cr_assert_eq(w.models[0].prefix_group, -1);
    cr_assert_eq(w.models[3].prefix_group, 0);
    cr_assert_eq(w.nprefix_groups, 1);
    cr_assert_eq(w.prefix_groups[0].nmodels, 2);
    cr_assert_eq(w.prefix_groups[0].models[1], 3);

    cr_assert_eq(w.nsessions, 6);
    cr_assert_eq(w.sessions[0].arrivals.process, WL_ARRIVALS_NONE);
    cr_assert_float_eq(w.sessions[0].rate_rps, 64, 1e-12);
    const wl_arrivals_t *a = &w.sessions[1].arrivals;
    cr_assert_eq(a->process, WL_ARRIVALS_POISSON);
    cr_assert_eq(a->nsegments, 2);
    cr_assert_float_eq(a->segments[1].rate_rps, 1000, 1e-12);
    cr_assert_float_eq(w.sessions[1].rate_rps, (30 * 5000 + 10 * 1000) / 40.0, 1e-9);
    a = &w.sessions[2].arrivals;
    cr_assert_eq(a->process, WL_ARRIVALS_TIMES);
    cr_assert_eq(a->ntimes, 3);
    cr_assert_float_eq(a->times_ms[1], 0.75, 1e-12, "sorted");
    cr_assert_float_eq(w.sessions[2].rate_rps, 2 / 1.5e-3, 1e-6);
    cr_assert_eq(w.sessions[3].arrivals.process, WL_ARRIVALS_GAMMA);
    cr_assert_float_eq(w.sessions[3].arrivals.shape, 0.5, 1e-12);
    cr_assert_float_eq(w.sessions[3].rate_rps, 10, 1e-12, "rate_rps wins over arrivals");

    cr_assert_eq(w.npipelines, 1);
    const wl_pipeline_t *pl = &w.pipelines[0];
    cr_assert_eq(pl->nstages, 4);
    cr_assert_eq(pl->stages[1].nafter, 1);
    cr_assert_eq(pl->stages[1].after[0], 0);
    cr_assert_float_eq(pl->stages[1].gamma[0], 1.5, 1e-12);
    cr_assert_eq(pl->stages[3].nafter, 2);
    cr_assert_eq(pl->stages[3].after[1], 2);
    cr_assert_float_eq(pl->stages[3].gamma[1], 1, 1e-12, "gamma defaults to 1");
    cr_assert_eq(wl_find_model(&w, "resnet50"), 1);
    cr_assert_eq(wl_find_model(&w, "nope"), -1);
    wl_workload_dispose(&w);
    wl_workload_dispose(&w);
}

static void expect_error(const char *json, int code, const char *path)
{
    wl_workload_t w;
    cr_assert_eq(wl_load_string(&w, json), code, "%s -> %s", json, w.error);
    cr_assert(strstr(w.error, path) != NULL, "error \"%s\" should name %s", w.error, path);
    cr_assert_eq(w.nmodels, 0, "nothing left behind");
    wl_workload_dispose(&w);
}

Test(workload, errors_name_the_json_path)
{
    const char *M =
        "\"models\": [{\"name\": \"A\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 2}}]";
    char buf[512];
    expect_error("{\"models\": [", SQ_BAD_JSON, "line 1");
    expect_error("[]", SQ_BAD_CONFIG, "(root)");
    expect_error("{}", SQ_BAD_CONFIG, "models: required");
    expect_error("{\"models\": [{\"name\": \"A\", \"profile\": {\"batch\": [1, 2], "
                 "\"latency_ms\": [1, -2]}}]}",
                 SQ_BAD_CONFIG, "models[0].profile.latency_ms[1]");
    expect_error("{\"models\": [{\"name\": \"A\", \"profile\": {\"batch\": [2, 2], "
                 "\"latency_ms\": [1, 2]}}]}",
                 SQ_BAD_CONFIG, "models[0].profile.batch");
    expect_error("{\"models\": [{\"name\": \"A\", \"profile\": {\"alpha_ms\": 1}}]}", SQ_BAD_CONFIG,
                 "models[0].profile.beta_ms: required");
    snprintf(buf, sizeof(buf),
             "{%s, \"sessions\": [{\"model\": \"B\", \"slo_ms\": 5, "
             "\"rate_rps\": 1}]}",
             M);
    expect_error(buf, SQ_BAD_CONFIG, "sessions[0].model: unknown model \"B\"");
    snprintf(buf, sizeof(buf),
             "{%s, \"sessions\": [{\"model\": \"A\", \"slo_ms\": 0, "
             "\"rate_rps\": 1}]}",
             M);
    expect_error(buf, SQ_BAD_CONFIG, "sessions[0].slo_ms");
    snprintf(buf, sizeof(buf), "{%s, \"sessions\": [{\"model\": \"A\", \"slo_ms\": 5}]}", M);
    expect_error(buf, SQ_BAD_CONFIG, "needs rate_rps or arrivals");
    snprintf(buf, sizeof(buf),
             "{%s, \"sessions\": [{\"model\": \"A\", \"slo_ms\": 5, "
             "\"arrivals\": {\"process\": \"burst\", \"segments\": "
             "[{\"duration_s\": 1, \"rate_rps\": 1}]}}]}",
             M);
    expect_error(buf, SQ_BAD_CONFIG, "sessions[0].arrivals.process");
    snprintf(buf, sizeof(buf),
             "{%s, \"sessions\": [{\"model\": \"A\", \"slo_ms\": 5, "
             "\"arrivals\": {\"segments\": [{\"duration_s\": 0, "
             "\"rate_rps\": 1}]}}]}",
             M);
    expect_error(buf, SQ_BAD_CONFIG, "sessions[0].arrivals.segments[0].duration_s");
    snprintf(buf, sizeof(buf),
             "{%s, \"pipelines\": [{\"name\": \"p\", \"slo_ms\": 100, "
             "\"rate_rps\": 1, \"stages\": [{\"id\": \"x\", \"model\": \"A\", "
             "\"after\": \"y\"}]}]}",
             M);
    expect_error(buf, SQ_BAD_CONFIG, "pipelines[0].stages[0].after");
    snprintf(buf, sizeof(buf), "{%s, \"devices\": {\"count\": -1}}", M);
    expect_error(buf, SQ_BAD_CONFIG, "devices.count");
    snprintf(buf, sizeof(buf),
             "{%s, \"prefix_groups\": [{\"name\": \"g\", \"models\": [\"Z\"], "
             "\"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}}]}",
             M);
    expect_error(buf, SQ_BAD_CONFIG, "prefix_groups[0].models[0]");

    wl_workload_t w;
    cr_assert_eq(wl_load_file(&w, "/nonexistent/workload.json"), SQ_IO);
    cr_assert(strstr(w.error, "/nonexistent/workload.json") != NULL);
    wl_workload_dispose(&w);
}

Test(workload, plan_input_and_plan_json)
{
    wl_workload_t w;
    cr_assert_eq(wl_load_string(&w, FULL), 0, "%s", w.error);
    wl_plan_input_t in;
    cr_assert_eq(wl_plan_input_build(&in, &w), 0, "%s", w.error);
    /* 4 plain sessions, 1 prefix-group session (ft1 + ft2 at 50 ms), 4 stages */
    cr_assert_eq(in.nsessions, 9);
    cr_assert_eq(in.sources[4].kind, WL_SOURCE_GROUP);
    cr_assert_eq(in.sources[4].nmembers, 2);
    cr_assert_float_eq(in.sessions[4].rate_rps, 40, 1e-12);
    cr_assert_str_eq(in.sessions[4].name, "ft");
    cr_assert_eq(in.split_rc[0], 0);
    cr_assert_eq(in.sources[8].kind, WL_SOURCE_STAGE);
    cr_assert_float_eq(in.sessions[6].rate_rps, 150, 1e-9, "car: 100 x 1.5");
    cr_assert_float_eq(in.sessions[8].rate_rps, 150, 1e-9, "join: its busier input");
    double path = in.sessions[5].slo_us + in.sessions[6].slo_us + in.sessions[8].slo_us;
    cr_assert_leq(path, 400000 + 1e-6);
    for (int i = 0; i < in.nsessions; i++)
        cr_assert_eq(in.sessions[i].id, i);

    pl_plan_t plan;
    cr_assert_eq(pl_plan(&plan, in.sessions, in.nsessions, NULL, &in.options), 0);
    char *s = wl_plan_to_json(&w, &in, &plan, plan.ndevices);
    json_error_t jerr;
    json_t *root = json_loads(s, 0, &jerr);
    cr_assert_not_null(root, "%s", jerr.text);
    json_t *devs = json_object_get(root, "devices");
    cr_assert_eq((int)json_array_size(devs), plan.ndevices);
    json_t *d0 = json_array_get(devs, 0);
    cr_assert_float_eq(json_real_value(json_object_get(d0, "duty_cycle_ms")),
                       plan.devices[0].duty_cycle_us / 1000, 1e-9);
    json_t *s0 = json_array_get(json_object_get(d0, "sessions"), 0);
    cr_assert(json_is_string(json_object_get(s0, "model")));
    cr_assert(json_is_integer(json_object_get(s0, "batch")));
    cr_assert_float_eq(json_real_value(json_object_get(root, "lower_bound_devices")),
                       plan.lower_bound_devices, 1e-9);
    json_t *budgets =
        json_object_get(json_array_get(json_object_get(root, "pipelines"), 0), "budgets_ms");
    cr_assert_float_eq(json_real_value(json_object_get(budgets, "det")),
                       in.sessions[5].slo_us / 1000, 1e-9);
    cr_assert_eq(
        json_integer_value(json_object_get(json_object_get(root, "advice"), "devices_delta")),
        plan.ndevices - 8);
    json_decref(root);
    free(s);
    pl_plan_dispose(&plan);
    wl_plan_input_dispose(&in);
    wl_workload_dispose(&w);
}

Test(workload, pipeline_arrivals_gamma_dist_and_even_split)
{
    static const char *json =
        "{\"models\": [{\"name\": \"X\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 10}},"
        "              {\"name\": \"Y\", \"profile\": {\"alpha_ms\": 0.5, \"beta_ms\": 5}}],"
        " \"pipelines\": [{\"name\": \"q\", \"slo_ms\": 300,"
        "   \"arrivals\": {\"process\": \"uniform\", \"segments\": [{\"duration_s\": 2, "
        "\"rate_rps\": 10}, {\"duration_s\": 2, \"rate_rps\": 30}]},"
        "   \"stages\": [{\"id\": \"x\", \"model\": \"X\"},"
        "              {\"id\": \"y\", \"model\": \"Y\", \"after\": \"x\", \"gamma\": 2.5,"
        "               \"gamma_dist\": \"fixed\"},"
        "              {\"id\": \"z\", \"model\": \"Y\", \"after\": \"x\"}]}]}";
    wl_workload_t w;
    cr_assert_eq(wl_load_string(&w, json), 0, "%s", w.error);
    const wl_pipeline_t *pl = &w.pipelines[0];
    cr_assert_eq(pl->arrivals.process, WL_ARRIVALS_UNIFORM);
    cr_assert_eq(pl->arrivals.nsegments, 2);
    cr_assert_float_eq(pl->rate_rps, 20, 1e-12, "the arrivals' mean rate");
    cr_assert_eq(pl->stages[1].gamma_dist, WL_GAMMA_FIXED);
    cr_assert_eq(pl->stages[2].gamma_dist, WL_GAMMA_POISSON, "the default");

    wl_plan_input_t even, dp;
    cr_assert_eq(wl_plan_input_build_split(&even, &w, WL_SPLIT_EVEN), 0);
    cr_assert_eq(even.split, WL_SPLIT_EVEN);
    cr_assert_eq(even.nsessions, 3);
    for (int k = 0; k < 3; k++)
        cr_assert_float_eq(even.sessions[k].slo_us, 150000, 1e-6, "SLO / 2 each");
    cr_assert_float_eq(even.sessions[1].rate_rps, 50, 1e-9);
    cr_assert_eq(wl_plan_input_build(&dp, &w), 0);
    cr_assert_eq(dp.split, WL_SPLIT_DP);
    cr_assert_leq(dp.splits[0].cost_devices, even.splits[0].cost_devices + 1e-12);
    cr_assert(dp.sessions[0].slo_us != 150000, "the DP gives x less than half here");
    wl_plan_input_dispose(&even);
    wl_plan_input_dispose(&dp);
    wl_workload_dispose(&w);

    char buf[1024];
    snprintf(buf, sizeof(buf),
             "{\"models\": [{\"name\": \"X\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}}],"
             " \"pipelines\": [{\"name\": \"q\", \"slo_ms\": 100, \"rate_rps\": 1,"
             "   \"stages\": [{\"id\": \"x\", \"model\": \"X\"}, {\"id\": \"y\", \"model\": "
             "\"X\", \"after\": \"x\", \"gamma_dist\": \"binomial\"}]}]}");
    expect_error(buf, SQ_BAD_CONFIG, "pipelines[0].stages[1].gamma_dist");
    snprintf(buf, sizeof(buf),
             "{\"models\": [{\"name\": \"X\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}}],"
             " \"pipelines\": [{\"name\": \"q\", \"slo_ms\": 100,"
             "   \"stages\": [{\"id\": \"x\", \"model\": \"X\"}]}]}");
    expect_error(buf, SQ_BAD_CONFIG, "pipelines[0]");
    snprintf(buf, sizeof(buf),
             "{\"models\": [{\"name\": \"X\", \"profile\": {\"alpha_ms\": 1, \"beta_ms\": 1}}],"
             " \"pipelines\": [{\"name\": \"q\", \"slo_ms\": 100, \"arrivals\": {\"segments\": "
             "[{\"duration_s\": 1, \"rate_rps\": -1}]},"
             "   \"stages\": [{\"id\": \"x\", \"model\": \"X\"}]}]}");
    expect_error(buf, SQ_BAD_CONFIG, "pipelines[0].arrivals.segments[0].rate_rps");
}
