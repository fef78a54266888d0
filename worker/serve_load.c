/* Loading models (serve_int.h): the execution thread answers a load of a
 * model it kept across a reconnect at once and hands any other to the
 * loader thread, which imports and compiles it while batches of the models
 * held go on running; the execution thread then installs it. Unloads and
 * the sweep after a reconnect drop models. */
#include "serve_int.h"
#include "wk_fault.h"

#include <mdb.h>
#include <mdb_graph.h>
#include <oneapi/dnnl/dnnl.h>

#include <malloc.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The sizes squishd serves the input at past the batch (the model's
 * record: the file's, or what the upload pinned its symbolic sizes to):
 * the file is imported with them, so that a file exported with a dynamic
 * height and width plans as the static model it is served as. */
int wk__cpu_plan_batch(void)
{
    const char *e = getenv("SQUISH_CPU_PLAN_BATCH");
    long v = e != NULL ? strtol(e, NULL, 10) : 0;
    return v >= 1 && v <= SQ_MAX_BATCH_ITEMS ? (int)v : WK_CPU_PLAN_BATCH;
}

static mdb_input_pin_t load_pin(const sq_model_load_t *spec)
{
    mdb_input_pin_t pin = {0};
    if (spec->in_chw[0] > 0 && spec->in_chw[1] > 0 && spec->in_chw[2] > 0) {
        pin.rank = 3;
        for (int d = 0; d < 3; d++)
            pin.dims[d] = spec->in_chw[d];
    }
    return pin;
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
    /* Members share their input (squishd groups only those). */
    mdb_input_pin_t pin = load_pin(spec);
    for (int i = 0; i < n && rc == 0; i++) {
        mdb_import_error_t ierr;
        cuts[i] = spec->members[i].cut;
        rc = mdb_onnx_import_pinned(j->member_bytes[i], j->member_nbytes[i], &pin, &graphs[i],
                                    &ierr);
        wk__file_idle(j->member_bytes[i], j->member_nbytes[i], j->member_file[i]);
        if (rc != 0)
            snprintf(why, (size_t)why_size, "member %d import: %s %s", i, ierr.detail, ierr.ops);
    }
    if (rc == 0)
        rc = wk_group_create((const mdb_graph_t *const *)graphs, cuts, n, opts, out, why, why_size);
    for (int i = 0; i < n; i++)
        mdb_graph_free(graphs[i]);
    return rc;
}

static void reply_loaded(server_t *s, uint64_t key, const model_t *m)
{
    reply_t *r = wk__reply_new(s, SQ_MSG_MODEL_LOADED, key);
    sq_model_loaded_t loaded = {.memory_bytes = wk__model_memory(m),
                                .max_batch = (uint32_t)wk__model_max_batch(m),
                                .in_elems = (uint64_t)m->in_elems,
                                .out_elems = (uint64_t)m->out_elems,
                                .in_hw = {(uint32_t)m->pixel_h, (uint32_t)m->pixel_w}};
    sq_model_loaded_encode(&r->payload, &loaded);
    wk__reply_post(s, r);
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
            m->precision == spec->precision && memcmp(m->mean, spec->mean, sizeof(m->mean)) == 0 &&
            memcmp(m->std, spec->std, sizeof(m->std)) == 0)
            return m;
    return NULL;
}

/* Models no load on the current connection asked for (JOB_SWEEP). */
void wk__sweep_models(server_t *s, uint64_t gen)
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
        wk__model_free(m);
    }
}

/* The name of the instruction set oneDNN's kernels run on here. */
static const char *cpu_isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41:
        return "SSE4.1";
    case dnnl_cpu_isa_avx:
        return "AVX";
    case dnnl_cpu_isa_avx2:
        return "AVX2";
    case dnnl_cpu_isa_avx2_vnni:
        return "AVX2 with VNNI";
    case dnnl_cpu_isa_avx512_core:
        return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni:
        return "AVX-512 with VNNI";
    default:
        return "an older one";
    }
}

