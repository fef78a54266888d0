/* sched/: what the rooms above ask of a scheduler, below both schedulers
 * (the dispatcher, dispatch/, and a frontend's link to the cluster's,
 * front/). A header only: the item, its lifecycle (made by its owner,
 * settled into a clump, submitted, answered exactly once through its
 * finish callback), the priority levels, and the scheduling interface
 * (gw_sched_t) that server.c picks an implementation of once. */
#ifndef GW_SCHED_H
#define GW_SCHED_H

#include "gw_catalog.h"

#include <pl_dispatch.h>

#include <stdatomic.h>
#include <stdint.h>

/* Dispatch priority levels, 1 the highest (a dispatcher session per level:
 * pl_session_cfg_t.priority). A request asks with Triton's numbers (OIP
 * parameters.priority, or X-Priority): 0 = the default level, 1 the
 * highest, a larger number lower; numbers past the last level count as the
 * last. The default sits one below the top so that a request can be
 * marked both above and below the traffic that does not say. */
#define GW_PRIORITY_LEVELS 4
#define GW_PRIORITY_DEFAULT 2

/* The level of a requested priority (>= 0). */
static inline int gw_priority_level(int64_t asked)
{
    return asked <= 0                   ? GW_PRIORITY_DEFAULT
           : asked > GW_PRIORITY_LEVELS ? GW_PRIORITY_LEVELS
                                        : (int)asked;
}

typedef struct gw_item gw_item_t;
struct gw_infer;
struct gw_pipeline;

/* Why an item is abandoned (gw_item_owner_t.abandoned's values). */
#define GW_ABANDONED_FAILED 1
#define GW_ABANDONED_GONE 2

/* What is asked of the scheduler: the work and its terms. Set by the
 * owner before the item is submitted; the scheduler only reads it. */
typedef struct {
    gw_model_t *model; /* the owner's reference */
    double slo_ms;
    int64_t arrival_us, deadline_us;
    uint8_t input_kind; /* SQ_INPUT_* */
    uint8_t priority;   /* 1..GW_PRIORITY_LEVELS; 0 = the default level */
    /* 1: nobody asked for an SLO: slo_ms is only what it is planned at
     * (PL_LOOP_BEST_EFFORT_MS) and deadline_us the server's bound
     * (--max-request-ms); its session is best effort (pl_session_cfg_t). */
    uint8_t best_effort;
} gw_item_ask_t;

/* A pipeline query's item: the pipeline (the query holds a reference
 * while the item lives), the item's stage and the query's SLO; pipeline
 * NULL otherwise. The planner counts it toward that stage, whose session
 * follows the split when its budget moves. */
typedef struct {
    struct gw_pipeline *pipeline;
    int stage;
    double query_slo_ms;
} gw_item_stage_t;

/* Where the item's input is: src 0 in this process's arena (in_off; -1
 * when none yet); src k > 0 with frontend k - 1, which holds it as fe_slot
 * (a dispatcher's record of a frontend's item: it has no owner here, and
 * the frontend answers the client). */
typedef struct {
    int64_t in_off;
    uint32_t src;
    uint64_t fe_slot;
} gw_item_input_t;

/* Its owner: who made it and how it is answered. */
typedef struct {
    struct gw_infer *req; /* an inference request's item (api/); NULL otherwise */
    int index;            /* its row in the request */
    float *out;           /* its output row (model->out_elems floats) */
    /* Called exactly once, on any thread, with the item's outcome. */
    void (*finish)(gw_item_t *item, int rc, const char *detail);
    /* Not NULL: when it reads non-zero, the item is no longer wanted: its
     * request or pipeline query failed for another item
     * (GW_ABANDONED_FAILED) or its client went away (GW_ABANDONED_GONE).
     * The scheduler takes it out of its queues (withdraw) or fails it
     * instead of sending it, and counts it as withdrawn. */
    const atomic_int *abandoned;
    /* The next item of its clump: items ready together (the images of one
     * request, the crops of one detection run) are submitted as one chain;
     * NULL: the last, or alone. */
    gw_item_t *clump_next;
} gw_item_owner_t;

/* What happened to it, for the owner's timings and traces once it is
 * answered. */
typedef struct {
    int64_t ready_us; /* preprocessed and handed to the scheduler */
    int64_t sent_us;  /* its batch went to a worker */
    int64_t done_us;
    /* Its batch's run on the worker, placed on squishd's clock (done, from
     * BATCH_DONE's exec_ns and total_ns): it ends as the worker's reply
     * leaves, half the round trip outside the worker before done_us, and
     * lasts exec_ns. 0 when it did not run. */
    int64_t exec_start_us, exec_end_us;
    int batch_size;
} gw_item_times_t;

/* The scheduler's own bookkeeping while it holds the item. */
typedef struct {
    void *holder;     /* the scheduler it was submitted to (set by submit) */
    uint64_t core_id; /* its handle in the dispatcher core (0: none) */
    int core_session; /* its dispatcher session while queued */
    int member;       /* in a prefix group's batch: its model's index there */
} gw_item_held_t;

