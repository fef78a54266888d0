/* What a frontend says of itself: its traffic and metrics text, and
 * FE_METRICS to the dispatcher. */
#include "front_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- what this frontend says of itself -------------------------------------------- */

void gw_front_metrics_text(gw_server_t *srv, sq_buf_t *out)
{
    gw_front_traffic_t t;
    gw_front_traffic(srv, &t);
    char buf[1024];
    int n =
        snprintf(buf, sizeof(buf),
                 "# HELP squish_frontend_joined Whether this frontend is joined to a dispatcher.\n"
                 "# TYPE squish_frontend_joined gauge\nsquish_frontend_joined %d\n"
                 "# HELP squish_frontend_offered_items_total Items this frontend offered its "
                 "dispatcher.\n# TYPE squish_frontend_offered_items_total counter\n"
                 "squish_frontend_offered_items_total %llu\n"
                 "# HELP squish_frontend_bytes_total Bytes on this frontend's links (frame headers "
                 "included): link=dispatcher carries metadata, link=workers the rows and outputs, "
                 "link=shared_memory the rows workers on this host read from its arena.\n"
                 "# TYPE squish_frontend_bytes_total counter\n"
                 "squish_frontend_bytes_total{link=\"dispatcher\",direction=\"in\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"dispatcher\",direction=\"out\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"workers\",direction=\"in\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"workers\",direction=\"out\"} %llu\n"
                 "squish_frontend_bytes_total{link=\"shared_memory\",direction=\"out\"} %llu\n",
                 t.joined, (unsigned long long)t.items, (unsigned long long)t.link_in,
                 (unsigned long long)t.link_out, (unsigned long long)t.data_in,
                 (unsigned long long)t.data_out, (unsigned long long)t.data_shm);
    sq_buf_put(out, buf, (size_t)n);
}

static void collect_stats(gw_model_t *m, void *arg)
{
    void **a = arg;
    json_array_append_new(a[0], gw_metrics_model_stats(((gw_server_t *)a[1])->metrics, m));
}

/* FE_METRICS: this frontend's exposition and model statistics, for the
 * dispatcher's one view of the cluster (every METRICS_EVERY_NS). */
void fr_push_metrics(gw_front_t *fr)
{
    gw_server_t *srv = fr->srv;
    sq_buf_t text;
    sq_buf_init(&text);
    gw_metrics_write(srv->metrics, &text);
    gw_front_metrics_text(srv, &text);
    json_t *stats = json_array();
    void *arg[2] = {stats, srv};
    gw_registry_foreach(srv->registry, collect_stats, arg);
    json_t *reports = json_object();
    int np = 0;
    gw_pipeline_t **ps = gw_pipes_all(srv->pipelines, &np);
    for (int i = 0; i < np; i++) {
        json_t *r = gw_pipeline_report(ps[i]);
        if (r != NULL)
            json_object_set_new(reports, ps[i]->name, r);
        gw_pipeline_unref(ps[i]);
    }
    free(ps);
    json_t *m = json_pack("{s:s%, s:o, s:o}", "metrics", text.len ? (const char *)text.data : "",
                          text.len, "stats", stats, "pipelines", reports);
    char *payload = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    sq_buf_dispose(&text);
    if (payload != NULL && strlen(payload) < SQ_IPC_MAX_PAYLOAD)
        fr_send_dispatcher(fr, SQ_MSG_FE_METRICS, 0, payload, (uint32_t)strlen(payload));
    free(payload);
}

void gw_front_traffic(gw_server_t *srv, gw_front_traffic_t *out)
{
    gw_front_t *fr = srv->front;
    out->link_in = atomic_load(&fr->link_in);
    out->link_out = atomic_load(&fr->link_out);
    out->data_in = atomic_load(&fr->data_in);
    out->data_out = atomic_load(&fr->data_out);
    out->data_shm = atomic_load(&fr->data_shm);
    out->items = atomic_load(&fr->offered);
    pthread_mutex_lock(&fr->lock);
    out->joined = fr->admin[0] != '\0';
    pthread_mutex_unlock(&fr->lock);
}
