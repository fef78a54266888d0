/* gateway/front/catalog.c: what the dispatcher says becomes what the
 * frontend serves: FE_CATALOG's models the registry's (those it no longer
 * lists go, a record that does not match its key is skipped), FE_STATE's
 * fleet, readiness, held models and live profiles. */
#include "front_test.h"

#include <criterion/criterion.h>
#include <string.h>

#define REC(id, name, ver)                                                                         \
    "{\"id\":" #id ",\"name\":\"" name "\",\"version\":" #ver ",\"format\":\"emulated\","          \
    "\"status\":\"ready\",\"input\":{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[1,3,8,8]},"   \
    "\"outputs\":[{\"name\":\"y\",\"shape\":[1,10]}]}"

static gw_fe_doc_t doc(const char *s)
{
    return (gw_fe_doc_t){.p = s, .len = (uint32_t)strlen(s)};
}

static int has(gw_registry_t *reg, int64_t key)
{
    gw_model_t *m = gw_registry_get(reg, key);
    if (m == NULL)
        return 0;
    gw_model_unref(m);
    return 1;
}

Test(catalog, the_registry_becomes_the_catalogs)
{
    front_fixture_t x;
    front_fixture_init(&x);
    gw_fe_model_t models[2] = {{.key = 7, .record = doc(REC(7, "a", 1))},
                               {.key = 9, .record = doc(REC(9, "b", 2))}};
    gw_fe_catalog_t cat = {.n = 2, .models = models};
    cr_assert_eq(fr_take_catalog(x.srv.registry, &cat), 0);
    cr_assert(has(x.srv.registry, 7));
    cr_assert(has(x.srv.registry, 9));
    gw_model_t *m = gw_registry_get(x.srv.registry, 9);
    cr_assert_str_eq(m->name, "b");
    cr_assert_eq(m->version, 2);
    cr_assert_eq(m->out_elems, 10);
    gw_model_unref(m);
    /* The next catalog lists only b: a goes. */
    cat = (gw_fe_catalog_t){.n = 1, .models = &models[1]};
    cr_assert_eq(fr_take_catalog(x.srv.registry, &cat), 0);
    cr_assert_not(has(x.srv.registry, 7));
    cr_assert(has(x.srv.registry, 9));
    front_fixture_dispose(&x);
}

Test(catalog, a_record_that_is_not_its_keys_is_skipped)
{
    front_fixture_t x;
    front_fixture_init(&x);
    gw_fe_model_t models[3] = {{.key = 8, .record = doc(REC(7, "a", 1))}, /* key differs */
                               {.key = 5, .record = doc("{\"id\":5")},    /* not JSON */
                               {.key = 9, .record = doc(REC(9, "b", 2))}};
    gw_fe_catalog_t cat = {.n = 3, .models = models};
    cr_assert_eq(fr_take_catalog(x.srv.registry, &cat), 2);
    cr_assert_not(has(x.srv.registry, 7));
    cr_assert_not(has(x.srv.registry, 8));
    cr_assert_not(has(x.srv.registry, 5));
    cr_assert(has(x.srv.registry, 9));
    front_fixture_dispose(&x);
}

static gw_fe_profile_row_t ROWS[2] = {{1, 1000, 10}, {4, 3000, 30}};
static gw_fe_profile_row_t DUP_ROWS[2] = {{2, 1000, 10}, {2, 3000, 30}};

Test(catalog, the_state_sets_fleet_readiness_held_and_live_profiles)
{
    front_fixture_t x;
    front_fixture_init(&x);
    int64_t held[2] = {7, 9}, gone[1] = {4};
    gw_fe_live_t live[3] = {
        {.key = 7, .kind = SQ_DEV_CPU, .max_batch = 4, .nrows = 2, .rows = ROWS},
        {.key = 9, .kind = SQ_DEV_EMU, .linear = 1, .alpha_us = 50, .beta_us = 500, .max_batch = 8},
        {.key = 3, .kind = SQ_DEV_CPU, .max_batch = 2, .nrows = 2, .rows = DUP_ROWS}};
    gw_fe_state_t st = {.workers_up = 2,
                        .up = {1, 0, 1},
                        .coming = {0, 1, 0},
                        .back_in_us = {-1, 5000, -1},
                        .nheld = 2,
                        .held = held,
                        .ngone = 1,
                        .gone = gone,
                        .nlive = 3,
                        .live = live};
    fr_take_state(x.fr, &st, 1000000);
    gw_sched_t *s = &x.fr->sched;
    char why[256];
    cr_assert_eq(s->ops->ready(s, why, sizeof(why)), 1);
    cr_assert(s->ops->held(s, 7));
    cr_assert(s->ops->held(s, 9));
    cr_assert_not(s->ops->held(s, 4));
    cr_assert(s->ops->unloading(s, 4));
    cr_assert_not(s->ops->unloading(s, 7));
    gw_fleet_t f;
    s->ops->fleet(s, &f);
    cr_assert_eq(f.workers_up, 2);
    cr_assert_eq(f.up[SQ_DEV_CPU], 1);
    cr_assert_eq(f.coming[SQ_DEV_CUDA], 1);
    cr_assert_eq(f.back_at_us[SQ_DEV_CUDA], 1005000);
    cr_assert_eq(f.back_at_us[SQ_DEV_CPU], INT64_MAX);
    /* The live profiles: the table and the linear one; the table with a
     * batch listed twice does not parse and is left out. */
    cr_assert_eq(x.fr->nlive, 2);
    cr_assert_eq(x.fr->live[0].key, 7);
    cr_assert_eq(x.fr->live[0].profile.nrows, 2);
    cr_assert_eq(x.fr->live[0].profile.max_batch, 4);
    cr_assert_float_eq(x.fr->live[0].profile.rows[1].mean_us, 3000, 1e-9);
    cr_assert_eq(x.fr->live[1].key, 9);
    cr_assert(x.fr->live[1].profile.linear);
    cr_assert_float_eq(x.fr->live[1].profile.alpha_us, 50, 1e-9);
    /* Not ready: why is said; the live profiles of the last state go. */
    gw_fe_state_t st2 = {.nlive = 0};
    snprintf(st2.why, sizeof(st2.why), "model a: no worker");
    fr_take_state(x.fr, &st2, 2000000);
    cr_assert_eq(s->ops->ready(s, why, sizeof(why)), 0);
    cr_assert_str_eq(why, "model a: no worker");
    cr_assert_eq(x.fr->nlive, 0);
    cr_assert_not(s->ops->held(s, 7));
    front_fixture_dispose(&x);
}