/* Whether a cpu worker refuses spec for its precision: bf16 runs oneDNN's
 * bf16 kernels, which need AVX512_BF16 or AMX (what oneDNN reports for
 * this CPU, which DNNL_MAX_CPU_ISA can lower). On a CPU without them it is
 * refused with the reason (the model's status then names it: not_on, or
 * the profile's failure where no other device kind can run it), not run
 * in FP32 behind the asker's back; fp16 and tf32, which no x86 CPU of
 * these kinds runs, still run FP32 and say so. The precision fault
 * (WK_FAULT_PRECISION) stands for a CPU that has them. */
static bool refuses_precision(const server_t *s, const sq_model_load_t *spec, char *why,
                              size_t why_size)
{
    if (s->o.dev.kind != SQ_DEV_CPU || spec->format != SQ_FORMAT_ONNX ||
        spec->precision != WK_PRECISION_BF16 || wk_fault_check(WK_FAULT_PRECISION, spec->sha256))
        return false;
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16)
        return false;
    snprintf(why, why_size,
             "precision bf16 needs a CPU with AVX512_BF16 or AMX; this worker's has %s at best: "
             "upload the model with \"precision\": \"fp32\", or serve it on a cuda worker",
             cpu_isa_name(isa));
    return true;
}

/* LOAD, execution thread: a model kept from before a reconnect answers at
 * once; any other is built by the loader thread (the batches of the models
 * held go on meanwhile) and installed when it is done (JOB_INSTALL).
 * Returns 1 when j went to the loader. */
int wk__do_load(server_t *s, job_t *j)
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
        wk__reply_failed(s, j->id, SQ_UNSUPPORTED_MODEL, "injected refusal (SQUISH_WORKER_FAULT)");
        return 0;
    }
    char why[320];
    if (refuses_precision(s, spec, why, sizeof(why))) {
        wk__reply_failed(s, j->id, SQ_UNSUPPORTED_MODEL, why);
        return 0;
    }
    building_t *b = sq_xcalloc(1, sizeof(*b)), **tail = &s->building;
    b->key = j->id;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = b;
    wk__jobq_push(&s->loadq, j);
    return 1;
}

/* The load's precision is a wk_precision_t (sq_device.h names the same
 * values; tests/worker/test_exec.c checks the names). */
_Static_assert(WK_PRECISION_COUNT_ == SQ_PRECISION_COUNT, "one list of precisions");

/* Loader thread: a plan that runs other than FP32 gets the row an FP32
 * plan of the same graph gives for item 0 of the profiling input, against
 * which the profile measures its deviation (serve_profile.c). The FP32
 * plan is made for batch 1 and freed at once: it costs the load time of
 * a small plan, and holds no memory past it. */
static void fp32_reference(const mdb_graph_t *g, const wk_plan_opts_t *opts, model_t *m)
{
    if (m->runs == WK_PRECISION_FP32)
        return;
    char why[512] = "";
    wk_plan_opts_t ref_opts = *opts;
    ref_opts.precision = WK_PRECISION_FP32;
    ref_opts.max_batch = 1;
    wk_plan_t *ref = NULL;
    int rc = wk_plan_create(g, &ref_opts, &ref, why, sizeof(why));
    if (rc == 0 && (wk_plan_row_elems(ref) != m->out_elems ||
                    (m->pixel_h == 0 && wk_plan_n_inputs(ref) != 1))) {
        rc = SQ_INVAL;
        snprintf(why, sizeof(why), "the FP32 plan's outputs differ from the model's");
    }
    if (rc == 0) {
        size_t item =
            m->pixel_h > 0 ? (size_t)m->pixel_h * m->pixel_w * 3 : (size_t)m->in_elems * 4;
        uint8_t *in = sq_xmalloc(item);
        float *out = sq_xmalloc((size_t)m->out_elems * sizeof(float));
        wk__profile_input(m->pixel_h > 0, item, 1, in);
        const float *ins[1] = {(const float *)in};
        rc = m->pixel_h > 0 ? wk_plan_run_pixels(ref, 1, in, out)
                            : wk_plan_run_rows(ref, 1, ins, out);
        if (rc != 0) {
            snprintf(why, sizeof(why), "the FP32 plan's run: %s", wk_plan_errmsg(ref));
            free(out);
        } else {
            m->ref_out = out;
        }
        free(in);
    }
    wk_plan_free(ref);
    if (rc != 0)
        m->ref_why = sq_xstrdup(why[0] ? why : sq_err_msg(rc));
}

