/* Dispatcher core: per-session deadline queues, batch formation and
 * matchmaking of batches to workers, with the two SLO-aware policies of
 * DESIGN.md ("Dispatcher"):
 *
 *   - PL_POLICY_EARLY_DROP (Nexus, SOSP'19 section 5): each worker cycles
 *     through its sessions (round robin, at most once per planned duty
 *     cycle); for a session it looks at a sliding window of the target batch
 *     size from the head of the queue and drops head requests while the
 *     window, run as one batch, would miss the head's deadline. Then it runs
 *     the window.
 *   - PL_POLICY_DEFERRED (Symphony, section 3.3): one candidate batch per
 *     session: the requests from the head, as many as can finish by the
 *     head's deadline d. With b of them it becomes dispatchable at
 *     max(now, d - l(b+1)) (waiting any longer cannot make it bigger) and
 *     stays valid until d - l(b). A central matchmaker gives a dispatchable
 *     batch the earliest-free worker among those holding the session's
 *     model, ties to the lowest worker id, so that spare workers stay idle at
 *     low load. When a queue is backed up (the head can no longer fill a
 *     batch that the requests behind it could), a free worker takes the
 *     largest window that fits now instead, provided the head window is
 *     smaller than skip_ratio times it; the heads passed over stay queued
 *     and are served later if a worker comes free in time. Under overload a
 *     worker so runs near-full batches and goodput stays flat instead of
 *     collapsing into stale batches of one or two. A worker that holds
 *     several sessions does not let each defer to its own last moment when
 *     only it can serve them in time: those batches form a chain in deadline
 *     order that starts early enough for all of them to fit.
 *
 * Priorities (pl_session_cfg_t.priority, a smaller number first; the
 * gateway maps Triton's parameters.priority onto a few levels): deferred and
 * adaptive only; early-drop (the Nexus baseline) keeps its round robin. A
 * free worker first decides as above, over all its sessions; that choice
 * stands unless its batch would take the room of a higher level: end after
 * the latest start of the chain of the higher levels' batches, each held at
 * the size its queue is expected to reach by its last moment (queued plus
 * arrivals at its recent rate, at most its target batch). Then it decides
 * one level at a time, highest first, a lower level's batch only where it
 * leaves the levels above that room. And as a batch is not preempted, while
 * a higher-level session on the worker had a request within the last
 * PL_RATE_WINDOW_US, a lower level's batch runs at most SLO - l(target) of
 * that session (a request arriving as it starts still makes its SLO in a
 * batch of its target size after it). So under overload the lower levels'
 * requests are the ones that miss their deadlines and are dropped, a higher
 * level keeps what it would get alone, and the lower ones take what is
 * left. Sessions of one level are served exactly as without priorities.
 *
 * Both policies drop a request at once (never leave it to rot) when it can no
 * longer finish by its deadline even alone on the earliest-free worker, and
 * neither ever sends a batch that cannot finish by its earliest deadline
 * under the profile. Latencies are the profile's mean + k_std * std (rounded
 * up to whole µs) plus a fixed network/IPC delay per batch, plus, on a
 * worker behind a link (pl_dispatch_worker_net), the batch's transfer
 * (Symphony's d_data): net_w(b) = rtt_w + b * item_bytes / bandwidth_w,
 * rounded up to whole µs. Every decision for a worker uses its own cost
 * l(b) + net_w(b): the batch size that fits a deadline there, when a batch
 * must leave, which requests can no longer make it, finish_us. A batch goes
 * to the free worker with the cheapest link that can run it in time (a local
 * idle device before a remote one), and a worker leaves a batch that a free
 * worker with a cheaper link can also run in time to that one.
 *
 * Pure: no clock reads, no threads, no I/O, no globals. Every call takes the
 * current time `now_us` (any monotonic µs origin; it must never go
 * backwards) and appends actions to an internal list that the caller takes
 * with pl_dispatch_take(). The live runtime (a dispatcher thread in squishd)
 * and the simulator (bench/sim) drive this same code:
 *
 *     d = pl_dispatch_new(&opts);
 *     s = pl_dispatch_session_add(d, &session_cfg);       // per (model, SLO)
 *     pl_dispatch_worker_add(d, now, w, duty_cycle_us);   // per worker
 *     pl_dispatch_route_set(d, now, s, routes, nroutes);  // who holds s's model
 *     on request ready:   pl_dispatch_request(d, now, id, s, arrival, deadline);
 *     on requests ready together (one arrival: a multi-image request, a
 *       frame's crops):  pl_dispatch_requests(d, now, s, reqs, n);
 *     on timer:           pl_dispatch_timer(d, now);
 *     on batch result:    pl_dispatch_batch_done(d, now, w, batch_id);
 *     on worker death:    pl_dispatch_worker_lost(d, now, w);
 *     on client gone:     pl_dispatch_cancel(d, now, s, id);
 *     after each call:    n = pl_dispatch_take(d, &actions); act on each:
 *       PL_ACT_SEND  send the batch (ids, in order) of `session` to `worker`
 *       PL_ACT_DROP  answer request `request_id` with `reason` (an SQ_* code)
 *       PL_ACT_TIMER (re)arm the caller's single timer at `at_us`
 *                    (PL_NEVER: disarm); a timer firing early or late is
 *                    harmless, the core only does what is due.
 *
 * Ownership: the dispatcher owns everything it holds and keeps no pointer
 * to the caller's data (profiles are read once, at pl_dispatch_session_add). Action arrays and
 * batch id arrays returned by pl_dispatch_take stay valid until the next call into the same
 * dispatcher. Not thread-safe: one thread drives one dispatcher. */
