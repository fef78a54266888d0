/* gateway/pipelines.c: parsing specs (field-naming errors, cycles, order),
 * the even split, measured fan-out, and the query DP's split moving with
 * gamma. Models are not looked at here (reg NULL): integration tests
 * check them against a real registry. */
#include <criterion/criterion.h>
#include <gw_catalog.h>
#include <pl_profile.h>
#include <sq.h>

#include <math.h>
#include <string.h>

static gw_pipeline_t *parse_ok(const char *txt)
{
    json_error_t je;
    json_t *j = json_loads(txt, 0, &je);
    cr_assert_not_null(j, "%s", je.text);
    gw_pipeline_t *p = NULL;
    char err[512];
    int rc = gw_pipeline_parse(j, NULL, &p, err, sizeof(err));
    json_decref(j);
    cr_assert_eq(rc, 0, "%s", err);
    return p;
}

static void parse_bad(const char *txt, const char *field)
{
    json_t *j = json_loads(txt, 0, NULL);
    cr_assert_not_null(j, "%s", txt);
    gw_pipeline_t *p = NULL;
    char err[512] = "";
    int rc = gw_pipeline_parse(j, NULL, &p, err, sizeof(err));
    json_decref(j);
    cr_assert_eq(rc, SQ_BAD_CONFIG, "%s: rc %d (%s)", txt, rc, err);
    cr_assert_null(p);
    cr_assert(strncmp(err, field, strlen(field)) == 0, "want %s, got: %s", field, err);
}

#define CROPS "\"boxes\": \"b\", \"scores\": \"s\""

Test(pipeline, a_spec_parses_in_order_with_defaults)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"faces\", \"slo_ms\": 300, \"stages\": ["
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}},"
        "{\"id\": \"det\", \"model\": \"d\"}]}");
    cr_assert_eq(p->nstages, 2);
    cr_assert_eq(p->stages[0].parent, 1);
    cr_assert_eq(p->stages[1].parent, -1);
    cr_assert_eq(p->order[0], 1, "the detector first");
    cr_assert_eq(p->order[1], 0);
    cr_assert_eq(p->stages[1].nchildren, 1);
    cr_assert_eq(p->stages[0].top_k, GW_PIPE_DEFAULT_TOP_K);
    /* The even split until a DP split is made: 150 + 150. */
    double cum[GW_PIPE_MAX_STAGES];
    gw_pipeline_deadlines(p, cum);
    cr_assert_float_eq(cum[1], 150, 1e-9);
    cr_assert_float_eq(cum[0], 300, 1e-9);
    /* The normalized spec parses to the same pipeline. */
    char err[512];
    gw_pipeline_t *q = NULL;
    cr_assert_eq(gw_pipeline_parse(p->spec, NULL, &q, err, sizeof(err)), 0, "%s", err);
    cr_assert(json_equal(p->spec, q->spec));
    gw_pipeline_unref(q);
    gw_pipeline_unref(p);
}

Test(pipeline, bad_specs_name_the_field)
{
    parse_bad("{\"slo_ms\": 3, \"stages\": [{\"id\": \"a\", \"model\": \"m\"}]}", "name");
    parse_bad("{\"name\": \"x\", \"slo_ms\": 0, \"stages\": [{\"id\": \"a\", \"model\": \"m\"}]}",
              "slo_ms");
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": []}", "stages");
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": [{\"model\": \"m\"}]}", "stages[0].id");
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": [{\"id\": \"a\"}]}", "stages[0].model");
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": [{\"id\": \"a\", \"model\": \"m\", "
              "\"colour\": 1}]}",
              "stages[0].colour");
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": [{\"id\": \"a\", \"model\": \"m\"}, "
              "{\"id\": \"a\", \"model\": \"n\"}]}",
              "stages[1].id");
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": [{\"id\": \"a\", \"model\": \"m\", "
              "\"crops_of\": {\"stage\": \"zz\", " CROPS "}}]}",
              "stages[0].crops_of.stage");
    /* A cycle: a crops b's detections, b crops a's. */
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": ["
              "{\"id\": \"a\", \"model\": \"m\", \"crops_of\": {\"stage\": \"b\", " CROPS "}},"
              "{\"id\": \"b\", \"model\": \"n\", \"crops_of\": {\"stage\": \"a\", " CROPS "}}]}",
              "stages[0].crops_of.stage");
    /* crops_of's own fields: gw_crops_spec_parse, with this path. */
    parse_bad("{\"name\": \"x\", \"slo_ms\": 9, \"stages\": [{\"id\": \"d\", \"model\": \"m\"}, "
              "{\"id\": \"a\", \"model\": \"m\", \"crops_of\": {\"stage\": \"d\", " CROPS
              ", \"nms_iou\": 7}}]}",
              "stages[1].crops_of.nms_iou");
}