/* One image or tensor row of a request, or one node of a pipeline query:
 * the unit a scheduler queues, batches and answers. Its concerns apart:
 * the ask and stage (the owner's, read-only below), the input's place, the
 * owner's answer path, the timings, and the scheduler's bookkeeping. */
struct gw_item {
    gw_item_ask_t ask;
    gw_item_stage_t pipe;
    gw_item_input_t input;
    gw_item_owner_t owner;
    gw_item_times_t times;
    gw_item_held_t held;
};

/* Gathers the items of one request that become ready at different times,
 * on any threads (each image's decode), into one clump: the scheduler
 * then sees them arrive together, as they did (one arrival: at low load
 * one batch at once, not the first alone and the rest read as a burst and
 * deferred). The request is answered when its last item is anyway, so the
 * early ones lose nothing by waiting for it. */
typedef struct {
    atomic_int unsettled;       /* items neither ready nor failed yet */
    _Atomic(gw_item_t *) ready; /* those ready, linked through clump_next */
} gw_clump_t;

static inline void gw_clump_init(gw_clump_t *c, int items)
{
    atomic_init(&c->unsettled, items);
    atomic_init(&c->ready, NULL);
}

/* One item of c is settled: item ready, or NULL for one that failed before
 * the scheduler saw it. Returns the ready items as a chain, in the order
 * of their index, to the caller that settled the last one (the chain may
 * be NULL when none is ready); NULL to every other caller. Any thread. */
static inline gw_item_t *gw_clump_settle(gw_clump_t *c, gw_item_t *item)
{
    if (item != NULL) {
        gw_item_t *head = atomic_load(&c->ready);
        do
            item->owner.clump_next = head;
        while (!atomic_compare_exchange_weak(&c->ready, &head, item));
    }
    if (atomic_fetch_sub(&c->unsettled, 1) != 1)
        return NULL;
    /* Pushed in the order they settled: sorted back into request order. */
    gw_item_t *chain = NULL, *it = atomic_exchange(&c->ready, NULL);
    while (it != NULL) {
        gw_item_t *next = it->owner.clump_next, **at = &chain;
        while (*at != NULL && (*at)->owner.index < it->owner.index)
            at = &(*at)->owner.clump_next;
        it->owner.clump_next = *at;
        *at = it;
        it = next;
    }
    return chain;
}

/* ---- the scheduling interface ------------------------------------------
 * What the rooms above ask of whoever schedules this process's items: the
 * dispatcher (gw_dispatch_sched) or, with --role frontend, the link to the
 * cluster's dispatcher (gw_front_sched). server.c picks one and sets
 * gw_server_t.sched; nothing else asks which. Every member is for any
 * thread. */

typedef struct gw_sched gw_sched_t;

/* The least latency a request can get, as the scheduler plans it: n items
 * of m alone on an idle worker of kind, in batches of at most the model's
 * max_batch one after the other, each l(b) on the profile the scheduler
 * uses with the k_std margin, and the dispatch margin once
 * (pl_dispatch_least_us). Admission's refusals ("ask for N ms or more")
 * and deadlines are this, so that they say what dispatch will do. */
typedef struct {
    int64_t run_us;    /* the batches' latencies */
    int64_t margin_us; /* the dispatch margin (also when unknown) */
} gw_least_t;

/* The fleet as one scheduler sees it: workers up, per device kind, and
 * supervised workers being restarted (or not yet past their handshake),
 * whose models' requests wait for them within their deadlines instead of
 * being refused no_worker. Each scheduler keeps its own, written by one
 * thread, and answers from it. */
typedef struct {
    int workers_up;
    int up[SQ_DEV_KIND_COUNT];
    int coming[SQ_DEV_KIND_COUNT];
    int64_t
        back_at_us[SQ_DEV_KIND_COUNT]; /* when the first coming should be up; INT64_MAX unknown */
} gw_fleet_t;

typedef struct {
    /* The item's input is in place: take it (with items linked from it
     * through clump_next: a clump, one arrival). Each item is answered
     * through its finish, exactly once. */
    void (*submit)(gw_sched_t *s, gw_item_t *first);
    /* Some items were abandoned: those still queued leave the queues (no
     * batch is sized for them) and are failed as withdrawn. Calls that
     * come before it looks are one look. */
    void (*withdraw)(gw_sched_t *s);
    /* 1 when every ready model can be served now, else 0 with why. */
    int (*ready)(gw_sched_t *s, char *why, size_t len);
    /* Whether a worker that is up holds model key and can take a batch of
     * it now. */
    int (*held)(gw_sched_t *s, int64_t key);
    /* Whether model key was taken out of service (unloaded or deleted) and
     * a batch or item of it is still on its way out. */
    int (*unloading)(gw_sched_t *s, int64_t key);
    /* The device kind that serves m now (a worker up, cuda before cpu;
     * else one coming back), emu for emulated models; -1 when none. */
    int (*serving_kind)(gw_sched_t *s, const gw_model_t *m);
    /* gw_least_t: 0 with *out; -1 when unknown (kind < 0, no profile of
     * it, n < 1), with out->run_us 0 and the margin. */
    int (*least)(gw_sched_t *s, const gw_model_t *m, int kind, int n, gw_least_t *out);
    /* A snapshot of the fleet (gw_fleet_t) as the scheduler knows it. */
    void (*fleet)(gw_sched_t *s, gw_fleet_t *out);
} gw_sched_ops_t;