#ifndef PL_DISPATCH_H
#define PL_DISPATCH_H

#include "pl.h"
#include "pl_profile.h"

#include <stddef.h>
#include <stdint.h>

#define PL_NEVER INT64_MAX
/* Deferred: pass a backed-up head window over for a window at least 1/0.8
 * its size. Chosen on the Symphony table-2 workload (bench/RESULTS.md,
 * "Simulator"): 0.8 gave the highest 99% goodput of 0.5 to 1 while keeping
 * goodput flat under overload. */
#define PL_DEFAULT_SKIP_RATIO 0.8

/* Adaptive: a session whose arrival rate is below this share of what its
 * workers can serve batching greedily (pl_dispatch_opts_t.eager_load) is
 * dispatched at once to an idle worker. Chosen on the Symphony table-2
 * workload and a low-load latency sweep (bench/RESULTS.md, "Fast when
 * there is nothing to wait for"). */
#define PL_DEFAULT_EAGER_LOAD 0.9
/* Adaptive: the arrival rate is counted over windows of this length. */
#define PL_RATE_WINDOW_US 250000
/* pl_dispatch_worker_gap_us: a session without a request for this long is
 * idle, and leaves a gap unbounded by its SLO. */
#define PL_GAP_IDLE_US 1000000
/* Adaptive: the requests that arrive within this of a rate window's first
 * are one clump (the images of one multipart request, the crops of one
 * detector batch): the window's current rate is measured from after it, so
 * that a clump after a lull is not read as a burst and sent at its
 * frontrun moment. pl_dispatch_opts_t.clump_us; 0 = this. */
#define PL_DEFAULT_CLUMP_US 1000

typedef enum {
    PL_POLICY_DEFERRED = 0,
    PL_POLICY_EARLY_DROP,
    /* Deferred under load; at once when waiting cannot grow the batch. A
     * deferred batch waits for its frontrun moment d - l(b+1) because a
     * request arriving meanwhile would join it. When a session's arrivals
     * are so sparse that its workers, running every batch as soon as they
     * are free (greedy batching, each batch what queued during the last
     * one), would stay below eager_load of their capacity under the SLO
     * (the largest b with 2 l(b) <= SLO: a request waits at most one batch
     * and runs in the next), the batch goes at once: the worker is idle and
     * the time saved is the request's. Rates come from the arrivals the
     * core sees (windows of PL_RATE_WINDOW_US), so the switch follows the
     * load without the planner. Requests handed over together
     * (pl_dispatch_requests) are one arrival: they weigh on the rate as
     * the items they are, but never read as a burst among themselves. */
    PL_POLICY_ADAPTIVE,
} pl_policy_t;

