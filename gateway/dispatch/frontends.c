/* The dispatcher's frontends (squishd --role frontend, issue 25): processes
 * that take the clients' requests and hold their inputs, joined on the
 * cluster listener. Their items enter the core as this process's own do,
 * by metadata alone (FE_ITEMS); a batch's rows held by frontends are
 * assigned to them (batches.c: FE_ASSIGN), each sends its rows straight to
 * the worker and takes the outputs back from it. What goes back from here
 * is small: a failure (FE_FAIL), and what a frontend needs to serve, the
 * catalog (the registry's records, when its generation moves) and the
 * state (readiness and the workers up per kind, when it changes). */
#include "batcher_int.h"

#include "gw_codec_fe.h"

#include <stdlib.h>
#include <string.h>

/* Slot indexes a frontend may use (the low 32 bits of its slot ids): its
 * handle table's size, bounded so that a frontend cannot make this one
 * allocate without limit. */
#define FE_MAX_SLOTS (1u << 22)
#define FE_TICK_MS 50

void gw_dispatch_frontend_traffic(gw_dispatch_t *ds, gw_frontend_traffic_t *out)
{
    *out = (gw_frontend_traffic_t){0};
    if (ds == NULL)
        return;
    out->bytes_in = atomic_load(&ds->fe.fe_bytes_in);
    out->bytes_out = atomic_load(&ds->fe.fe_bytes_out);
    out->items = atomic_load(&ds->fe.fe_items);
    out->connected = atomic_load(&ds->fe.fe_connected);
}

static void fail_slot(gw_dispatch_t *ds, int fe, uint64_t slot, int rc, const char *detail)
{
    sq_fe_fail_t fail = {.code = rc};
    snprintf(fail.detail, sizeof(fail.detail), "%s", detail);
    sq_buf_t b;
    sq_buf_init(&b);
    sq_fe_fail_encode(&b, &fail);
    ds_fe_send(ds, fe, SQ_MSG_FE_FAIL, slot, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
}

/* ---- the catalog and the state -------------------------------------------- */

typedef struct {
    gw_fe_model_t *models;
    char **docs;
    uint32_t n, cap;
} catalog_list_t;

static void collect_record(gw_model_t *m, void *arg)
{
    catalog_list_t *l = arg;
    char *doc = m->record != NULL ? json_dumps(m->record, JSON_COMPACT) : NULL;
    if (doc == NULL)
        return;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->models = sq_xrealloc(l->models, sizeof(*l->models) * l->cap);
        l->docs = sq_xrealloc(l->docs, sizeof(*l->docs) * l->cap);
    }
    l->docs[l->n] = doc;
    l->models[l->n++] =
        (gw_fe_model_t){.key = m->key, .record = {.p = doc, .len = (uint32_t)strlen(doc)}};
}

/* FE_CATALOG: every model's record. */
static void catalog_encode(gw_dispatch_t *ds, sq_buf_t *out)
{
    catalog_list_t l = {0};
    gw_registry_foreach(ds->registry, collect_record, &l);
    gw_fe_catalog_t cat = {.n = l.n, .models = l.models};
    gw_fe_catalog_encode(out, &cat);
    for (uint32_t i = 0; i < l.n; i++)
        free(l.docs[i]);
    free(l.docs);
    free(l.models);
}

/* FE_STATE: what a frontend's readiness and admission read (the fleet,
 * and the dispatcher's last look at readiness), and the pipelines with
 * the split this dispatcher made for them (a frontend runs their queries
 * at these budgets). */