/* The base of each implementation's record (its first member). */
struct gw_sched {
    const gw_sched_ops_t *ops;
};

/* The calls, for a scheduler that may not have started yet (s NULL: a
 * standby, or squishd coming up): not ready, nothing held, no kind. */
static inline void gw_sched_submit(gw_sched_t *s, gw_item_t *first)
{
    if (s != NULL) {
        s->ops->submit(s, first);
        return;
    }
    for (gw_item_t *it = first, *next; it != NULL; it = next) {
        next = it->owner.clump_next;
        it->owner.clump_next = NULL;
        it->owner.finish(it, SQ_NO_WORKER, "the dispatcher is starting");
    }
}

static inline void gw_sched_withdraw(gw_sched_t *s)
{
    if (s != NULL)
        s->ops->withdraw(s);
}

static inline int gw_sched_ready(gw_sched_t *s, char *why, size_t len)
{
    if (s != NULL)
        return s->ops->ready(s, why, len);
    snprintf(why, len, "the dispatcher is starting");
    return 0;
}

static inline int gw_sched_held(gw_sched_t *s, int64_t key)
{
    return s != NULL && s->ops->held(s, key);
}

static inline int gw_sched_unloading(gw_sched_t *s, int64_t key)
{
    return s != NULL && s->ops->unloading(s, key);
}

static inline int gw_sched_serving_kind(gw_sched_t *s, const gw_model_t *m)
{
    return s != NULL ? s->ops->serving_kind(s, m) : -1;
}

/* The dispatcher core's options from the configuration (--policy,
 * --k_std, --dispatch_margin_us, ...): what every batch is planned with,
 * and what the least latency counts. */
static inline pl_dispatch_opts_t gw_sched_core_opts(const gw_config_t *cfg)
{
    return (pl_dispatch_opts_t){.policy = cfg->policy,
                                .k_std = cfg->k_std,
                                .eager_load = cfg->eager_load,
                                .net_delay_us = cfg->dispatch_margin_us,
                                .timer_slack_us = cfg->timer_slack_us};
}

/* The least latency (gw_least_t) of n items of m on kind, on profile p
 * (NULL: m's as measured): one rule for both schedulers. */
static inline int gw_sched_least_on(const pl_dispatch_opts_t *o, const pl_profile_t *p,
                                    const gw_model_t *m, int kind, int n, gw_least_t *out)
{
    *out = (gw_least_t){.run_us = 0, .margin_us = o->net_delay_us > 0 ? o->net_delay_us : 0};
    if (kind < 0 || kind >= SQ_DEV_KIND_COUNT || !m->has_profile[kind] || n < 1)
        return -1;
    int64_t us = pl_dispatch_least_us(o, p != NULL ? p : &m->profile[kind], m->max_batch, n);
    if (us < 0)
        return -1;
    out->run_us = us - out->margin_us;
    return 0;
}

static inline int gw_fleet_usable(const gw_fleet_t *f, const gw_model_t *m, int kind, int or_coming)
{
    return m->has_profile[kind] && m->not_on[kind][0] == '\0' &&
           (f->up[kind] > 0 || (or_coming && f->coming[kind] > 0));
}

/* The device kind that serves m in fleet f (gw_sched_ops_t.serving_kind). */
static inline int gw_fleet_serving_kind(const gw_fleet_t *f, const gw_model_t *m)
{
    for (int or_coming = 0; or_coming < 2; or_coming++) {
        if (m->emulated) {
            if (gw_fleet_usable(f, m, SQ_DEV_EMU, or_coming))
                return SQ_DEV_EMU;
            continue;
        }
        if (gw_fleet_usable(f, m, SQ_DEV_CUDA, or_coming))
            return SQ_DEV_CUDA;
        if (gw_fleet_usable(f, m, SQ_DEV_CPU, or_coming))
            return SQ_DEV_CPU;
    }
    return -1;
}

static inline void gw_sched_fleet(gw_sched_t *s, gw_fleet_t *out)
{
    *out = (gw_fleet_t){0};
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        out->back_at_us[k] = INT64_MAX;
    if (s != NULL)
        s->ops->fleet(s, out);
}

static inline int gw_sched_least(gw_sched_t *s, const gw_model_t *m, int kind, int n,
                                 gw_least_t *out)
{
    if (s != NULL)
        return s->ops->least(s, m, kind, n, out);
    *out = (gw_least_t){.run_us = 0, .margin_us = 0};
    return -1;
}

#endif
