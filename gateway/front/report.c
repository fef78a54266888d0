/* What a frontend says of itself: its traffic and metrics text, and
 * FE_METRICS to the dispatcher. */
#include "front_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- what this frontend says of itself -------------------------------------------- */

void gw_front_metrics_text(gw_front_t *fr, sq_buf_t *out)
{
    gw_front_traffic_t t;
    gw_front_traffic(fr, &t);
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

typedef struct {
    gw_metrics_t *metrics;
    gw_fe_model_stats_t *stats;
    uint32_t n, cap;
} stats_list_t;

/* A model's statistics as FE_METRICS carries them (the document is
 * json_dumps's, freed by the caller). */
static void collect_stats(gw_model_t *m, void *arg)
{
    stats_list_t *l = arg;
    json_t *st = gw_metrics_model_stats(l->metrics, m);
    char *doc = json_dumps(st, JSON_COMPACT);
    json_decref(st);
    if (doc == NULL)
        return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->stats = sq_xrealloc(l->stats, sizeof(*l->stats) * l->cap);
    }
    gw_fe_model_stats_t *e = &l->stats[l->n++];
    *e = (gw_fe_model_stats_t){.stats = {.p = doc, .len = (uint32_t)strlen(doc)}};
    snprintf(e->name, sizeof(e->name), "%s", m->name);
    snprintf(e->version, sizeof(e->version), "%d", m->version);
}

/* FE_METRICS: this frontend's exposition and model statistics, for the
 * dispatcher's one view of the cluster (every METRICS_EVERY_NS). */
void fr_push_metrics(gw_front_t *fr)
{
    sq_buf_t text;
    sq_buf_init(&text);
    gw_metrics_write(fr->metrics, &text);
    gw_front_metrics_text(fr, &text);
    stats_list_t stats = {.metrics = fr->metrics};
    gw_registry_foreach(fr->registry, collect_stats, &stats);
    int np = 0;
    gw_pipeline_t **ps = gw_pipes_all(fr->pipelines, &np);
    gw_fe_pipe_report_t *reports = np > 0 ? sq_xcalloc((size_t)np, sizeof(*reports)) : NULL;
    uint32_t nreports = 0;
    for (int i = 0; i < np; i++) {
        json_t *r = gw_pipeline_report(ps[i]);
        char *doc = r != NULL ? json_dumps(r, JSON_COMPACT) : NULL;
        json_decref(r);
        if (doc != NULL) {
            gw_fe_pipe_report_t *e = &reports[nreports++];
            snprintf(e->name, sizeof(e->name), "%s", ps[i]->name);
            e->report = (gw_fe_doc_t){.p = doc, .len = (uint32_t)strlen(doc)};
        }
        gw_pipeline_unref(ps[i]);
    }
    free(ps);
    gw_fe_metrics_t m = {.text = {.p = (const char *)text.data, .len = (uint32_t)text.len},
                         .nstats = stats.n,
                         .stats = stats.stats,
                         .nreports = nreports,
                         .reports = reports};
    fr->scratch.len = 0;
    gw_fe_metrics_encode(&fr->scratch, &m);
    if (fr->scratch.len < SQ_IPC_MAX_PAYLOAD)
        fr_send_dispatcher(fr, SQ_MSG_FE_METRICS, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
    for (uint32_t i = 0; i < stats.n; i++)
        free((char *)stats.stats[i].stats.p);
    for (uint32_t i = 0; i < nreports; i++)
        free((char *)reports[i].report.p);
    free(stats.stats);
    free(reports);
    sq_buf_dispose(&text);
}

void gw_front_traffic(gw_front_t *fr, gw_front_traffic_t *out)
{
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
