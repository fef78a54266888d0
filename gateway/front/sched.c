/* The frontend as this process's scheduler (gw_sched_t): the questions
 * other threads ask, answered from what the dispatcher last said. */
#include "front_int.h"

#include <stdio.h>

/* ---- for other threads ------------------------------------------------------------ */

/* The scheduling interface's questions, from what the dispatcher last
 * said (FE_STATE). */
static int sched_ready(gw_sched_t *s, char *why, size_t len)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    int ready = fr->ready;
    snprintf(why, len, "%s", fr->why);
    pthread_mutex_unlock(&fr->lock);
    return ready;
}

static int sched_held(gw_sched_t *s, int64_t key)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    int found = 0;
    for (int i = 0; i < fr->nheld && !found; i++)
        found = fr->held[i] == key;
    pthread_mutex_unlock(&fr->lock);
    return found;
}

static int sched_unloading(gw_sched_t *s, int64_t key)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    int found = 0;
    for (int i = 0; i < fr->ngone && !found; i++)
        found = fr->gone[i] == key;
    pthread_mutex_unlock(&fr->lock);
    return found;
}

static void sched_fleet(gw_sched_t *s, gw_fleet_t *out)
{
    gw_front_t *fr = (gw_front_t *)s;
    pthread_mutex_lock(&fr->lock);
    *out = fr->fleet;
    pthread_mutex_unlock(&fr->lock);
}

static int sched_serving_kind(gw_sched_t *s, const gw_model_t *m)
{
    gw_fleet_t f;
    sched_fleet(s, &f);
    return gw_fleet_serving_kind(&f, m);
}

int fr_sched_least(gw_sched_t *s, const gw_model_t *m, int kind, int n, gw_least_t *out)
{
    gw_front_t *fr = (gw_front_t *)s;
    pl_dispatch_opts_t o = fr->core;
    const pl_profile_t *p = NULL;
    pthread_mutex_lock(&fr->lock);
    for (int i = 0; i < fr->nlive && p == NULL; i++)
        if (fr->live[i].key == m->key && fr->live[i].kind == kind)
            p = &fr->live[i].profile;
    int rc = gw_sched_least_on(&o, p, m, kind, n, out);
    pthread_mutex_unlock(&fr->lock);
    return rc;
}

const gw_sched_ops_t fr_front_sched_ops = {
    .submit = fr_sched_submit,
    .withdraw = fr_sched_withdraw,
    .ready = sched_ready,
    .held = sched_held,
    .unloading = sched_unloading,
    .serving_kind = sched_serving_kind,
    .least = fr_sched_least,
    .fleet = sched_fleet,
};

gw_sched_t *gw_front_sched(gw_front_t *fr)
{
    return &fr->sched;
}

void gw_front_dispatcher_http(gw_front_t *fr, char *out, size_t len)
{
    pthread_mutex_lock(&fr->lock);
    snprintf(out, len, "%s", fr->admin);
    pthread_mutex_unlock(&fr->lock);
}
