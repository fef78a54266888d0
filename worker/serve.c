#include "wk_serve.h"
#include "wk_exec.h"
#include "wk_fault.h"

#include <mdb.h>
#include <mdb_graph.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the execution thread's work --------------------------------------- */

/* JOB_SWEEP: drop the models no load on the current connection asked for
 * (wk_serve_opts_t.kept_models_ms after a reconnect). */
/* JOB_INSTALL: a model the loader thread built, for the execution thread
 * to put in service. */
typedef enum {
    JOB_LOAD,
    JOB_UNLOAD,
    JOB_BATCH,
    JOB_PROFILE,
    JOB_SWEEP,
    JOB_INSTALL,
    JOB_STOP
} job_kind_t;

typedef struct job {
    struct job *next;
    job_kind_t kind;
    uint64_t id; /* model key or batch id */
    sq_model_load_t *load;
    const uint8_t *bytes; /* LOAD: the model file (owned by the byte cache) */
    size_t nbytes;
    const uint8_t *member_bytes[SQ_MAX_GROUP_MEMBERS]; /* GROUP load: each member's file */
    size_t member_nbytes[SQ_MAX_GROUP_MEMBERS];
    sq_batch_t *batch;
    uint8_t *input; /* a remote batch's input bytes (BATCH_INPUT), owned */
    size_t input_len;
    sq_profile_req_t profile;
    int64_t received_ns;
    uint64_t gen; /* the connection it came on */
    /* INSTALL: what the loader built (NULL: it failed, build_rc and
     * build_why say why) and how long it took. */
    struct model *built;
    int build_rc;
    char *build_why;
    int64_t import_ms, load_ms;
} job_t;

/* A job queue: any thread appends, one thread takes (blocking). */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    job_t *head, *tail;
} jobq_t;

static void jobq_init(jobq_t *q)
{
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->head = q->tail = NULL;
}

static void jobq_destroy(jobq_t *q)
{
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
}