Test(pipeline, gamma_is_an_average_of_crops_per_parent_item)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    /* 3, 5, 3, 5, ...: a mean of 4. */
    for (int i = 0; i < 200; i++)
        gw_pipeline_fanout(p, 1, i % 2 ? 5 : 3);
    cr_assert(fabs(p->gamma[1] - 4) < 0.2, "gamma %f", p->gamma[1]);
    cr_assert(p->resplit_wanted, "gamma moved from 1 to 4: a split is due");
    cr_assert(gw_pipeline_resplit_due(p, 1, 1000000000));
    gw_pipeline_unref(p);
}

/* A gamma of 0.1 measured frame by frame wanders (an EWMA over about 100
 * frames: by about a fifth of its value, further at times): that is noise,
 * and the split stays; a real move to 0.5 is not. */
Test(pipeline, a_split_does_not_follow_the_noise_of_a_small_gamma)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    pl_profile_t x, y;
    pl_profile_init_linear(&x, 4000, 20000, 64);
    pl_profile_init_linear(&y, 2000, 8000, 64);
    const pl_profile_t *prof[2] = {&x, &y};
    /* One crop in every tenth frame, at random: Poisson-like 0.1. */
    uint64_t h = 42;
    for (int i = 0; i < 400; i++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        gw_pipeline_fanout(p, 1, (h >> 33) % 10 == 0);
    }
    gw_pipeline_resplit(p, prof, 0, 1, 0, 1);
    double split_for = p->split_gamma[1];
    cr_assert(fabs(split_for - 0.1) < 0.1, "the split follows 1 -> 0.1: %f", split_for);
    int resplits = 0, moved = 0;
    double budget = p->budget_ms[1];
    for (int i = 0; i < 20000; i++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        gw_pipeline_fanout(p, 1, (h >> 33) % 10 == 0);
        if (p->resplit_wanted) {
            resplits++;
            gw_pipeline_resplit(p, prof, 0, 1, 0, 2 + i);
            moved += p->budget_ms[1] != budget;
            budget = p->budget_ms[1];
        }
    }
    cr_assert_leq(resplits, 10, "%d resplits on noise", resplits);
    cr_assert_leq(moved, 10, "the budgets moved %d times", moved);
    /* A real move: every other frame has a crop. */
    for (int i = 0; i < 200; i++)
        gw_pipeline_fanout(p, 1, i % 2);
    cr_assert(p->resplit_wanted, "gamma %f, split for %f", p->gamma[1], p->split_gamma[1]);
    gw_pipeline_resplit(p, prof, 0, 1, 0, 100000000);
    cr_assert(fabs(p->split_gamma[1] - 0.5) < 0.1, "split for %f", p->split_gamma[1]);
    gw_pipeline_unref(p);
}

/* Nexus figure 17's shape: a detector X, a classifier Y on its gamma
 * crops. With gamma 8 the classifier carries 8 times the rate, and the DP
 * gives it a bigger share of the SLO than at gamma 1. */