static void state_encode(gw_dispatch_t *ds, sq_buf_t *out)
{
    int64_t now = sq_now_us();
    gw_fe_state_t st = {.workers_up = ds->pub.fleet.workers_up,
                        .db_ready = (uint8_t)(atomic_load(ds->db_ready) != 0),
                        .stopping = (uint8_t)(ds->aborted != 0),
                        .nheld = (uint32_t)ds->pub.nheld,
                        .held = ds->pub.held_keys,
                        .ngone = (uint32_t)ds->pub.ngone,
                        .gone = ds->pub.gone_keys};
    snprintf(st.why, sizeof(st.why), "%s", ds->pub.ready_why);
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++) {
        st.up[k] = ds->pub.fleet.up[k];
        st.coming[k] = ds->pub.fleet.coming[k];
        int64_t at = ds->pub.fleet.back_at_us[k];
        st.back_in_us[k] = at == INT64_MAX ? -1 : at > now ? at - now : 0;
    }
    int np = 0;
    gw_pipeline_t **ps = gw_pipes_all(ds->pipelines, &np);
    char **specs = np > 0 ? sq_xcalloc((size_t)np, sizeof(*specs)) : NULL;
    st.pipes = np > 0 ? sq_xcalloc((size_t)np, sizeof(*st.pipes)) : NULL;
    for (int i = 0; i < np; i++) {
        specs[i] = json_dumps(ps[i]->spec, JSON_COMPACT);
        if (specs[i] == NULL)
            continue;
        gw_fe_pipe_t *e = &st.pipes[st.npipes++];
        double cum[GW_PIPE_MAX_STAGES];
        gw_pipeline_deadlines(ps[i], cum);
        e->spec = (gw_fe_doc_t){.p = specs[i], .len = (uint32_t)strlen(specs[i])};
        e->unloaded = (uint8_t)(atomic_load(&ps[i]->unloaded) != 0);
        e->nstages = (uint32_t)ps[i]->nstages;
        for (int k = 0; k < ps[i]->nstages; k++) {
            e->budget_ms[k] = gw_pipeline_budget_ms(ps[i], k);
            e->cum_ms[k] = cum[k];
        }
    }
    /* The live-corrected profiles this dispatcher plans with: a
     * frontend's least latency (admission) is counted on them too. */
    pthread_mutex_lock(&ds->batch.live_lock);
    int nlive = ds->batch.nlive_pub;
    st.live = nlive > 0 ? sq_xcalloc((size_t)nlive, sizeof(*st.live)) : NULL;
    for (int i = 0; i < nlive; i++) {
        const ds_live_pub_t *l = &ds->batch.live_pub[i];
        const pl_profile_t *p = &l->profile;
        if (l->kind < 0 || l->kind >= SQ_DEV_KIND_COUNT || p->max_batch < 1 ||
            p->max_batch > GW_FE_MAX_PROFILE_ROWS || p->nrows > GW_FE_MAX_PROFILE_ROWS ||
            (!p->linear && p->nrows < 1))
            continue;
        gw_fe_live_t *e = &st.live[st.nlive++];
        *e = (gw_fe_live_t){.key = l->key,
                            .kind = (uint8_t)l->kind,
                            .linear = (uint8_t)(p->linear != 0),
                            .alpha_us = p->alpha_us,
                            .beta_us = p->beta_us,
                            .max_batch = p->max_batch,
                            .memory_bytes = p->memory_bytes,
                            .memory_per_item_bytes = p->memory_per_item_bytes,
                            .nrows = p->linear ? 0 : (uint32_t)p->nrows};
        e->rows = e->nrows > 0 ? sq_xmalloc(sizeof(*e->rows) * e->nrows) : NULL;
        for (uint32_t r = 0; r < e->nrows; r++)
            e->rows[r] = (gw_fe_profile_row_t){.batch = p->rows[r].batch,
                                               .mean_us = p->rows[r].mean_us,
                                               .std_us = p->rows[r].std_us};
    }
    pthread_mutex_unlock(&ds->batch.live_lock);
    gw_fe_state_encode(out, &st);
    for (uint32_t i = 0; i < st.nlive; i++)
        free(st.live[i].rows);
    free(st.live);
    for (int i = 0; i < np; i++) {
        free(specs[i]);
        gw_pipeline_unref(ps[i]);
    }
    free(specs);
    free(st.pipes);
    free(ps);
}

