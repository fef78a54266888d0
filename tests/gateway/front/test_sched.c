/* gateway/front/sched.c: the frontend's least latency is counted on the
 * profile the dispatcher plans with (its live-corrected one, from
 * FE_STATE) and on the measured one only where none was published, as
 * the dispatcher's own gw_dispatch_least does. */
#include "front_test.h"

#include <criterion/criterion.h>

static gw_model_t *model(int64_t key)
{
    gw_model_t *m = sq_xcalloc(1, sizeof(*m));
    m->key = key;
    m->max_batch = 8;
    m->has_profile[SQ_DEV_CPU] = 1;
    pl_profile_init_linear(&m->profile[SQ_DEV_CPU], 100, 900, 8);
    return m;
}

Test(sched, least_latency_is_on_the_live_profile_when_published)
{
    front_fixture_t x;
    front_fixture_init(&x);
    gw_model_t *m = model(7);
    gw_sched_t *s = &x.fr->sched;
    gw_least_t measured, live;
    cr_assert_eq(s->ops->least(s, m, SQ_DEV_CPU, 3, &measured), 0);
    cr_assert_gt(measured.run_us, 0);
    /* The dispatcher found the model twice as slow as measured. */
    gw_fe_live_t l = {.key = 7,
                      .kind = SQ_DEV_CPU,
                      .linear = 1,
                      .alpha_us = 200,
                      .beta_us = 1800,
                      .max_batch = 8};
    gw_fe_state_t st = {.nlive = 1, .live = &l};
    fr_take_state(x.fr, &st, 0);
    cr_assert_eq(s->ops->least(s, m, SQ_DEV_CPU, 3, &live), 0);
    cr_assert_eq(live.run_us, 2 * measured.run_us, "live %lld measured %lld",
                 (long long)live.run_us, (long long)measured.run_us);
    /* Another model, or another kind, keeps its measured profile. */
    gw_model_t *other = model(8);
    gw_least_t o;
    cr_assert_eq(s->ops->least(s, other, SQ_DEV_CPU, 3, &o), 0);
    cr_assert_eq(o.run_us, measured.run_us);
    cr_assert_eq(s->ops->least(s, m, SQ_DEV_CUDA, 3, &o), -1); /* no profile of it */
    /* A state without it: back to the measured one. */
    gw_fe_state_t none = {0};
    fr_take_state(x.fr, &none, 0);
    cr_assert_eq(s->ops->least(s, m, SQ_DEV_CPU, 3, &o), 0);
    cr_assert_eq(o.run_us, measured.run_us);
    pl_profile_dispose(&m->profile[SQ_DEV_CPU]);
    pl_profile_dispose(&other->profile[SQ_DEV_CPU]);
    free(m);
    free(other);
    front_fixture_dispose(&x);
}