Test(pipeline, the_dp_split_moves_with_gamma)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"stages\": [{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    pl_profile_t x, y;
    pl_profile_init_linear(&x, 4000, 20000, 64); /* SSD-like: 4 ms a frame + 20 ms */
    pl_profile_init_linear(&y, 2000, 8000, 64);  /* Inception-like */
    const pl_profile_t *prof[2] = {&x, &y};
    for (int i = 0; i < 500; i++)
        gw_pipeline_arrival(p);
    gw_pipeline_resplit(p, prof, 0, 1, 0, 1);
    /* 500 queries over a second: 500 qps, several devices' load, where the
     * split stays near the cheapest (at low load every stage gets its
     * floor and an equal share, whatever gamma). */
    for (int i = 0; i < 500; i++)
        gw_pipeline_arrival(p);
    for (int i = 0; i < 100; i++)
        gw_pipeline_fanout(p, 1, 1);
    gw_pipeline_resplit(p, prof, 0, 1, 0, 1000001);
    cr_assert(p->split_dp, "%s", p->split_why);
    double y1 = p->budget_ms[1];
    cr_assert_float_eq(p->budget_ms[0] + p->budget_ms[1], 300, 1e-6);
    for (int i = 0; i < 400; i++)
        gw_pipeline_fanout(p, 1, 8);
    cr_assert(fabs(p->gamma[1] - 8) < 0.5, "gamma %f", p->gamma[1]);
    cr_assert(gw_pipeline_resplit(p, prof, 0, 1, 0, 2000001) == 1, "the budgets changed");
    double y8 = p->budget_ms[1];
    cr_assert_gt(y8, y1, "gamma 8 gives the classifier more: %f vs %f", y8, y1);
    cr_assert_float_eq(p->cum_ms[1], 300, 1e-6);
    /* Without a profile for a stage, the even split stays, saying why. */
    const pl_profile_t *none[2] = {&x, NULL};
    gw_pipeline_resplit(p, none, 0, 1, 0, 3000001);
    cr_assert_not(p->split_dp);
    cr_assert_float_eq(p->budget_ms[1], 150, 1e-9);
    cr_assert(strstr(p->split_why, "cls") != NULL, "%s", p->split_why);
    gw_pipeline_unref(p);
}

Test(pipeline, a_spec_that_asks_for_the_even_split_keeps_it_with_profiles)
{
    gw_pipeline_t *p = parse_ok(
        "{\"name\": \"f\", \"slo_ms\": 300, \"split\": \"even\", \"stages\": ["
        "{\"id\": \"det\", \"model\": \"d\"},"
        "{\"id\": \"cls\", \"model\": \"c\", \"crops_of\": {\"stage\": \"det\", " CROPS "}}]}");
    cr_assert(p->split_even_asked);
    pl_profile_t x, y;
    pl_profile_init_linear(&x, 4000, 20000, 64);
    pl_profile_init_linear(&y, 2000, 8000, 64);
    const pl_profile_t *prof[2] = {&x, &y};
    for (int i = 0; i < 400; i++)
        gw_pipeline_fanout(p, 1, 8);
    gw_pipeline_resplit(p, prof, 0, 1, 0, 1);
    cr_assert_not(p->split_dp);
    cr_assert_float_eq(p->budget_ms[0], 150, 1e-9);
    cr_assert_float_eq(p->budget_ms[1], 150, 1e-9);
    cr_assert(strstr(p->split_why, "even") != NULL, "%s", p->split_why);
    json_t *j = gw_pipeline_json(p);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "spec"), "split")),
                     "even");
    json_decref(j);
    gw_pipeline_unref(p);
    parse_bad("{\"name\": \"f\", \"slo_ms\": 300, \"split\": \"half\", \"stages\": "
              "[{\"id\": \"s\", \"model\": \"m\"}]}",
              "split");
}

Test(pipeline, the_registry_finds_replaces_and_removes_by_name)
{
    gw_pipes_t *ps = gw_pipes_new();
    const char *names[] = {"b", "a", "c"};
    for (int i = 0; i < 3; i++) {
        char txt[256];
        snprintf(
            txt, sizeof(txt),
            "{\"name\": \"%s\", \"slo_ms\": 9, \"stages\": [{\"id\": \"s\", \"model\": \"m\"}]}",
            names[i]);
        gw_pipes_put(ps, parse_ok(txt));
    }
    int n;
    gw_pipeline_t **all = gw_pipes_all(ps, &n);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(all[0]->name, "a");
    cr_assert_str_eq(all[2]->name, "c");
    for (int i = 0; i < n; i++)
        gw_pipeline_unref(all[i]);
    free(all);
    gw_pipeline_t *b = gw_pipes_get(ps, "b");
    cr_assert_not_null(b);
    cr_assert(gw_pipes_remove(ps, "b"));
    cr_assert_not(gw_pipes_remove(ps, "b"));
    cr_assert_null(gw_pipes_get(ps, "b"));
    cr_assert_str_eq(b->name, "b", "a reference outlives the removal");
    gw_pipeline_unref(b);
    gw_pipes_free(ps);
}