static void jobq_push(jobq_t *q, job_t *j)
{
    pthread_mutex_lock(&q->lock);
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

static job_t *jobq_pop(jobq_t *q)
{
    pthread_mutex_lock(&q->lock);
    while (q->head == NULL)
        pthread_cond_wait(&q->cond, &q->lock);
    job_t *j = q->head;
    q->head = j->next;
    if (q->head == NULL)
        q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    return j;
}

static void job_free(job_t *j);

/* Drops every job queued, then queues `then` (or nothing). */
static void jobq_replace(jobq_t *q, job_t *then)
{
    pthread_mutex_lock(&q->lock);
    for (job_t *j = q->head, *n; j != NULL; j = n) {
        n = j->next;
        job_free(j);
    }
    q->head = q->tail = then;
    if (then != NULL) {
        then->next = NULL;
        pthread_cond_signal(&q->cond);
    }
    pthread_mutex_unlock(&q->lock);
}

typedef struct model {
    struct model *next;
    uint64_t key;
    wk_plan_t *plan;   /* a model, or */
    wk_group_t *group; /* a prefix group (plan NULL) */
    int pixel_h, pixel_w;
    int64_t in_elems, out_elems;
    char sha256[65]; /* its file's ("" for a group) */
    /* What its load asked for (a plain ONNX model): a load after a
     * reconnect that asks the same keeps it. */
    uint32_t asked_max_batch;
    double mean[3], std[3];
    uint8_t bgr;
    uint64_t gen; /* the connection that last loaded it */
} model_t;

/* Bytes of model files received on this connection, by sha256. Kept for the
 * worker's life so that reloading a model needs no transfer; owned by the
 * I/O thread, read by the execution thread only while loading. */
typedef struct cached {
    struct cached *next;
    char sha256[65];
    uint8_t *bytes;
    size_t len;
} cached_t;

typedef struct {
    wk_serve_opts_t o;
    sq_loop_t *loop;
    sq_conn_t *conn;
    int exit_status;
    /* I/O thread: the connection's number (replies to jobs of an earlier
     * one are dropped), whether it is lost (a remote worker reconnects),
     * when squishd was last heard */
    uint64_t conn_gen;
    int lost;
    int64_t last_heard_ns;
    uint32_t heartbeat_ms;
    uint64_t silence_timer;
    uint64_t sweep_timer; /* on_sweep after a rejoin */
    /* I/O thread: a remote batch's inputs being received */
    struct {
        uint64_t id;
        sq_buf_t bytes;
        int active;
    } rin;
    /* I/O thread: an ONNX file being received */
    struct {
        uint64_t key;
        sq_model_load_t *spec;
        uint8_t *bytes;
        size_t have;
        mdb_sha256_t *digest; /* of the chunks so far */
        int64_t started_ns;
    } rx;
    cached_t *cache;
    /* loader thread: builds models (import, compile, allocate) while the
     * execution thread goes on running batches; its queue */
    pthread_t loader;
    jobq_t loadq;
    /* execution thread: loads handed to the loader and not yet installed,
     * in order; an unload meanwhile cancels them */
    struct building *building;
    /* execution thread */
    pthread_t exec;
    uint64_t exec_gen; /* execution thread: the connection of the job it runs */
    jobq_t execq;
    /* Replies the execution thread posted and the I/O thread wrote (or
     * dropped): a job starts only once every earlier reply is on the wire,
     * so that when a job crashes the process, squishd has the answers of
     * all the jobs before it and knows which one it was. */
    pthread_mutex_t reply_lock;
    pthread_cond_t reply_cond;
    uint64_t replies_posted, replies_written;
    int io_done; /* the I/O loop has stopped: nothing waits for it */
    model_t *models;
    struct measure *meas; /* execution thread: a measurement under way */
    uint8_t *staging;
    size_t staging_len;
} server_t;

typedef struct {
    server_t *srv;
    uint16_t type;
    uint64_t id;
    uint64_t gen;
    sq_buf_t payload;
} reply_t;

static void send_reply(sq_loop_t *loop, void *arg)
{
    reply_t *r = arg;
    server_t *s = r->srv;
    if (s->exit_status < 0 && !s->lost && r->gen == s->conn_gen &&
        sq_conn_send(s->conn, r->type, r->id, r->payload.data, (uint32_t)r->payload.len) == 0 &&
        sq_conn_pending(s->conn))
        sq_loop_modify(loop, s->conn->fd, SQ_EV_READ | SQ_EV_WRITE);
    sq_buf_dispose(&r->payload);
    free(r);
    pthread_mutex_lock(&s->reply_lock);
    s->replies_written++;
    pthread_cond_broadcast(&s->reply_cond);
    pthread_mutex_unlock(&s->reply_lock);
}

/* Execution thread, before a job: waits until the replies of the jobs
 * before it are written to the socket (the kernel delivers them even if
 * this process dies next). */
static void replies_flushed(server_t *s)
{
    pthread_mutex_lock(&s->reply_lock);
    while (s->replies_written < s->replies_posted && !s->io_done)
        pthread_cond_wait(&s->reply_cond, &s->reply_lock);
    pthread_mutex_unlock(&s->reply_lock);
}

/* From the execution thread: queue a frame for the I/O thread to send. */
static reply_t *reply_new(server_t *s, uint16_t type, uint64_t id)
{
    reply_t *r = sq_xcalloc(1, sizeof(*r));
    r->srv = s;
    r->type = type;
    r->id = id;
    /* For the connection of the job running, or the I/O thread's. */
    r->gen = pthread_equal(pthread_self(), s->exec) ? s->exec_gen : s->conn_gen;
    sq_buf_init(&r->payload);
    return r;
}

static void reply_post(server_t *s, reply_t *r)
{
    pthread_mutex_lock(&s->reply_lock);
    s->replies_posted++;
    pthread_mutex_unlock(&s->reply_lock);
    sq_loop_post(s->loop, send_reply, r);
}

static void reply_failed(server_t *s, uint64_t key, int code, const char *msg)
{
    reply_t *r = reply_new(s, SQ_MSG_MODEL_FAILED, key);
    sq_ipc_error_t e = {.code = code};
    snprintf(e.message, sizeof(e.message), "%s", msg);
    sq_ipc_error_encode(&r->payload, &e);
    reply_post(s, r);
}

static model_t *find_model(server_t *s, uint64_t key)
{
    for (model_t *m = s->models; m != NULL; m = m->next)
        if (m->key == key)
            return m;
    return NULL;
}

static void model_free(model_t *m)
{
    if (m == NULL)
        return;
    wk_plan_free(m->plan);
    wk_group_free(m->group);
    free(m);
}

static void drop_model(server_t *s, uint64_t key)
{
    for (model_t **pm = &s->models; *pm != NULL; pm = &(*pm)->next) {
        if ((*pm)->key == key) {
            model_t *m = *pm;
            *pm = m->next;
            model_free(m);
            return;
        }
    }
}

static int model_max_batch(const model_t *m)
{
    return m->group != NULL ? wk_group_max_batch(m->group) : wk_plan_max_batch(m->plan);
}

static uint64_t model_memory(const model_t *m)
{
    return m->group != NULL ? wk_group_memory_bytes(m->group) : wk_plan_memory_bytes(m->plan);
}

/* Floats of an item's row: every output of a model, one after the other
 * (wk_plan_row_elems); for a group (single-output members), its widest
 * member's output. */
static int64_t model_out_elems(const model_t *m)
{
    if (m->group == NULL)
        return wk_plan_row_elems(m->plan);
    int64_t most = 0;
    for (int i = 0; i < wk_group_n_members(m->group); i++)
        if (wk_group_output_elems(m->group, i) > most)
            most = wk_group_output_elems(m->group, i);
    return most;
}

static const char *model_errmsg(const model_t *m)
{
    return m->group != NULL ? wk_group_errmsg(m->group) : wk_plan_errmsg(m->plan);
}

/* Runs `batch` items of a model or group: pixels or FP32 tensors in `in`,
 * row i (every output of the item) at out + i * out_stride floats (a plain
 * model needs out_stride == its row size). */
static int model_run(model_t *m, int batch, int pixels, const uint8_t *in, const int *member,
                     float *out, size_t out_stride)
{
    if (m->group != NULL)
        return pixels ? wk_group_run_pixels(m->group, batch, in, member, out, out_stride)
                      : wk_group_run(m->group, batch, (const float *)in, member, out, out_stride);
    if (pixels)
        return wk_plan_run_pixels(m->plan, batch, in, out);
    if (wk_plan_n_inputs(m->plan) != 1)
        return SQ_INVAL;
    const float *ins[1] = {(const float *)in};
    return wk_plan_run_rows(m->plan, batch, ins, out);
}

static int64_t model_last_run_ns(const model_t *m)
{
    return m->group != NULL ? wk_group_last_run_ns(m->group) : wk_plan_last_run_ns(m->plan);
}

/* A prefix group: every member's file is in the byte cache (the job holds
 * them); each is imported and cut where squishd says. */
static int load_group(const job_t *j, const wk_plan_opts_t *opts, wk_group_t **out, char *why,
                      int why_size)
{
    const sq_model_load_t *spec = j->load;
    int n = (int)spec->n_members, rc = 0;
    mdb_graph_t *graphs[SQ_MAX_GROUP_MEMBERS] = {0};
    const char *cuts[SQ_MAX_GROUP_MEMBERS];
    if (opts->backend == SQ_DEV_EMU) {
        snprintf(why, (size_t)why_size, "prefix groups run on cpu and cuda devices");
        return SQ_INVAL;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        mdb_import_error_t ierr;
        cuts[i] = spec->members[i].cut;
        rc = mdb_onnx_import(j->member_bytes[i], j->member_nbytes[i], &graphs[i], &ierr);
        if (rc != 0)
            snprintf(why, (size_t)why_size, "member %d import: %s %s", i, ierr.detail, ierr.ops);
    }
    if (rc == 0)
        rc = wk_group_create((const mdb_graph_t *const *)graphs, cuts, n, opts, out, why, why_size);
    for (int i = 0; i < n; i++)
        mdb_graph_free(graphs[i]);
    return rc;
}

static sq_dev_kind_t backend_of(const wk_device_t *dev)
{
    return dev->kind == SQ_DEV_CUDA  ? SQ_DEV_CUDA
           : dev->kind == SQ_DEV_EMU ? SQ_DEV_EMU
                                     : SQ_DEV_CPU;
}

static void reply_loaded(server_t *s, uint64_t key, const model_t *m)
{
    reply_t *r = reply_new(s, SQ_MSG_MODEL_LOADED, key);
    sq_model_loaded_t loaded = {.memory_bytes = model_memory(m),
                                .max_batch = (uint32_t)model_max_batch(m),
                                .in_elems = (uint64_t)m->in_elems,
                                .out_elems = (uint64_t)m->out_elems,
                                .in_hw = {(uint32_t)m->pixel_h, (uint32_t)m->pixel_w}};
    sq_model_loaded_encode(&r->payload, &loaded);
    reply_post(s, r);
}

/* The model loaded before under key from the same file and options, or
 * NULL. */
static model_t *same_model(server_t *s, uint64_t key, const sq_model_load_t *spec)
{
    if (spec->format != SQ_FORMAT_ONNX)
        return NULL;
    for (model_t *m = s->models; m != NULL; m = m->next)
        if (m->key == key && m->plan != NULL && strcmp(m->sha256, spec->sha256) == 0 &&
            m->asked_max_batch == spec->max_batch && m->bgr == spec->bgr &&
            memcmp(m->mean, spec->mean, sizeof(m->mean)) == 0 &&
            memcmp(m->std, spec->std, sizeof(m->std)) == 0)
            return m;
    return NULL;
}

/* Models no load on the current connection asked for (JOB_SWEEP). */
static void sweep_models(server_t *s, uint64_t gen)
{
    for (model_t **pm = &s->models; *pm != NULL;) {
        model_t *m = *pm;
        if (m->gen == gen) {
            pm = &m->next;
            continue;
        }
        SQ_INFO("model dropped key=%llu sha256=%.12s reason=\"not loaded again within %d ms of "
                "the reconnect\"",
                (unsigned long long)m->key, m->sha256, s->o.kept_models_ms);
        *pm = m->next;
        model_free(m);
    }
}

/* A load handed to the loader thread (execution thread's list). */
typedef struct building {
    struct building *next;
    uint64_t key;
    int cancelled; /* unloaded before it was installed */
} building_t;

/* LOAD, execution thread: a model kept from before a reconnect answers at
 * once; any other is built by the loader thread (the batches of the models
 * held go on meanwhile) and installed when it is done (JOB_INSTALL).
 * Returns 1 when j went to the loader. */
static int do_load(server_t *s, job_t *j)
{
    const sq_model_load_t *spec = j->load;
    model_t *kept = same_model(s, j->id, spec);
    if (kept != NULL && kept->gen != j->gen) {
        kept->gen = j->gen;
        reply_loaded(s, j->id, kept);
        SQ_INFO("model kept key=%llu sha256=%.12s (loaded before the reconnect)",
                (unsigned long long)j->id, spec->sha256);
        return 0;
    }
    wk_fault_check(WK_FAULT_LOAD, spec->sha256);
    if (wk_fault_check(WK_FAULT_REFUSE, spec->sha256)) {
        reply_failed(s, j->id, SQ_UNSUPPORTED_MODEL, "injected refusal (SQUISH_WORKER_FAULT)");
        return 0;
    }
    building_t *b = sq_xcalloc(1, sizeof(*b)), **tail = &s->building;
    b->key = j->id;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = b;
    jobq_push(&s->loadq, j);
    return 1;
}

/* Loader thread: builds j's model into j->built (or says why not), then
 * hands j back to the execution thread as INSTALL. */
static void build_model(server_t *s, job_t *j)
{
    const sq_model_load_t *spec = j->load;
    char why[512] = "";
    wk_plan_opts_t opts = wk_plan_opts_default();
    opts.backend = backend_of(&s->o.dev);
    opts.device_index = s->o.dev.index;
    opts.max_batch = (int)spec->max_batch;
    opts.threads = s->o.threads;
    for (int c = 0; c < 3; c++) {
        opts.pixel_norm.mean[c] = (float)(spec->mean[c] / 255.0);
        opts.pixel_norm.std[c] = (float)(spec->std[c] / 255.0);
    }
    opts.pixel_norm.channels_bgr = spec->bgr;
    int64_t *lat = NULL;
    if (spec->n_latency > 0) {
        lat = sq_xcalloc(spec->n_latency, sizeof(*lat));
        for (uint32_t i = 0; i < spec->n_latency; i++)
            lat[i] = (int64_t)spec->latency_us[i];
        opts.emu_latency_us = lat;
        opts.emu_n_latency = (int)spec->n_latency;
    }
    wk_plan_t *plan = NULL;
    wk_group_t *group = NULL;
    int64_t started_ns = sq_now_ns(), import_ms = 0;
    int rc;
    if (spec->format == SQ_FORMAT_GROUP) {
        rc = load_group(j, &opts, &group, why, sizeof(why));
    } else if (opts.backend == SQ_DEV_EMU) {
        /* An emulated device holds any model, real or not, for its profiled
         * l(b): the item shape and output size come with the spec. */
        if (spec->n_latency < spec->max_batch) {
            rc = SQ_INVAL;
            snprintf(why, sizeof(why), "an emulated device needs l(b) for b = 1..%u",
                     spec->max_batch);
        } else {
            int64_t chw[3] = {spec->in_chw[0], spec->in_chw[1], spec->in_chw[2]};
            opts.emu_det_slots = (int)spec->det_slots;
            opts.emu_det_mean = spec->det_mean;
            rc = wk_plan_create_emulated(chw, spec->out_classes, &opts, &plan, why, sizeof(why));
        }
    } else if (spec->format != SQ_FORMAT_ONNX || j->bytes == NULL) {
        rc = SQ_INVAL;
        snprintf(why, sizeof(why), "an emulated model runs on emu devices only");
    } else {
        mdb_graph_t *g = NULL;
        mdb_import_error_t ierr;
        rc = mdb_onnx_import(j->bytes, j->nbytes, &g, &ierr);
        import_ms = (sq_now_ns() - started_ns) / 1000000;
        if (rc != 0)
            snprintf(why, sizeof(why), "import: %s %s", ierr.detail, ierr.ops);
        else
            rc = wk_plan_create(g, &opts, &plan, why, sizeof(why));
        mdb_graph_free(g);
    }
    free(lat); /* the plan keeps its own copy */
    model_t *m = NULL;
    if (rc == 0) {
        m = sq_xcalloc(1, sizeof(*m));
        m->key = j->id;
        m->plan = plan;
        m->group = group;
        snprintf(m->sha256, sizeof(m->sha256), "%s", spec->sha256);
    }
    if (m != NULL) {
        /* A group's rows enter through its prefix. */
        const wk_plan_t *front = group != NULL ? wk_group_prefix(group) : plan;
        /* Images are what wk_plan_run_pixels takes: one input of [N,3,H,W]
         * or [N,H,W,3], batched, or static with one image (a file that
         * fixes its batch at 1). Any other input comes as FP32 tensors, and
         * is profiled with them. */
        int64_t dims[8];
        int h = 0, w = 0;
        int rank = wk_plan_input_shape(front, 0, dims);
        bool image = wk_plan_image_input(front, &h, &w, NULL) && (rank == 3 || dims[0] == 1);
        m->pixel_h = image ? h : 0;
        m->pixel_w = image ? w : 0;
        m->in_elems = wk_plan_input_elems(front, 0);
        m->out_elems = model_out_elems(m);
        m->asked_max_batch = spec->max_batch;
        memcpy(m->mean, spec->mean, sizeof(m->mean));
        memcpy(m->std, spec->std, sizeof(m->std));
        m->bgr = spec->bgr;
        m->gen = j->gen;
    }
    j->built = m;
    j->build_rc = rc;
    j->build_why = rc != 0 ? sq_xstrdup(why) : NULL;
    j->import_ms = import_ms;
    j->load_ms = (sq_now_ns() - started_ns) / 1000000;
    j->kind = JOB_INSTALL;
    jobq_push(&s->execq, j); /* its connection number kept */
}

/* INSTALL, execution thread: the built model replaces any held under its
 * key, unless an unload came meanwhile (it is answered all the same: the
 * unload's sender counts on an answer to every load). */
static void do_install(server_t *s, job_t *j)
{
    building_t **pb = &s->building;
    while (*pb != NULL && (*pb)->key != j->id)
        pb = &(*pb)->next;
    int cancelled = 0;
    if (*pb != NULL) {
        building_t *b = *pb;
        cancelled = b->cancelled;
        *pb = b->next;
        free(b);
    }
    model_t *m = j->built;
    j->built = NULL; /* freed or in service below */
    const sq_model_load_t *spec = j->load;
    if (m == NULL) {
        SQ_WARN("model load failed key=%llu reason=\"%s\"", (unsigned long long)j->id,
                j->build_why);
        reply_failed(s, j->id, j->build_rc, j->build_why);
        return;
    }
    reply_loaded(s, j->id, m);
    if (cancelled) {
        model_free(m);
        return;
    }
    drop_model(s, j->id);
    m->next = s->models;
    s->models = m;
    SQ_INFO("model loaded key=%llu sha256=%.12s backend=%s max_batch=%d memory_mb=%llu "
            "members=%u import_ms=%lld load_ms=%lld",
            (unsigned long long)j->id, spec->sha256, sq_dev_kind_name(backend_of(&s->o.dev)),
            model_max_batch(m), (unsigned long long)(model_memory(m) >> 20), spec->n_members,
            (long long)j->import_ms, (long long)j->load_ms);
}

/* UNLOAD, execution thread: drops the model and cancels its loads still
 * being built. */
static void do_unload(server_t *s, uint64_t key)
{
    for (building_t *b = s->building; b != NULL; b = b->next)
        if (b->key == key)
            b->cancelled = 1;
    drop_model(s, key);
}

static void job_free(job_t *j)
{
    free(j->load);
    free(j->batch);
    free(j->input);
    model_free(j->built);
    free(j->build_why);
    free(j);
}

/* Stops the loader thread: loads it has not started are dropped, one it
 * is building finishes (and lands in the execution queue). */
static void loader_stop(server_t *s)
{
    job_t *stop = sq_xcalloc(1, sizeof(*stop));
    stop->kind = JOB_STOP;
    jobq_replace(&s->loadq, stop);
    pthread_join(s->loader, NULL);
}

static void *loader_thread(void *arg)
{
    server_t *s = arg;
    for (;;) {
        job_t *j = jobq_pop(&s->loadq);
        if (j->kind == JOB_STOP) {
            free(j);
            return NULL;
        }
        build_model(s, j);
    }
}

static uint8_t *staging(server_t *s, size_t n)
{
    if (s->staging_len < n) {
        free(s->staging);
        s->staging = sq_xmalloc(n);
        s->staging_len = n;
    }
    return s->staging;
}

/* Where a batch's offsets point: the arena for a local worker; for a remote
 * one, inputs in the bytes that came with it and outputs in a buffer that
 * goes back. */
typedef struct {
    const uint8_t *in;
    size_t in_len;
    uint8_t *out;
    size_t out_len;
} view_t;

/* Checks that [off, off + n) lies inside a region of len bytes. */
static int inside(size_t len, uint64_t off, uint64_t n)
{
    return off <= len && n <= len - off;
}

static int run_batch(server_t *s, const sq_batch_t *b, const view_t *v, char *msg, size_t msglen,
                     int64_t *exec_ns)
{
    model_t *m = find_model(s, b->model_key);
    if (m != NULL)
        wk_fault_check(WK_FAULT_RUN, m->sha256);
    if (m == NULL) {
        snprintf(msg, msglen, "model %llu is not loaded", (unsigned long long)b->model_key);
        return SQ_NOT_FOUND;
    }
    int count = (int)b->count;
    if (count > model_max_batch(m)) {
        snprintf(msg, msglen, "batch of %d over the plan's max %d", count, model_max_batch(m));
        return SQ_INVAL;
    }
    int member[SQ_MAX_BATCH_ITEMS];
    if ((m->group != NULL) != (b->has_members != 0)) {
        snprintf(msg, msglen, "a group's batch names each item's member, a model's does not");
        return SQ_PROTOCOL;
    }
    for (int i = 0; m->group != NULL && i < count; i++) {
        member[i] = b->member[i];
        if (member[i] >= wk_group_n_members(m->group)) {
            snprintf(msg, msglen, "item %d names member %d of %d", i, member[i],
                     wk_group_n_members(m->group));
            return SQ_PROTOCOL;
        }
    }
    uint64_t out_bytes = (uint64_t)m->out_elems * sizeof(float);
    if (b->out_stride < out_bytes || b->out_stride > SQ_REMOTE_MAX_BATCH_BYTES ||
        !inside(v->out_len, b->out_off, b->out_stride * (uint64_t)count)) {
        snprintf(msg, msglen, "output region outside the arena");
        return SQ_PROTOCOL;
    }
    size_t item;
    if (b->input_kind == SQ_INPUT_PIXELS) {
        if (m->pixel_h <= 0) {
            snprintf(msg, msglen, "the model does not take images");
            return SQ_INVAL;
        }
        item = (size_t)m->pixel_h * (size_t)m->pixel_w * 3;
    } else {
        item = (size_t)m->in_elems * (b->input_kind == SQ_INPUT_FP32 ? sizeof(float) : 1);
    }
    for (int i = 0; i < count; i++) {
        if (!inside(v->in_len, b->in_off[i], item)) {
            snprintf(msg, msglen, "input %d outside the arena", i);
            return SQ_PROTOCOL;
        }
    }
    /* The outputs must be contiguous for the backend: run into staging when
     * the stride has padding. */
    int rc;
    float *out = (float *)(v->out + b->out_off);
    /* A group writes each row at its stride itself. */
    int direct_out = b->out_stride == out_bytes || (m->group != NULL && b->out_stride % 4 == 0);
    size_t in_bytes = b->input_kind == SQ_INPUT_PIXELS ? item : (size_t)m->in_elems * sizeof(float);
    uint8_t *in = staging(s, in_bytes * (size_t)count + (direct_out ? 0 : out_bytes * count));
    float *out_tmp = direct_out ? out : (float *)(in + in_bytes * (size_t)count);
    for (int i = 0; i < count; i++) {
        const uint8_t *src = v->in + b->in_off[i];
        uint8_t *dst = in + in_bytes * (size_t)i;
        if (b->input_kind == SQ_INPUT_UINT8) {
            for (int64_t e = 0; e < m->in_elems; e++)
                ((float *)dst)[e] = (float)src[e];
        } else {
            memcpy(dst, src, in_bytes);
        }
    }
    size_t stride = direct_out ? (size_t)(b->out_stride / 4) : (size_t)m->out_elems;
    rc = model_run(m, count, b->input_kind == SQ_INPUT_PIXELS, in, member, out_tmp, stride);
    if (rc != 0) {
        snprintf(msg, msglen, "%s", model_errmsg(m));
        return rc;
    }
    if (!direct_out)
        for (int i = 0; i < count; i++)
            memcpy(v->out + b->out_off + b->out_stride * (uint64_t)i,
                   out_tmp + (size_t)m->out_elems * (size_t)i, out_bytes);
    *exec_ns = model_last_run_ns(m);
    return 0;
}

static void do_batch(server_t *s, job_t *j)
{
    sq_batch_done_t done = {0};
    int64_t exec_ns = 0;
    view_t v = {
        .in = s->o.shm, .in_len = s->o.shm_bytes, .out = s->o.shm, .out_len = s->o.shm_bytes};
    if (s->o.remote) {
        /* The outputs go back in BATCH_OUTPUT frames: count * out_stride
         * bytes from offset 0 (run_batch checks the batch against them). */
        const sq_batch_t *b = j->batch;
        uint64_t n = b->out_stride * (uint64_t)b->count;
        v = (view_t){.in = j->input, .in_len = j->input_len};
        if (b->out_off == 0 && b->out_stride <= SQ_REMOTE_MAX_BATCH_BYTES &&
            n <= SQ_REMOTE_MAX_BATCH_BYTES && n > 0 && (v.out = malloc(n)) != NULL)
            v.out_len = n;
    }
    done.code = run_batch(s, j->batch, &v, done.message, sizeof(done.message), &exec_ns);
    if (s->o.remote && done.code == 0) {
        for (size_t off = 0; off < v.out_len; off += SQ_REMOTE_CHUNK_BYTES) {
            size_t n =
                v.out_len - off < SQ_REMOTE_CHUNK_BYTES ? v.out_len - off : SQ_REMOTE_CHUNK_BYTES;
            reply_t *o = reply_new(s, SQ_MSG_BATCH_OUTPUT, j->id);
            sq_buf_put(&o->payload, v.out + off, n);
            reply_post(s, o);
        }
    }
    if (s->o.remote)
        free(v.out);
    done.exec_ns = (uint64_t)exec_ns;
    done.total_ns = (uint64_t)(sq_now_ns() - j->received_ns);
    SQ_DEBUG("batch done id=%llu model=%llu count=%u code=%s exec_us=%lld total_us=%lld",
             (unsigned long long)j->id, (unsigned long long)j->batch->model_key, j->batch->count,
             sq_err_name(done.code), (long long)(exec_ns / 1000),
             (long long)(done.total_ns / 1000));
    reply_t *r = reply_new(s, SQ_MSG_BATCH_DONE, j->id);
    sq_batch_done_encode(&r->payload, &done);
    reply_post(s, r);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Mean and std of the fastest three quarters of the samples: the slowest
 * runs of a batch on a shared host are other processes' time, not the
 * model's. */
static void trimmed_stats(double *samples, int n, double *mean, double *sd)
{
    qsort(samples, (size_t)n, sizeof(*samples), cmp_double);
    int keep = n >= 4 ? n - n / 4 : n;
    double sum = 0, sumsq = 0;
    for (int i = 0; i < keep; i++) {
        sum += samples[i];
        sumsq += samples[i] * samples[i];
    }
    *mean = keep > 0 ? sum / keep : 0;
    double var = keep > 0 ? sumsq / keep - *mean * *mean : 0;
    *sd = var > 0 ? sqrt(var) : 0;
}

/* The batch sizes the profiler measures: every size to 8, then steps of a
 * quarter of the current size. Between them the planner rounds a batch up
 * to the next measured size (a batch never runs slower padded). */
static int next_profile_batch(int b)
{
    return b < 8 ? b + 1 : b + b / 4;
}

/* A measurement under way (execution thread): it may run in several
 * PROFILE slices (sq_profile_req_t.slice_us), each going on from here. */
typedef struct measure {
    uint64_t key;
    sq_profile_req_t req;
    sq_profile_done_t *done;
    int max_b, nmem, pixels;
    int *member;
    uint8_t *in;
    float *out;
    int b;      /* the size being measured */
    uint32_t r; /* its runs so far, warmup first */
    double samples[1000];
    int nsamples;
    double best_tput;
    int stale;
    int64_t spent_ns; /* measuring time so far (the budget's) */
    double next_us;   /* the expected time of the next run */
} measure_t;

static void measure_free(measure_t *M)
{
    if (M == NULL)
        return;
    free(M->in);
    free(M->out);
    free(M->member);
    free(M->done);
    free(M);
}

static measure_t *measure_new(uint64_t key, const model_t *m, const sq_profile_req_t *req)
{
    measure_t *M = sq_xcalloc(1, sizeof(*M));
    M->key = key;
    M->req = *req;
    M->done = sq_xcalloc(1, sizeof(*M->done));
    M->max_b = (int)req->max_batch < model_max_batch(m) ? (int)req->max_batch : model_max_batch(m);
    /* A group is measured with its members sharing each batch evenly. */
    M->member = sq_xcalloc((size_t)M->max_b + 1, sizeof(int));
    M->nmem = m->group != NULL ? wk_group_n_members(m->group) : 1;
    M->pixels = m->pixel_h > 0;
    size_t item = M->pixels ? (size_t)m->pixel_h * m->pixel_w * 3 : (size_t)m->in_elems * 4;
    M->in = sq_xmalloc(item * (size_t)M->max_b);
    M->out = sq_xmalloc((size_t)m->out_elems * sizeof(float) * (size_t)M->max_b);
    uint32_t seed = 12345;
    for (size_t i = 0; i < item * (size_t)M->max_b; i++) {
        seed = seed * 1103515245u + 12345u;
        M->in[i] = M->pixels ? (uint8_t)(seed >> 24) : 0;
    }
    if (!M->pixels)
        for (size_t i = 0; i < (size_t)m->in_elems * (size_t)M->max_b; i++)
            ((float *)M->in)[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    M->b = 1;
    return M;
}

/* Size M->b has all its runs: its row, the stop rule, progress. Returns 1
 * when the measurement is complete. */
static int measure_row(server_t *s, measure_t *M)
{
    sq_profile_done_t *done = M->done;
    double mean, sd;
    trimmed_stats(M->samples, M->nsamples, &mean, &sd);
    sq_profile_row_t *row = &done->rows[done->nrows++];
    row->batch = (uint32_t)M->b;
    row->mean_us = mean;
    row->std_us = sd;
    model_t *m = find_model(s, M->key);
    row->peak_memory_bytes = m != NULL ? model_memory(m) : 0;
    /* Stop once throughput has not improved by 3% for three sizes, or
     * when the next size would run past the time budget. */
    const sq_profile_req_t *req = &M->req;
    double tput = M->b / mean;
    int stop = 0;
    if (tput > M->best_tput * 1.03) {
        M->best_tput = tput;
        M->stale = 0;
    } else if (++M->stale >= 3) {
        stop = 1;
    }
    int64_t spent = M->spent_ns / 1000000;
    int nb = next_profile_batch(M->b);
    double next_cost_ms = mean / 1000.0 * nb / M->b * (req->warmup + req->repeats);
    if (req->budget_ms > 0 && (double)spent + next_cost_ms > req->budget_ms)
        stop = 1;
    if (nb > M->max_b || done->nrows >= SQ_MAX_PROFILE_ROWS)
        stop = 1;
    /* Progress in sizes measured, of those still expected: the sizes up
     * to max_b that fit what is left of the budget at this pace (a batch
     * of n taking n / b times this one's). */
    uint32_t expect = done->nrows;
    if (!stop) {
        double left = req->budget_ms > 0 ? (double)req->budget_ms - (double)spent : 1e300;
        for (int n = nb; n <= M->max_b && expect < SQ_MAX_PROFILE_ROWS; n = next_profile_batch(n)) {
            left -= mean / 1000.0 * n / M->b * (req->warmup + req->repeats);
            if (left < 0)
                break;
            expect++;
        }
    }
    reply_t *p = reply_new(s, SQ_MSG_PROFILE_PROGRESS, M->key);
    sq_buf_put_u32(&p->payload, done->nrows);
    sq_buf_put_u32(&p->payload, expect);
    reply_post(s, p);
    M->next_us = M->next_us * nb / M->b;
    M->b = nb;
    M->r = 0;
    M->nsamples = 0;
    return stop;
}

/* PROFILE: runs measurement batches of the model until the slice is used
 * up (PROFILE_SLICE: the next batch's expected µs) or the measurement is
 * complete (PROFILE_DONE with the rows). */
static void do_profile(server_t *s, job_t *j)
{
    model_t *m = find_model(s, j->id);
    if (s->meas != NULL && (s->meas->key != j->id || (j->profile.flags & SQ_PROFILE_FRESH))) {
        measure_free(s->meas);
        s->meas = NULL;
    }
    if (m == NULL) {
        sq_profile_done_t *none = sq_xcalloc(1, sizeof(*none));
        none->code = SQ_NOT_FOUND;
        snprintf(none->message, sizeof(none->message), "model not loaded");
        reply_t *r = reply_new(s, SQ_MSG_PROFILE_DONE, j->id);
        sq_profile_done_encode(&r->payload, none);
        reply_post(s, r);
        free(none);
        measure_free(s->meas);
        s->meas = NULL;
        return;
    }
    if (s->meas == NULL) {
        wk_fault_check(WK_FAULT_PROFILE, m->sha256);
        s->meas = measure_new(j->id, m, &j->profile);
    }
    measure_t *M = s->meas;
    int64_t slice_ns = (int64_t)j->profile.slice_us * 1000, t_start = sq_now_ns();
    int complete = 0;
    for (;;) {
        for (int i = 0; i < M->b; i++)
            M->member[i] = (int)((int64_t)i * M->nmem / M->b);
        int64_t t0 = sq_now_ns();
        int rc = model_run(m, M->b, M->pixels, M->in, M->member, M->out, (size_t)m->out_elems);
        int64_t dt = sq_now_ns() - t0;
        M->spent_ns += dt;
        M->next_us = (double)dt / 1000.0;
        if (M->r >= M->req.warmup && M->nsamples < 1000)
            M->samples[M->nsamples++] = (double)dt / 1000.0;
        M->r++;
        if (rc != 0) {
            M->done->code = rc;
            snprintf(M->done->message, sizeof(M->done->message), "batch %d: %s", M->b,
                     model_errmsg(m));
            break;
        }
        if (M->r >= M->req.warmup + M->req.repeats && measure_row(s, M)) {
            complete = 1;
            break;
        }
        if (slice_ns > 0 && sq_now_ns() - t_start + (int64_t)(M->next_us * 1000) > slice_ns) {
            reply_t *r = reply_new(s, SQ_MSG_PROFILE_SLICE, j->id);
            sq_buf_put_u64(&r->payload, (uint64_t)ceil(M->next_us));
            reply_post(s, r);
            return;
        }
    }
    sq_profile_done_t *done = M->done;
    /* A smaller batch can always run padded to a larger one, so l(b) is at
     * most any larger size's latency: the envelope removes the noise that a
     * busy host puts into small batches (and keeps l(b)/b meaningful). */
    for (int i = (int)done->nrows - 2; complete && i >= 0; i--) {
        if (done->rows[i].mean_us > done->rows[i + 1].mean_us) {
            done->rows[i].mean_us = done->rows[i + 1].mean_us;
            done->rows[i].std_us = done->rows[i + 1].std_us;
        }
    }
    reply_t *r = reply_new(s, SQ_MSG_PROFILE_DONE, j->id);
    sq_profile_done_encode(&r->payload, done);
    reply_post(s, r);
    measure_free(M);
    s->meas = NULL;
}

static void *exec_thread(void *arg)
{
    server_t *s = arg;
    for (;;) {
        job_t *j = jobq_pop(&s->execq);
        job_kind_t kind = j->kind;
        s->exec_gen = j->gen;
        if (kind != JOB_STOP && kind != JOB_UNLOAD && kind != JOB_SWEEP)
            replies_flushed(s);
        switch (kind) {
        case JOB_LOAD:
            if (do_load(s, j))
                continue; /* the loader's now */
            break;
        case JOB_INSTALL:
            do_install(s, j);
            break;
        case JOB_UNLOAD:
            do_unload(s, j->id);
            break;
        case JOB_BATCH:
            do_batch(s, j);
            break;
        case JOB_PROFILE:
            do_profile(s, j);
            break;
        case JOB_SWEEP:
            sweep_models(s, j->gen);
            break;
        case JOB_STOP:
            break;
        }
        job_free(j);
        if (kind == JOB_STOP)
            return NULL;
    }
}

static void enqueue(server_t *s, job_t *j)
{
    j->received_ns = sq_now_ns();
    j->gen = s->conn_gen;
    jobq_push(&s->execq, j);
}

/* ---- the I/O thread ----------------------------------------------------- */

static void finish(server_t *s, int status)
{
    s->exit_status = status;
    sq_loop_stop(s->loop);
}

/* A model file's bytes are mapped, not malloc'd: nothing touches their
 * pages before the chunks do. An allocator that fills new memory
 * (MALLOC_PERTURB_, as meson sets for tests) held this thread, and its
 * PONGs, for over a second on a 500 MB file. */
static uint8_t *file_alloc(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void file_free(uint8_t *p, size_t n)
{
    if (p != NULL)
        munmap(p, n);
}

static cached_t *cache_find(server_t *s, const char *sha)
{
    for (cached_t *c = s->cache; c != NULL; c = c->next)
        if (strcmp(c->sha256, sha) == 0)
            return c;
    return NULL;
}

static void queue_load(server_t *s, uint64_t key, sq_model_load_t *spec, cached_t *c)
{
    job_t *j = sq_xcalloc(1, sizeof(*j));
    j->kind = JOB_LOAD;
    j->id = key;
    j->load = spec;
    if (c != NULL) {
        j->bytes = c->bytes;
        j->nbytes = c->len;
    }
    enqueue(s, j);
}

/* A group load names its members' files, which earlier transfers on this
 * connection cached. */
static void queue_group_load(server_t *s, uint64_t key, sq_model_load_t *spec)
{
    job_t *j = sq_xcalloc(1, sizeof(*j));
    for (uint32_t i = 0; i < spec->n_members; i++) {
        cached_t *c = cache_find(s, spec->members[i].sha256);
        if (c == NULL) {
            char msg[160];
            snprintf(msg, sizeof(msg), "group member %u: bytes %.12s not held", i,
                     spec->members[i].sha256);
            reply_failed(s, key, SQ_PROTOCOL, msg);
            free(spec);
            free(j);
            return;
        }
        j->member_bytes[i] = c->bytes;
        j->member_nbytes[i] = c->len;
    }
    j->kind = JOB_LOAD;
    j->id = key;
    j->load = spec;
    enqueue(s, j);
}

/* The last chunk is in: check the digest, cache the bytes, queue the load. */
static void rx_complete(server_t *s)
{
    char sha[65];
    mdb_sha256_end(s->rx.digest, sha);
    s->rx.digest = NULL;
    sq_model_load_t *spec = s->rx.spec;
    SQ_INFO("model file received key=%llu sha256=%.12s bytes=%zu receive_ms=%lld",
            (unsigned long long)s->rx.key, sha, s->rx.have,
            (long long)((sq_now_ns() - s->rx.started_ns) / 1000000));
    uint64_t key = s->rx.key;
    if (strcmp(sha, spec->sha256) != 0) {
        reply_failed(s, key, SQ_PROTOCOL, "model bytes do not match their sha256");
        file_free(s->rx.bytes, s->rx.spec->total_bytes);
        free(spec);
    } else {
        cached_t *c = sq_xcalloc(1, sizeof(*c));
        memcpy(c->sha256, sha, sizeof(sha));
        c->bytes = s->rx.bytes;
        c->len = s->rx.have;
        c->next = s->cache;
        s->cache = c;
        if (spec->cache_only)
            free(spec);
        else
            queue_load(s, key, spec, c);
    }
    memset(&s->rx, 0, sizeof(s->rx));
}

static void connection_lost(server_t *s, const char *why);

static int handle_frame(server_t *s, const sq_frame_t *f)
{
    switch (f->type) {
    case SQ_MSG_PING:
        return sq_conn_send(s->conn, SQ_MSG_PONG, f->id, f->payload, f->len) < 0 ? -1 : 0;
    case SQ_MSG_SHUTDOWN:
        if (s->o.remote) {
            /* squishd stops (a restart, say): this host's worker stays, with
             * its models, and joins it (or another) again. */
            connection_lost(s, "squishd shut down");
            return 0;
        }
        SQ_INFO("shutdown requested");
        finish(s, 0);
        return 0;
    case SQ_MSG_MODEL_LOAD: {
        sq_model_load_t *spec = sq_xmalloc(sizeof(*spec));
        if (sq_model_load_decode(f, spec) != 0 || s->rx.spec != NULL) {
            free(spec);
            return -1;
        }
        if (spec->format == SQ_FORMAT_GROUP) {
            queue_group_load(s, f->id, spec);
            return 0;
        }
        if (spec->format == SQ_FORMAT_EMULATED) {
            queue_load(s, f->id, spec, NULL);
            return 0;
        }
        /* Bytes this connection already sent (for this model or a group). */
        cached_t *c = cache_find(s, spec->sha256);
        if (c == NULL && spec->total_bytes == 0) {
            reply_failed(s, f->id, SQ_PROTOCOL, "model bytes neither sent nor held");
            free(spec);
            return 0;
        }
        if (c != NULL) {
            if (spec->cache_only)
                free(spec);
            else
                queue_load(s, f->id, spec, c);
            return 0;
        }
        if (spec->cached) {
            reply_failed(s, f->id, SQ_PROTOCOL, "model bytes marked cached but not held");
            free(spec);
            return 0;
        }
        if (spec->total_bytes > ((uint64_t)4 << 30)) {
            reply_failed(s, f->id, SQ_TOO_LARGE, "model larger than 4 GiB");
            free(spec);
            return 0;
        }
        s->rx.key = f->id;
        s->rx.spec = spec;
        s->rx.bytes = file_alloc(spec->total_bytes);
        s->rx.have = 0;
        s->rx.digest = mdb_sha256_begin();
        s->rx.started_ns = sq_now_ns();
        if (s->rx.bytes == NULL) {
            mdb_sha256_free(s->rx.digest);
            reply_failed(s, f->id, SQ_NOMEM, "cannot hold the model file");
            free(spec);
            memset(&s->rx, 0, sizeof(s->rx));
        }
        return 0;
    }
    case SQ_MSG_MODEL_CHUNK:
        if (s->rx.spec == NULL) /* a transfer we refused: skip its chunks */
            return 0;
        if (f->id != s->rx.key || s->rx.have + f->len > s->rx.spec->total_bytes)
            return -1;
        /* Hashed chunk by chunk: the digest of a whole 500 MB file at the
         * end would hold this thread (and its PONGs) for a second or more
         * on a CPU without SHA extensions. */
        memcpy(s->rx.bytes + s->rx.have, f->payload, f->len);
        mdb_sha256_update(s->rx.digest, f->payload, f->len);
        s->rx.have += f->len;
        if (s->rx.have == s->rx.spec->total_bytes)
            rx_complete(s);
        return 0;
    case SQ_MSG_MODEL_UNLOAD: {
        job_t *j = sq_xcalloc(1, sizeof(*j));
        j->kind = JOB_UNLOAD;
        j->id = f->id;
        enqueue(s, j);
        return 0;
    }
    case SQ_MSG_BATCH_INPUT:
        /* A remote batch's inputs, before its BATCH. */
        if (!s->o.remote || (s->rin.active && s->rin.id != f->id) ||
            s->rin.bytes.len + f->len > SQ_REMOTE_MAX_BATCH_BYTES)
            return -1;
        s->rin.active = 1;
        s->rin.id = f->id;
        sq_buf_put(&s->rin.bytes, f->payload, f->len);
        return 0;
    case SQ_MSG_BATCH: {
        if (s->o.remote && (!s->rin.active || s->rin.id != f->id))
            return -1;
        job_t *j = sq_xcalloc(1, sizeof(*j));
        j->kind = JOB_BATCH;
        j->id = f->id;
        j->batch = sq_xmalloc(sizeof(*j->batch));
        if (sq_batch_decode(f, j->batch) != 0) {
            free(j->batch);
            free(j);
            return -1;
        }
        if (s->o.remote) {
            /* The job takes the bytes. */
            j->input = s->rin.bytes.data;
            j->input_len = s->rin.bytes.len;
            sq_buf_init(&s->rin.bytes);
            s->rin.active = 0;
        }
        SQ_DEBUG("batch received id=%llu count=%u", (unsigned long long)f->id, j->batch->count);
        enqueue(s, j);
        return 0;
    }
    case SQ_MSG_PROFILE: {
        job_t *j = sq_xcalloc(1, sizeof(*j));
        j->kind = JOB_PROFILE;
        j->id = f->id;
        if (sq_profile_req_decode(f, &j->profile) != 0) {
            free(j);
            return -1;
        }
        enqueue(s, j);
        return 0;
    }
    default:
        SQ_WARN("unexpected message type=%s", sq_msg_name(f->type));
        return -1;
    }
}

static void on_socket(sq_loop_t *loop, int fd, int events, void *data)
{
    server_t *s = data;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(s->conn);
        if (rc < 0) {
            if (s->o.remote) {
                connection_lost(s, strerror(-rc));
                return;
            }
            finish(s, 1);
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(s->conn);
    if (rc == 0) {
        if (s->o.remote) {
            connection_lost(s, "closed by squishd");
            return;
        }
        SQ_INFO("squishd closed the connection; exiting");
        finish(s, 0);
        return;
    }
    if (rc < 0 && rc != -EAGAIN) {
        if (s->o.remote) {
            connection_lost(s, strerror(-rc));
            return;
        }
        SQ_ERROR("read from squishd failed: %s", strerror(-rc));
        finish(s, 1);
        return;
    }
    s->last_heard_ns = sq_now_ns();
    sq_frame_t f;
    while ((rc = sq_conn_next(s->conn, &f)) == 1) {
        if (handle_frame(s, &f) != 0) {
            SQ_ERROR("protocol error from squishd type=%s", sq_msg_name(f.type));
            if (s->o.remote) {
                connection_lost(s, "protocol error");
                return;
            }
            finish(s, 1);
            return;
        }
        if (s->exit_status >= 0 || s->lost)
            return;
    }
    if (rc < 0) {
        SQ_ERROR("protocol error from squishd");
        if (s->o.remote) {
            connection_lost(s, "protocol error");
            return;
        }
        finish(s, 1);
        return;
    }
    if (sq_conn_pending(s->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* ---- a remote worker's connections -------------------------------------- */

/* Jobs still queued came on a connection that is gone: nobody waits for
 * their answers (squishd re-sends what it still wants). */
static void drop_queued(server_t *s)
{
    jobq_replace(&s->execq, NULL);
}

/* What belonged to the connection: a file half received, a batch's inputs. */
static void reset_connection_state(server_t *s)
{
    if (s->rx.spec != NULL)
        file_free(s->rx.bytes, s->rx.spec->total_bytes);
    free(s->rx.spec);
    mdb_sha256_free(s->rx.digest);
    memset(&s->rx, 0, sizeof(s->rx));
    sq_buf_dispose(&s->rin.bytes);
    s->rin.active = 0;
}

static void on_socket(sq_loop_t *loop, int fd, int events, void *data);

/* Joins squishd (the opts' reconnect: tries its addresses with backoff and
 * does the handshake), telling it which model files this worker holds.
 * Returns 0, 1 when the worker was told to stop, or -1 when it gives up. */
static int join(server_t *s)
{
    sq_buf_t held;
    sq_buf_init(&held);
    uint32_t n = 0;
    for (cached_t *c = s->cache; c != NULL && n < SQ_MAX_HELD; c = c->next)
        n++;
    char(*shas)[65] = n > 0 ? sq_xcalloc(n, sizeof(*shas)) : NULL;
    uint32_t i = 0;
    for (cached_t *c = s->cache; c != NULL && i < n; c = c->next)
        memcpy(shas[i++], c->sha256, 65);
    sq_models_held_encode(&held, n, (const char(*)[65])shas);
    free(shas);
    sq_conn_t *conn = NULL;
    uint32_t hb = 0;
    int rc = s->o.reconnect(s->o.reconnect_ctx, &held, &conn, &hb);
    sq_buf_dispose(&held);
    if (rc != 0)
        return rc > 0 ? 1 : -1;
    s->conn = conn;
    s->conn_gen++;
    s->lost = 0;
    s->heartbeat_ms = hb > 0 ? hb : 200;
    s->last_heard_ns = sq_now_ns();
    int err = sq_loop_watch(s->loop, conn->fd, SQ_EV_READ, on_socket, s);
    if (err != 0) {
        SQ_ERROR("cannot watch the squishd socket error=\"%s\"", strerror(-err));
        return -1;
    }
    if (n > 0)
        SQ_INFO("rejoined with model files held=%u", n);
    return 0;
}

/* o.kept_models_ms after a rejoin: the execution thread drops the
 * models this connection did not load again. */
static void on_sweep(sq_loop_t *loop, uint64_t id, void *data)
{
    server_t *s = data;
    (void)loop;
    (void)id;
    s->sweep_timer = 0;
    if (s->lost || s->exit_status >= 0)
        return; /* the next rejoin arms it again */
    job_t *j = sq_xcalloc(1, sizeof(*j));
    j->kind = JOB_SWEEP;
    enqueue(s, j);
}

static void on_rejoin(sq_loop_t *loop, uint64_t id, void *data)
{
    server_t *s = data;
    (void)loop;
    (void)id;
    drop_queued(s);
    reset_connection_state(s);
    int rc = join(s);
    if (rc != 0) {
        finish(s, rc > 0 ? 0 : 1);
        return;
    }
    if (s->sweep_timer != 0)
        sq_loop_timer_cancel(s->loop, s->sweep_timer);
    s->sweep_timer = sq_loop_timer_at(s->loop, sq_now_ns() + (int64_t)s->o.kept_models_ms * 1000000,
                                      on_sweep, s);
    /* Frames that came with WELCOME. */
    sq_frame_t f;
    while (s->exit_status < 0 && !s->lost && sq_conn_next(s->conn, &f) == 1)
        if (handle_frame(s, &f) != 0)
            connection_lost(s, "protocol error");
}

static void connection_lost(server_t *s, const char *why)
{
    if (s->lost)
        return;
    SQ_WARN("connection to squishd lost reason=\"%s\"; reconnecting (models kept)", why);
    s->lost = 1;
    sq_loop_unwatch(s->loop, s->conn->fd);
    sq_loop_timer_at(s->loop, sq_now_ns(), on_rejoin, s);
}

/* A remote link can die without a word (a cable, a firewall): squishd
 * pings every heartbeat_ms, so silence for several of them means it is
 * gone. */
static void on_silence_tick(sq_loop_t *loop, uint64_t id, void *data)
{
    server_t *s = data;
    (void)id;
    int64_t now = sq_now_ns();
    int64_t limit = (int64_t)s->heartbeat_ms * 5 * 1000000;
    if (limit < (int64_t)2000 * 1000000)
        limit = (int64_t)2000 * 1000000;
    if (!s->lost && now - s->last_heard_ns > limit)
        connection_lost(s, "squishd silent");
    s->silence_timer = sq_loop_timer_at(loop, now + (int64_t)250 * 1000000, on_silence_tick, s);
}

/* A remote worker's stop_fd became readable (SIGTERM, SIGINT). */
static void on_stop(sq_loop_t *loop, int fd, int events, void *data)
{
    server_t *s = data;
    (void)loop;
    (void)events;
    char info[128]; /* a signalfd_siginfo: consumed, so that nothing else sees it */
    ssize_t n = read(fd, info, sizeof(info));
    (void)n;
    SQ_INFO("stopping on a signal");
    finish(s, 0);
}

int wk_serve(const wk_serve_opts_t *opts)
{
    server_t s = {.o = *opts, .conn = opts->conn, .exit_status = -1};
    if (s.o.kept_models_ms <= 0)
        s.o.kept_models_ms = WK_KEPT_MODELS_MS;
    s.loop = sq_loop_new();
    if (s.loop == NULL)
        return 1;
    jobq_init(&s.execq);
    pthread_mutex_init(&s.reply_lock, NULL);
    pthread_cond_init(&s.reply_cond, NULL);
    jobq_init(&s.loadq);
    int err = pthread_create(&s.loader, NULL, loader_thread, &s);
    if (err != 0) {
        SQ_ERROR("cannot start the loader thread error=\"%s\"", strerror(err));
        jobq_destroy(&s.loadq);
        pthread_cond_destroy(&s.reply_cond);
        pthread_mutex_destroy(&s.reply_lock);
        jobq_destroy(&s.execq);
        sq_loop_free(s.loop);
        return 1;
    }
    err = pthread_create(&s.exec, NULL, exec_thread, &s);
    if (err != 0) {
        loader_stop(&s);
        jobq_destroy(&s.loadq);
        SQ_ERROR("cannot start the execution thread error=\"%s\"", strerror(err));
        pthread_cond_destroy(&s.reply_cond);
        pthread_mutex_destroy(&s.reply_lock);
        jobq_destroy(&s.execq);
        sq_loop_free(s.loop);
        return 1;
    }
    sq_buf_init(&s.rin.bytes);
    if (opts->remote) {
        int rc = join(&s);
        if (rc != 0)
            finish(&s, rc > 0 ? 0 : 1);
        else
            s.silence_timer =
                sq_loop_timer_at(s.loop, sq_now_ns() + (int64_t)250 * 1000000, on_silence_tick, &s);
        if (opts->stop_fd >= 0 && s.exit_status < 0 &&
            sq_loop_watch(s.loop, opts->stop_fd, SQ_EV_READ, on_stop, &s) != 0)
            finish(&s, 1);
    } else if ((err = sq_loop_watch(s.loop, opts->fd, SQ_EV_READ, on_socket, &s)) != 0) {
        SQ_ERROR("cannot watch the squishd socket error=\"%s\"", strerror(-err));
        finish(&s, 1);
    }
    /* Frames that arrived with WELCOME are handled before waiting. */
    sq_frame_t f;
    while (s.exit_status < 0 && !s.lost && sq_conn_next(s.conn, &f) == 1)
        if (handle_frame(&s, &f) != 0)
            finish(&s, 1);
    if (s.exit_status < 0)
        sq_loop_run(s.loop);

    /* Stop the execution thread after the work it has (a batch in flight
     * finishes; its answer is dropped with the connection). */
    pthread_mutex_lock(&s.reply_lock);
    s.io_done = 1; /* the loop runs no more posts until after the join */
    pthread_cond_broadcast(&s.reply_cond);
    pthread_mutex_unlock(&s.reply_lock);
    job_t *stop = sq_xcalloc(1, sizeof(*stop));
    stop->kind = JOB_STOP;
    drop_queued(&s);
    enqueue(&s, stop);
    pthread_join(s.exec, NULL);
    loader_stop(&s);
    drop_queued(&s); /* models the loader finished after the stop */
    while (s.building != NULL) {
        building_t *b = s.building;
        s.building = b->next;
        free(b);
    }
    while (s.models != NULL)
        drop_model(&s, s.models->key);
    measure_free(s.meas);
    for (cached_t *c = s.cache, *n; c != NULL; c = n) {
        n = c->next;
        file_free(c->bytes, c->len);
        free(c);
    }
    reset_connection_state(&s);
    free(s.staging);
    sq_loop_run_posts(s.loop); /* replies still posted are dropped (exit_status set) */
    sq_loop_free(s.loop);
    jobq_destroy(&s.execq);
    pthread_mutex_destroy(&s.reply_lock);
    pthread_cond_destroy(&s.reply_cond);
    jobq_destroy(&s.loadq);
    return s.exit_status < 0 ? 1 : s.exit_status;
}