/* "deferred" / "early-drop" / "adaptive"; pl_policy_parse returns 0 or
 * SQ_INVAL. */
const char *pl_policy_name(pl_policy_t policy);
int pl_policy_parse(const char *name, pl_policy_t *out);

typedef struct {
    pl_policy_t policy;
    /* Safety margin on profiled latencies: mean + k_std * std. */
    double k_std;
    /* Added to every batch's latency: the round trip of the batch descriptor
     * to the worker and of its result back (IPC, or network for a remote
     * worker). 0 in a simulation of ideal devices. */
    int64_t net_delay_us;
    /* Deferred only; 0 = PL_DEFAULT_SKIP_RATIO. 1 or more: always take the
     * largest window when backed up. */
    double skip_ratio;
    /* Deferred: a candidate becomes dispatchable at least this long before
     * its last moment d - l(b), so that a timer waking late (a live thread
     * on a busy host) still sends it in time. 0 in a simulation. */
    int64_t timer_slack_us;
    /* Adaptive only; 0 = PL_DEFAULT_EAGER_LOAD. */
    double eager_load;
    /* Adaptive only; 0 = PL_DEFAULT_CLUMP_US, < 0: no clumps (every
     * arrival counts in the current rate). */
    int64_t clump_us;
} pl_dispatch_opts_t;

typedef struct {
    /* Read once: the core precomputes l(b) with the margin for every b. */
    const pl_profile_t *profile;
    /* The session's SLO. Batches larger than the largest one that fits the
     * SLO are never formed; 0 = no such cap (max_batch alone bounds). */
    int64_t slo_us;
    /* Cap on the batch size below the profile's own max; 0 = profile max. */
    int max_batch;
    /* Bytes one request moves over a worker's link: its input plus its
     * output. A batch of b on a worker behind a link (pl_dispatch_worker_net)
     * costs rtt + b * item_bytes / bandwidth on top of its latency. 0: only
     * the round trip counts. */
    int64_t item_bytes;
    /* Rank among the sessions that share a worker, >= 0: a smaller number
     * is served first (see "Priorities" above); all equal (0): none. */
    int priority;
    /* 1: nobody asked for an SLO (issue 23). Its requests' deadlines are
     * only the server's bound on a request's life; deferred and adaptive
     * send its batches as soon as a worker is free (waiting for a frontrun
     * moment buys nothing without an SLO to fill), greedily (what queued
     * while the worker was busy, up to max_batch), and rank it below every
     * session with an SLO (priority PL_PRIORITY_BEST_EFFORT + priority), so
     * that SLO traffic keeps its room when the two compete. Set slo_us 0.
     * Early-drop (the Nexus baseline) only drops it at its deadline. */
    int best_effort;
} pl_session_cfg_t;

/* The priority rank of best-effort sessions: below any a caller gives. */
#define PL_PRIORITY_BEST_EFFORT (1 << 20)

/* One worker holding a session's model. target_batch is the batch size the
 * planner chose for the session on that worker (early-drop's window);
 * 0 = the largest b with 2 l(b) <= SLO (Nexus's saturated batch), or the
 * largest batch when the session has no SLO. Deferred ignores it.
 * overflow: 1 when the plan placed the session elsewhere and this worker
 * only takes its overflow (pl_plan_t.overflow). Deferred and adaptive run
 * such a batch there only where it leaves the sessions planned on the
 * worker their room (while one of them had a request within the last
 * PL_RATE_WINDOW_US, a batch of at most SLO - l(target) of that session:
 * its request arriving as the batch starts still makes its SLO after it,
 * as with a lower priority level above), or where no other worker holding
 * the session can run the batch in time any more: overflow is for what its
 * own workers cannot serve, not a reason to break a tight session that
 * shares the device. Early-drop ignores it. */