static void send_frame(gw_dispatch_t *ds, int fe, uint16_t type, const sq_buf_t *b)
{
    if (b->len > SQ_IPC_MAX_PAYLOAD) {
        SQ_ERROR("frontend frame too large type=%s bytes=%zu", sq_msg_name(type), b->len);
        return;
    }
    ds_fe_send(ds, fe, type, 0, b->data, (uint32_t)b->len);
}

/* ds_frontend_t.state_sent holds the FE_STATE last sent as a u32 length
 * and then its bytes (a payload has NULs). */
static int state_same(const char *sent, const sq_buf_t *b)
{
    uint32_t n;
    if (sent == NULL)
        return 0;
    memcpy(&n, sent, sizeof(n));
    return n == b->len && memcmp(sent + sizeof(n), b->data, n) == 0;
}

static char *state_copy(const sq_buf_t *b)
{
    uint32_t n = (uint32_t)b->len;
    char *s = sq_xmalloc(sizeof(n) + n);
    memcpy(s, &n, sizeof(n));
    memcpy(s + sizeof(n), b->data, n);
    return s;
}

static void on_fe_tick(sq_loop_t *loop, uint64_t id, void *data);

/* Sends each frontend what changed: the catalog when the registry moved,
 * the state when it differs from what it was sent last. */
static void push_changes(gw_dispatch_t *ds)
{
    /* Not before the registry holds the DB's models (a standby that just
     * took over): an empty catalog would make frontends answer 404. */
    if (!atomic_load(ds->db_ready))
        return;
    unsigned long gen = gw_registry_generation(ds->registry);
    sq_buf_t catalog, state;
    sq_buf_init(&catalog);
    sq_buf_init(&state);
    int have_catalog = 0, have_state = 0;
    for (int i = 0; i < ds->fe.nfrontends; i++) {
        ds_frontend_t *f = ds_frontend_at(ds, i);
        if (f == NULL)
            continue;
        if (f->catalog_gen != gen + 1) {
            if (!have_catalog)
                catalog_encode(ds, &catalog);
            have_catalog = 1;
            send_frame(ds, f->id, SQ_MSG_FE_CATALOG, &catalog);
            f->catalog_gen = gen + 1;
        }
        if (!have_state)
            state_encode(ds, &state);
        have_state = 1;
        if (!state_same(f->state_sent, &state)) {
            send_frame(ds, f->id, SQ_MSG_FE_STATE, &state);
            free(f->state_sent);
            f->state_sent = state_copy(&state);
        }
    }
    sq_buf_dispose(&catalog);
    sq_buf_dispose(&state);
}

static void on_fe_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    gw_dispatch_t *ds = data;
    (void)id;
    ds->fe.fe_timer = 0;
    push_changes(ds);
    if (atomic_load(&ds->fe.fe_connected) > 0)
        ds->fe.fe_timer =
            sq_loop_timer_at(loop, sq_now_ns() + (int64_t)FE_TICK_MS * 1000000, on_fe_tick, ds);
}

/* ---- the link's events ------------------------------------------------------- */

void ds_fe_up(gw_dispatch_t *ds, int fe, const char *name, const char *addr)
{
    if (fe < 0)
        return;
    pthread_mutex_lock(&ds->fe.fe_lock);
    if (fe >= ds->fe.nfrontends) {
        ds->fe.frontends =
            sq_xrealloc(ds->fe.frontends, sizeof(*ds->fe.frontends) * (size_t)(fe + 1));
        for (int i = ds->fe.nfrontends; i <= fe; i++)
            ds->fe.frontends[i] = NULL;
        ds->fe.nfrontends = fe + 1;
    }
    ds_frontend_t *f = ds->fe.frontends[fe];
    if (f == NULL)
        f = ds->fe.frontends[fe] = sq_xcalloc(1, sizeof(*f));
    f->id = fe;
    f->up = 1;
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(f->addr, sizeof(f->addr), "%s", addr);
    pthread_mutex_unlock(&ds->fe.fe_lock);
    atomic_fetch_add(&ds->fe.fe_connected, 1);
    push_changes(ds);
    if (ds->fe.fe_timer == 0)
        ds->fe.fe_timer =
            sq_loop_timer_at(ds->loop, sq_now_ns() + (int64_t)FE_TICK_MS * 1000000, on_fe_tick, ds);
}