/* Loader thread: builds j's model into j->built (or says why not), then
 * hands j back to the execution thread as INSTALL. */
static void build_model(server_t *s, job_t *j)
{
    const sq_model_load_t *spec = j->load;
    char why[512] = "";
    wk_plan_opts_t opts = wk_plan_opts_default();
    opts.backend = s->o.dev.kind;
    opts.device_index = s->o.dev.index;
    opts.max_batch = (int)spec->max_batch;
    int plan_batch = wk__cpu_plan_batch();
    if (opts.backend == SQ_DEV_CPU && spec->format == SQ_FORMAT_ONNX && opts.max_batch > plan_batch)
        opts.max_batch = plan_batch;
    opts.threads = s->o.threads;
    /* cpu: the kernels of the sizes the model's profile reaches here made
     * now, any other size's at its first run. A first load, to be
     * profiled, makes every size (here, on the loader thread, not in the
     * profile's slices between other models' batches); the profile then
     * gives back those past its reach (serve_profile.c). */
    opts.ready_batch = (int)spec->ready_batch;
    opts.precision = (wk_precision_t)spec->precision;
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
    mdb_graph_t *onnx_graph = NULL;
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
        mdb_input_pin_t pin = load_pin(spec);
        rc = mdb_onnx_import_pinned(j->bytes, j->nbytes, &pin, &g, &ierr);
        wk__file_idle(j->bytes, j->nbytes, j->bytes_file); /* the graph holds its copy */
        import_ms = (sq_now_ns() - started_ns) / 1000000;
        if (rc != 0)
            snprintf(why, sizeof(why), "import: %s %s", ierr.detail, ierr.ops);
        else
            rc = wk_plan_create(g, &opts, &plan, why, sizeof(why));
        if (rc == 0)
            onnx_graph = g; /* for the FP32 reference, below */
        else
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
        m->out_elems = wk__model_out_elems(m);
        m->asked_max_batch = spec->max_batch;
        /* planned for fewer (wk__cpu_plan_batch), it serves the rest in
         * pieces; a static plan (max batch 1 whatever was asked) does not */
        if (plan != NULL && opts.max_batch < (int)spec->max_batch &&
            wk_plan_max_batch(plan) == opts.max_batch)
            m->max_batch = (int)spec->max_batch;
        memcpy(m->mean, spec->mean, sizeof(m->mean));
        memcpy(m->std, spec->std, sizeof(m->std));
        m->bgr = spec->bgr;
        m->precision = spec->precision;
        m->runs = (uint8_t)wk_plan_precision(front);
        if (wk_fault_check(WK_FAULT_PRECISION, spec->sha256))
            m->runs = spec->precision;
        m->gen = j->gen;
        if (onnx_graph != NULL)
            fp32_reference(onnx_graph, &opts, m);
    }
    mdb_graph_free(onnx_graph);
    j->built = m;
    j->build_rc = rc;
    j->build_why = rc != 0 ? sq_xstrdup(why) : NULL;
    j->import_ms = import_ms;
    j->load_ms = (sq_now_ns() - started_ns) / 1000000;
    j->kind = JOB_INSTALL;
    wk__jobq_push(&s->execq, j); /* its connection number kept */
}