typedef struct {
    int worker;
    int target_batch;
    int overflow;
} pl_route_t;

/* How a plan's placement becomes routes (pl_plan_routes). */
typedef struct {
    /* The worker that runs each device, by device id (a plan device's
     * pl_device_t.id, a spare's pl_overflow_t.device_id): workers[id], or
     * -1; an id outside [0, nworkers) has none. Given as data, so that the
     * rule calls back into no planner code. */
    const int *workers;
    int nworkers;
    /* Whether worker can serve model now (it holds it); NULL: all can. */
    int (*usable)(void *ctx, int worker, int64_t model);
    void *ctx;
    int64_t model; /* the session's, as usable is asked */
    /* 1: each route's target batch is its allocation's; 0: the plan saw
     * no traffic for the session, and the dispatcher picks (target 0). */
    int targets;
    /* The workers that serve when no planned device can: before a plan
     * covers the session, while its devices still load the model, or when
     * the planner could not place it (target 0 each). */
    const int *fallback;
    int nfallback;
    int *used_fallback; /* out, optional: 1 when the fallback was used */
    /* Optional: plan read by session (pl_plan_index_build of this plan),
     * so that routing costs the session's entries, not the plan's. */
    const pl_plan_index_t *index;
} pl_route_rules_t;

/* The routes of session `session_id` under `plan` (NULL: no plan yet): the
 * planned devices whose worker can serve it, else the fallback workers;
 * then the spare devices of plan->overflow that hold it (target 0).
 * Writes at most max; returns how many. */
int pl_plan_routes(const pl_plan_t *plan, int session_id, const pl_route_rules_t *rules,
                   pl_route_t *routes, int max);

typedef enum {
    PL_ACT_SEND = 1,
    PL_ACT_DROP,
    PL_ACT_TIMER,
} pl_action_kind_t;

typedef struct {
    pl_action_kind_t kind;
    int64_t at_us;       /* SEND, DROP: when it was decided (now); TIMER: wake time */
    int session;         /* SEND, DROP */
    int worker;          /* SEND */
    int count;           /* SEND: batch size */
    uint64_t batch_id;   /* SEND: echo it in pl_dispatch_batch_done */
    const uint64_t *ids; /* SEND: count request ids, earliest deadline first */
    int64_t deadline_us; /* SEND: earliest deadline in the batch; DROP: the request's */
    int64_t finish_us;   /* SEND: expected finish, at_us + l(count) + net delay + the
                            worker's transfer net_w(count) */
    uint64_t request_id; /* DROP */
    int reason;          /* DROP: SQ_DEADLINE (cannot finish in time even alone),
                            SQ_OVERLOAD (early drop: would keep a fuller batch from
                            its deadline), SQ_WORKER_LOST (retry after a lost worker
                            cannot make it), SQ_NO_WORKER (no worker holds the model),
                            SQ_NOT_FOUND (session removed) */
} pl_action_t;

/* Counters, cumulative since pl_dispatch_new. */
typedef struct {
    uint64_t requests;
    uint64_t sent_requests;
    uint64_t batches;
    uint64_t dropped;
    uint64_t retried; /* requests put back in their queue after a lost worker */
    uint64_t queued;  /* now */
} pl_dispatch_stats_t;

typedef struct pl_dispatch pl_dispatch_t;

pl_dispatch_t *pl_dispatch_new(const pl_dispatch_opts_t *opts);
void pl_dispatch_free(pl_dispatch_t *d);

/* Adds a session; returns its id (0, 1, ... in order) or SQ_INVAL when the
 * profile is missing or has no usable batch size, or the priority is
 * negative. */
int pl_dispatch_session_add(pl_dispatch_t *d, const pl_session_cfg_t *cfg);
/* Removes a session: queued requests are dropped (SQ_NOT_FOUND); batches in
 * flight complete normally. Its id is not reused. */