/* FE_ITEMS: each item becomes the dispatcher's record of it and enters its
 * session; a clump (clump_next) enters as one arrival. */
static int on_items(gw_dispatch_t *ds, ds_frontend_t *f, const sq_frame_t *fr)
{
    static _Thread_local sq_fe_item_t in[SQ_MAX_FE_ITEMS];
    uint32_t n = 0;
    if (sq_fe_items_decode(fr, in, &n) != 0)
        return -1;
    int64_t now = sq_now_us();
    gw_item_t *head = NULL, **tail = &head;
    for (uint32_t i = 0; i < n; i++) {
        const sq_fe_item_t *e = &in[i];
        uint32_t idx = (uint32_t)e->slot;
        if (idx >= FE_MAX_SLOTS)
            return -1;
        if (idx >= f->capitems) {
            uint32_t cap = f->capitems ? f->capitems : 256;
            while (cap <= idx)
                cap *= 2;
            f->items = sq_xrealloc(f->items, sizeof(*f->items) * cap);
            memset(f->items + f->capitems, 0, sizeof(*f->items) * (cap - f->capitems));
            f->capitems = cap;
        }
        if (ds_fe_chain_link(f, e->slot, NULL) != NULL) {
            SQ_WARN("frontend id=%d offered slot %llu while its item is held", f->id,
                    (unsigned long long)e->slot);
            return -1;
        }
        gw_model_t *m = gw_registry_get(ds->registry, e->model_key);
        if (m == NULL) {
            fail_slot(ds, f->id, e->slot, SQ_MODEL_NOT_FOUND,
                      "the model was deleted while the request was on its way");
            continue;
        }
        ds_fe_item_t *x = sq_xcalloc(1, sizeof(*x));
        gw_item_t *it = &x->item;
        x->ds = ds;
        it->ask.model = m;
        it->ask.slo_ms = e->slo_ms;
        it->ask.arrival_us = now - e->age_us;
        it->ask.deadline_us = now + e->budget_us;
        it->owner.finish = ds_fe_finish;
        it->input.in_off = -1;
        it->ask.input_kind = e->input_kind;
        it->ask.priority = e->priority;
        it->ask.best_effort = e->best_effort;
        it->owner.abandoned = &x->abandoned;
        it->pipe.stage = e->stage;
        it->pipe.query_slo_ms = e->query_slo_ms;
        /* A pipeline query's item: counted toward its stage (the record
         * holds a reference, as a query does). */
        if (e->stage >= 0 &&
            (it->pipe.pipeline = gw_pipes_get(ds->pipelines, e->pipeline)) != NULL &&
            e->stage >= it->pipe.pipeline->nstages) {
            gw_pipeline_unref(it->pipe.pipeline);
            it->pipe.pipeline = NULL;
        }
        it->input.src = (uint32_t)f->id + 1;
        it->input.fe_slot = e->slot;
        x->next_in_slot = f->items[idx];
        f->items[idx] = x;
        *tail = it;
        tail = &it->owner.clump_next;
        if (!e->clump_next) {
            ds_submit_chain(ds, head);
            head = NULL;
            tail = &head;
        }
    }
    if (head != NULL)
        ds_submit_chain(ds, head);
    atomic_fetch_add(&ds->fe.fe_items, n);
    return 0;
}

static int on_withdraw(gw_dispatch_t *ds, ds_frontend_t *f, const sq_frame_t *fr)
{
    uint64_t slots[SQ_MAX_FE_ITEMS];
    uint32_t n = 0;
    if (sq_fe_withdraw_decode(fr, slots, SQ_MAX_FE_ITEMS, &n) != 0)
        return -1;
    int any = 0;
    for (uint32_t i = 0; i < n; i++) {
        ds_fe_item_t **pp = ds_fe_chain_link(f, slots[i], NULL);
        if (pp == NULL)
            continue; /* answered meanwhile */
        atomic_store(&(*pp)->abandoned, GW_ABANDONED_GONE);
        any = 1;
    }
    if (any)
        ds_withdraw_abandoned(ds);
    return 0;
}

