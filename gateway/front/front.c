/* A frontend's thread (gw_front.h): its tick (heartbeat, rejoining,
 * FE_METRICS, items stuck past their deadline), start, stop and free. */
#include "front_int.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>

/* ---- the tick, start and stop --------------------------------------------------- */

/* Items held this long past their deadline get no answer from the
 * cluster any more: answered here (none should be). */
#define STUCK_US 10000000

static void on_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_front_t *fr = data;
    (void)id;
    int64_t now = sq_now_ns();
    if (fr->stopping)
        return;
    if (fr->joined) {
        int64_t limit = (int64_t)fr->heartbeat_ms * 5 * 1000000;
        if (limit < (int64_t)2000 * 1000000)
            limit = (int64_t)2000 * 1000000;
        if (now - fr->last_heard_ns > limit)
            fr_leave(fr, "the dispatcher is silent");
    }
    if (!fr->joined && now >= fr->rejoin_at_ns && fr_join(fr) != 0) {
        fr->rejoin_at_ns = now + (int64_t)sq_backoff_next(&fr->rejoin) * 1000000;
    }
    if (fr->joined && now - fr->metrics_at_ns >= METRICS_EVERY_NS) {
        fr->metrics_at_ns = now;
        fr_push_metrics(fr);
    }
    int64_t now_us = now / 1000;
    for (uint32_t i = 0; i < fr->nslots; i++) {
        gw_item_t *it = fr->slots[i].item;
        if (it != NULL && now_us - it->ask.deadline_us > STUCK_US) {
            SQ_WARN("item held past its deadline with no answer from the cluster slot=%u", i);
            fr_answer_slot(fr, i, SQ_DEADLINE, "no answer from the cluster by the deadline");
        }
    }
    fr->tick = sq_loop_timer_at(loop, sq_now_ns() + (int64_t)TICK_MS * 1000000, on_tick, fr);
}

static void *front_thread(void *arg)
{
    gw_front_t *fr = arg;
    sq_loop_run(fr->loop);
    return NULL;
}

int gw_front_start(const gw_front_deps_t *deps, gw_front_t **out, char *err, size_t errlen)
{
    const gw_front_config_t *cfg = &deps->cfg;
    gw_front_t *fr = sq_xcalloc(1, sizeof(*fr));
    fr->sched.ops = &fr_front_sched_ops;
    fr->registry = deps->registry;
    fr->pipelines = deps->pipelines;
    fr->arena = deps->arena;
    fr->metrics = deps->metrics;
    fr->http_port = deps->http_port;
    fr->core = cfg->core;
    fr_fleet_clear(&fr->fleet);
    pthread_mutex_init(&fr->lock, NULL);
    snprintf(fr->why, sizeof(fr->why), "this frontend has not joined its dispatcher yet");
    sq_buf_init(&fr->scratch);
    sq_backoff_init(&fr->rejoin, REJOIN_MIN_MS, REJOIN_MAX_MS);
    char list[sizeof(cfg->dispatcher)];
    snprintf(list, sizeof(list), "%s", cfg->dispatcher);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok != NULL && fr->naddrs < 8;
         tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ')
            tok++;
        if (*tok != '\0')
            snprintf(fr->addrs[fr->naddrs++], sizeof(fr->addrs[0]), "%s", tok);
    }
    int rc = 0;
    if (fr->naddrs == 0) {
        snprintf(err, errlen, "--dispatcher: no address");
        rc = SQ_BAD_CONFIG;
    }
    if (rc == 0)
        rc = sq_auth_read_token(cfg->cluster_token_file, fr->token, sizeof(fr->token),
                                &fr->token_len, err, errlen);
    if (rc == 0 && cfg->cluster_tls_cert[0] != '\0')
        rc = sq_tls_new(&fr->tls, 0, cfg->cluster_tls_cert, cfg->cluster_tls_key,
                        cfg->cluster_tls_ca, err, errlen);
    if (rc == 0 && (fr->loop = sq_loop_new()) == NULL) {
        snprintf(err, errlen, "cannot create the frontend's loop");
        rc = SQ_NOMEM;
    }
    if (rc != 0) {
        sq_tls_free(fr->tls);
        sq_buf_dispose(&fr->scratch);
        free(fr);
        return rc;
    }
    *out = fr;
    fr->tick = sq_loop_timer_at(fr->loop, sq_now_ns(), on_tick, fr);
    if (pthread_create(&fr->thread, NULL, front_thread, fr) != 0) {
        snprintf(err, errlen, "cannot start the frontend's thread");
        return SQ_NOMEM;
    }
    pthread_setname_np(fr->thread, "sq-front");
    fr->started = 1;
    SQ_INFO("frontend started dispatcher=%s", cfg->dispatcher);
    return 0;
}

static void on_stop(sq_loop_t *loop, void *arg)
{
    gw_front_t *fr = arg;
    fr->stopping = 1;
    if (fr->joined)
        fr_leave(fr, "squishd is stopping");
    for (uint32_t i = 0; i < fr->nslots; i++)
        if (fr->slots[i].item != NULL)
            fr_answer_slot(fr, i, SQ_SHUTTING_DOWN, "squishd is shutting down");
    if (fr->tick != 0)
        sq_loop_timer_cancel(loop, fr->tick);
    fr->tick = 0;
    sq_loop_stop(loop);
}

void gw_front_stop(gw_front_t *fr)
{
    if (fr == NULL || !fr->started)
        return;
    sq_loop_post(fr->loop, on_stop, fr);
    pthread_join(fr->thread, NULL);
    fr->started = 0;
    /* Items submitted after the loop stopped are answered here. */
    sq_loop_run_posts(fr->loop);
}

void gw_front_free(gw_front_t *fr)
{
    if (fr == NULL)
        return;
    sq_loop_run_posts(fr->loop);
    sq_loop_free(fr->loop);
    sq_tls_free(fr->tls);
    OPENSSL_cleanse(fr->token, sizeof(fr->token));
    sq_buf_dispose(&fr->scratch);
    free(fr->slots);
    free(fr->held);
    free(fr->gone);
    fr_live_free(fr->live, fr->nlive);
    pthread_mutex_destroy(&fr->lock);
    free(fr);
}