int pl_dispatch_session_remove(pl_dispatch_t *d, int64_t now_us, int session);
/* Replaces a session's profile (read once; the costs of every batch size
 * are recomputed, batches already sent keep their expected finish): the
 * live runtime corrects a profile that drifted from what workers measure.
 * Returns 0, or SQ_INVAL (unknown session, or a profile with no usable
 * batch size: the old costs stay). */
int pl_dispatch_session_profile(pl_dispatch_t *d, int64_t now_us, int session,
                                const pl_profile_t *profile);

/* Adds a worker (ids are the caller's, small non-negative ints) or updates
 * the duty cycle of an existing one. duty_cycle_us paces early-drop: a round
 * over the worker's sessions starts at most once per duty cycle (0 = run
 * back to back). A new worker may take batches at once; one removed with a
 * batch in flight is present again at once and takes the next batch when
 * that one is done. SQ_INVAL on a negative id. */
int pl_dispatch_worker_add(pl_dispatch_t *d, int64_t now_us, int worker, int64_t duty_cycle_us);
/* The worker's link (Symphony's d_data): a batch of b of session s costs
 * rtt_us + b * item_bytes(s) / bytes_per_us on top of its latency there.
 * rtt_us 0 and bytes_per_us 0 (or less): a local worker, the default;
 * bytes_per_us <= 0 with rtt_us > 0: only the round trip counts. May be
 * called at any time (the link's estimate changes); a batch in flight keeps
 * its expected finish. The link stays with the worker id across
 * remove/lost/add. SQ_INVAL on a worker id never added or a negative rtt. */
int pl_dispatch_worker_net(pl_dispatch_t *d, int64_t now_us, int worker, int64_t rtt_us,
                           double bytes_per_us);
/* Graceful removal: the worker leaves every route and gets no new batch; a
 * batch in flight still completes through pl_dispatch_batch_done. */
int pl_dispatch_worker_remove(pl_dispatch_t *d, int64_t now_us, int worker);
/* The worker died: it leaves every route; the requests of its batch in
 * flight go back to their queue (and get another worker if their deadline
 * still allows, else they are dropped with SQ_WORKER_LOST). A late
 * batch_done for that batch then returns SQ_INVAL. */
int pl_dispatch_worker_lost(pl_dispatch_t *d, int64_t now_us, int worker);

/* Foreign work on a worker: a job that is not a batch of any session (a
 * measurement of a model not yet served, run in the worker's idle gaps).
 *
 * pl_dispatch_worker_gap_us says how long the worker may be taken now
 * without any request making it late: 0 when it is busy, absent or
 * draining; else the least over its sessions of (a) the slack of the
 * queued requests, run as one batch after the gap (head deadline - now -
 * l(queued)), and (b) half of what a request arriving now could wait
 * alone ((SLO - l(1)) / 2: the other half is left for the batch that the
 * wait builds up), (b) only for a session with a request within the last
 * PL_GAP_IDLE_US: an idle model does not hold up a measurement (issue 23:
 * a new version was measured in 26 s instead of 6 beside an idle one at a
 * 100 ms SLO); its next request may wait out the slice in flight. PL_NEVER
 * when it serves no session.
 *
 * pl_dispatch_worker_foreign takes the worker for duration_us: a free
 * worker at once; a busy one (after_batch) right after its batch in flight,
 * as a worker runs its jobs in the order they are sent (its expected finish
 * moves out by duration_us). Either way it is busy with no requests until
 * pl_dispatch_batch_done(worker, id) with the id returned, and batches are
 * formed around it as around any batch in flight. Returns that id, or 0
 * when refused: absent, draining, already holding foreign work, busy
 * without after_batch, or duration_us < 1. worker_lost ends it; a late
 * batch_done is then SQ_INVAL, as for a batch. The caller decides when a
 * gap is worth taking and when a starved job goes after a batch anyway. */
int64_t pl_dispatch_worker_gap_us(const pl_dispatch_t *d, int64_t now_us, int worker);
uint64_t pl_dispatch_worker_foreign(pl_dispatch_t *d, int64_t now_us, int worker,
                                    int64_t duration_us, int after_batch);