/* FE_METRICS: what the frontend last said of itself, kept for /metrics and
 * the statistics routes (HTTP threads read it under fe_lock). */
static int on_metrics(gw_dispatch_t *ds, ds_frontend_t *f, const sq_frame_t *fr)
{
    gw_fe_metrics_t m;
    if (gw_fe_metrics_decode(fr, &m) != 0)
        return -1;
    /* What it measured of its pipelines' queries: this side splits them. */
    for (uint32_t i = 0; i < m.nreports; i++) {
        json_t *report = json_loadb(m.reports[i].report.p, m.reports[i].report.len, 0, NULL);
        gw_pipeline_t *p = gw_pipes_get(ds->pipelines, m.reports[i].name);
        if (p != NULL && (report == NULL || gw_pipeline_take_report(p, report) != 0))
            SQ_WARN("frontend id=%d: malformed pipeline report name=%s", f->id, m.reports[i].name);
        gw_pipeline_unref(p);
        json_decref(report);
    }
    /* Its models' statistics, each the metrics room's document. */
    json_t *stats = json_array();
    for (uint32_t i = 0; i < m.nstats; i++) {
        json_t *e = json_loadb(m.stats[i].stats.p, m.stats[i].stats.len, 0, NULL);
        const char *n = json_string_value(json_object_get(e, "name"));
        const char *v = json_string_value(json_object_get(e, "version"));
        if (n != NULL && v != NULL && strcmp(n, m.stats[i].name) == 0 &&
            strcmp(v, m.stats[i].version) == 0)
            json_array_append(stats, e);
        json_decref(e);
    }
    char *copy = sq_xmalloc((size_t)m.text.len + 1);
    if (m.text.len > 0)
        memcpy(copy, m.text.p, m.text.len);
    copy[m.text.len] = '\0';
    pthread_mutex_lock(&ds->fe.fe_lock);
    free(f->metrics);
    json_decref(f->stats);
    f->metrics = copy;
    f->stats = stats;
    pthread_mutex_unlock(&ds->fe.fe_lock);
    gw_fe_metrics_dispose(&m);
    return 0;
}

void gw_dispatch_frontends_metrics(gw_dispatch_t *ds, const char *own, sq_buf_t *out)
{
    if (ds == NULL) {
        sq_buf_put(out, own, strlen(own));
        return;
    }
    pthread_mutex_lock(&ds->fe.fe_lock);
    int n = ds->fe.nfrontends;
    const char **texts = sq_xcalloc((size_t)n + 1, sizeof(*texts));
    const char **names = sq_xcalloc((size_t)n + 1, sizeof(*names));
    for (int i = 0; i < n; i++) {
        ds_frontend_t *f = ds->fe.frontends[i];
        if (f != NULL && f->up && f->metrics != NULL) {
            texts[i] = f->metrics;
            names[i] = f->name;
        }
    }
    gw_metrics_merge(out, own, texts, names, n);
    pthread_mutex_unlock(&ds->fe.fe_lock);
    free(texts);
    free(names);
}

void gw_dispatch_frontends_stats(gw_dispatch_t *ds, json_t *model_stats)
{
    if (ds == NULL)
        return;
    const char *name = json_string_value(json_object_get(model_stats, "name"));
    const char *version = json_string_value(json_object_get(model_stats, "version"));
    if (name == NULL || version == NULL)
        return;
    pthread_mutex_lock(&ds->fe.fe_lock);
    for (int i = 0; i < ds->fe.nfrontends; i++) {
        ds_frontend_t *f = ds->fe.frontends[i];
        if (f == NULL || !f->up || f->stats == NULL)
            continue;
        size_t k;
        json_t *e;
        json_array_foreach(f->stats, k, e)
        {
            const char *n = json_string_value(json_object_get(e, "name"));
            const char *v = json_string_value(json_object_get(e, "version"));
            if (n != NULL && v != NULL && strcmp(n, name) == 0 && strcmp(v, version) == 0)
                gw_metrics_stats_add(model_stats, e);
        }
    }
    pthread_mutex_unlock(&ds->fe.fe_lock);
}