/* Execution thread, between batches: m's plan runs in the arena the
 * models share from now on (cpu plans; the other backends keep their
 * own). A prefix group's plans join too: its prefix writes its output into
 * the group's own buffer, which the suffixes read, so none of them needs
 * another's activations after its run. A plan that cannot join keeps its
 * own arena. */
static void share_arena(server_t *s, model_t *m)
{
    const wk_plan_t *front = m->group != NULL ? wk_group_prefix(m->group) : m->plan;
    if (front == NULL || wk_plan_backend(front) != SQ_DEV_CPU)
        return;
    if (s->arena == NULL)
        s->arena = wk_arena_new();
    char why[256] = "";
    int rc = m->group != NULL ? wk_group_share_arena(m->group, s->arena, why, sizeof(why))
                              : wk_plan_share_arena(m->plan, s->arena, why, sizeof(why));
    if (rc != 0) {
        SQ_WARN("model keeps its own arena key=%llu reason=\"%s\"", (unsigned long long)m->key,
                why);
        return;
    }
    SQ_INFO("arena shared key=%llu plans=%d arena_mb=%.1f resident_mb=%.1f",
            (unsigned long long)m->key, wk_arena_n_plans(s->arena),
            (double)wk_arena_bytes(s->arena) / (1 << 20),
            (double)wk_arena_resident_bytes(s->arena) / (1 << 20));
}

/* INSTALL, execution thread: the built model replaces any held under its
 * key, unless an unload came meanwhile (it is answered all the same: the
 * unload's sender counts on an answer to every load). */
void wk__do_install(server_t *s, job_t *j)
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
        wk__reply_failed(s, j->id, j->build_rc, j->build_why);
        return;
    }
    if (!cancelled)
        share_arena(s, m);
    reply_loaded(s, j->id, m);
    if (cancelled) {
        wk__model_free(m);
        return;
    }
    wk__model_drop(s, j->id);
    m->next = s->models;
    s->models = m;
    SQ_INFO("model loaded key=%llu sha256=%.12s backend=%s max_batch=%d planned_batch=%d "
            "ready_batch=%u sizes_ready=%d "
            "memory_mb=%llu members=%u precision=%s runs=%s import_ms=%lld load_ms=%lld",
            (unsigned long long)j->id, spec->sha256, sq_dev_kind_name(s->o.dev.kind),
            wk__model_max_batch(m),
            m->group != NULL ? wk_group_max_batch(m->group) : wk_plan_max_batch(m->plan),
            spec->ready_batch, m->group != NULL ? -1 : wk_plan_sizes_ready(m->plan),
            (unsigned long long)(wk__model_memory(m) >> 20), spec->n_members,
            sq_precision_name(spec->precision), wk_precision_name((wk_precision_t)m->runs),
            (long long)j->import_ms, (long long)j->load_ms);
}

/* UNLOAD, execution thread: drops the model and cancels its loads still
 * being built. */
void wk__do_unload(server_t *s, uint64_t key)
{
    for (building_t *b = s->building; b != NULL; b = b->next)
        if (b->key == key)
            b->cancelled = 1;
    wk__model_drop(s, key);
}

/* Stops the loader thread: loads it has not started are dropped, one it
 * is building finishes (and lands in the execution queue). */
void wk__loader_stop(server_t *s)
{
    job_t *stop = sq_xcalloc(1, sizeof(*stop));
    stop->kind = JOB_STOP;
    wk__jobq_replace(&s->loadq, stop);
    pthread_join(s->loader, NULL);
}

void *wk__loader_thread(void *arg)
{
    server_t *s = arg;
    for (;;) {
        job_t *j = wk__jobq_pop(&s->loadq);
        if (j->kind == JOB_STOP) {
            free(j);
            return NULL;
        }
        build_model(s, j);
        /* The import's and the planner's transient copies of the weights
         * went back to malloc, which by default keeps freed heap resident:
         * given back, the worker holds what its models hold. */
        malloc_trim(0);
    }
}