/* Replaces the set of workers that hold session's model (routing table row).
 * Workers must have been added. SQ_INVAL on an unknown session or worker or a
 * worker listed twice. */
int pl_dispatch_route_set(pl_dispatch_t *d, int64_t now_us, int session, const pl_route_t *routes,
                          int nroutes);

/* A request is ready (preprocessed) for session. id is the caller's and is
 * only echoed back. SQ_INVAL on an unknown session. */
int pl_dispatch_request(pl_dispatch_t *d, int64_t now_us, uint64_t id, int session,
                        int64_t arrival_us, int64_t deadline_us);
/* One request of pl_dispatch_requests. */
typedef struct {
    uint64_t id; /* the caller's, only echoed back */
    int64_t arrival_us, deadline_us;
} pl_request_t;

/* n requests of session ready together: one arrival, such as the images
 * of one multi-image request or the crops a detector found in one frame.
 * They are queued before anything is decided, so that at low load they
 * leave as one batch at once; and the adaptive policy counts them as the
 * items they are in the session's rate, but the gaps between them (none)
 * as no burst: a clump of n at low load is not n requests close together.
 * Ids must be distinct. SQ_INVAL on an unknown session or n < 1 (nothing
 * queued). */
int pl_dispatch_requests(pl_dispatch_t *d, int64_t now_us, int session, const pl_request_t *reqs,
                         int n);
/* The client went away (or the caller answered the request itself): takes
 * request id out of session's queue so that it uses no batch slot. No
 * action is produced for it. Returns 0, or SQ_NOT_FOUND when it is not
 * queued (already sent to a worker, already dropped, or unknown): a result
 * that arrives for it later is the caller's to discard. O(queue length). */
int pl_dispatch_cancel(pl_dispatch_t *d, int64_t now_us, int session, uint64_t id);
/* The caller's timer fired (or any time: it only does what is due). */
void pl_dispatch_timer(pl_dispatch_t *d, int64_t now_us);
/* The worker answered batch_id: it is free again. SQ_INVAL when that worker
 * has no such batch in flight (a late answer after worker_lost). */
int pl_dispatch_batch_done(pl_dispatch_t *d, int64_t now_us, int worker, uint64_t batch_id);

/* Takes the actions produced since the previous take (none when nothing
 * was called in between); *out is valid until the next call into d.
 * Returns their number. */
size_t pl_dispatch_take(pl_dispatch_t *d, const pl_action_t **out);

/* When the core next needs pl_dispatch_timer (PL_NEVER: nothing pending). */
int64_t pl_dispatch_next_wake(const pl_dispatch_t *d);
/* Latency the core assumes for a batch of b of session (margin and network
 * delay included), or -1. */
int64_t pl_dispatch_batch_cost_us(const pl_dispatch_t *d, int session, int b);
/* The same on worker (its link's transfer added), or -1 (also for a worker
 * never added). */
int64_t pl_dispatch_worker_batch_cost_us(const pl_dispatch_t *d, int session, int worker, int b);
/* The least latency n requests on profile take alone on an idle worker, as
 * a core made with opts plans them (any thread, no core needed): batches of
 * at most max_batch (0: the profile's largest) one after the other, each
 * its cost above less the network delay, which the last one adds once (a
 * batch is sent while the one before runs); -1 when n < 1 or no batch is
 * usable. Admission's "ask for N ms or more" is this, so that it never
 * disagrees with what dispatch plans. */
int64_t pl_dispatch_least_us(const pl_dispatch_opts_t *opts, const pl_profile_t *profile,
                             int max_batch, int n);
/* Largest batch the core forms for session (profile, cap and SLO), or -1. */
int pl_dispatch_session_max_batch(const pl_dispatch_t *d, int session);
/* Requests queued for session now, or -1. */
int pl_dispatch_queued(const pl_dispatch_t *d, int session);
void pl_dispatch_stats(const pl_dispatch_t *d, pl_dispatch_stats_t *out);

#endif