int ds_fe_frame(gw_dispatch_t *ds, int fe, const sq_frame_t *f)
{
    ds_frontend_t *r = ds_frontend_at(ds, fe);
    if (r == NULL)
        return -1;
    atomic_fetch_add(&ds->fe.fe_bytes_in, (uint64_t)f->len + SQ_IPC_HEADER_SIZE);
    if (ds->aborted) {
        /* Stopping: what it offers now is failed at once (it answers
         * 503, and its clients retry elsewhere). */
        if (f->type != SQ_MSG_FE_ITEMS)
            return 0;
        static _Thread_local sq_fe_item_t in[SQ_MAX_FE_ITEMS];
        uint32_t n = 0;
        if (sq_fe_items_decode(f, in, &n) != 0)
            return -1;
        for (uint32_t i = 0; i < n; i++)
            fail_slot(ds, fe, in[i].slot, SQ_SHUTTING_DOWN, "the dispatcher is shutting down");
        return 0;
    }
    switch (f->type) {
    case SQ_MSG_FE_ITEMS:
        return on_items(ds, r, f);
    case SQ_MSG_FE_WITHDRAW:
        return on_withdraw(ds, r, f);
    case SQ_MSG_FE_METRICS:
        return on_metrics(ds, r, f);
    default:
        return -1;
    }
}

/* A frontend gone: its items leave the queues at once (no batch is sized
 * for rows that will not come), and the workers stop waiting for rows of
 * batches already sent (FE_GONE: they count as absent). */
void ds_fe_lost(gw_dispatch_t *ds, int fe)
{
    ds_frontend_t *f = ds_frontend_at(ds, fe);
    if (f == NULL)
        return;
    pthread_mutex_lock(&ds->fe.fe_lock);
    f->up = 0;
    pthread_mutex_unlock(&ds->fe.fe_lock);
    atomic_fetch_sub(&ds->fe.fe_connected, 1);
    int any = 0;
    for (uint32_t i = 0; i < f->capitems; i++) {
        for (ds_fe_item_t *x = f->items[i]; x != NULL; x = x->next_in_slot) {
            atomic_store(&x->abandoned, GW_ABANDONED_GONE);
            any = 1;
        }
    }
    if (any && !ds->aborted)
        ds_withdraw_abandoned(ds);
    for (int w = 0; w < ds->nworkers; w++)
        if (ds->workers[w] != NULL && ds->workers[w]->up && ds->workers[w]->data_addr[0] != '\0')
            ds_link_send(ds, w, SQ_MSG_FE_GONE, (uint64_t)fe, NULL, 0, NULL, 0);
    free(f->items);
    f->items = NULL;
    f->capitems = 0;
    free(f->state_sent);
    f->state_sent = NULL;
    pthread_mutex_lock(&ds->fe.fe_lock);
    free(f->metrics);
    json_decref(f->stats);
    f->metrics = NULL;
    f->stats = NULL;
    pthread_mutex_unlock(&ds->fe.fe_lock);
}

void ds_frontends_free(gw_dispatch_t *ds)
{
    if (ds->fe.fe_timer != 0)
        sq_loop_timer_cancel(ds->loop, ds->fe.fe_timer);
    ds->fe.fe_timer = 0;
    for (int i = 0; i < ds->fe.nfrontends; i++) {
        ds_frontend_t *f = ds->fe.frontends[i];
        if (f == NULL)
            continue;
        free(f->items);
        free(f->state_sent);
        free(f->metrics);
        json_decref(f->stats);
        free(f);
    }
    free(ds->fe.frontends);
    ds->fe.frontends = NULL;
    ds->fe.nfrontends = 0;
}
