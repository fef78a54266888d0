/* The batcher, the dispatch room's upper part: the core's queues, its
 * actions and batches' answers, live profiles (batches.c), and the intake:
 * submission and the commands placement emitted, drained (submit.c). It
 * asks placement for routes and tells it of arrivals; placement never
 * calls it. Dispatch thread only. */
#ifndef GW_BATCHER_INT_H
#define GW_BATCHER_INT_H

#include "placement_int.h"

/* batches.c: the core's queues, its actions, and batches' answers. */
/* Acts on the core's new actions (batches, drops, its wake-up). */
void ds_pump(gw_dispatch_t *ds);
/* Gives dm's sessions their routes (planning.c decides which workers). */
void ds_update_routes(gw_dispatch_t *ds, ds_model_t *dm);
/* The dispatcher session of (model, SLO bucket, input kind, priority
 * level, best effort), made (and *created set) the first time; its core
 * id, or < 0. */
int ds_session_ensure(gw_dispatch_t *ds, ds_model_t *dm, double bucket, uint8_t input_kind,
                      uint8_t priority, uint8_t best_effort, int *created);
/* Queues it in dm's session for its SLO bucket and input kind. */
void ds_enqueue_item(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t *it);
/* The same for n items ready together (a clump, gw_sched_submit): those
 * of one session enter it as one arrival (pl_dispatch_requests). */
/* Takes every abandoned item still queued (in the core or waiting for its
 * model's load) out and fails it as withdrawn. */
void ds_withdraw_abandoned(gw_dispatch_t *ds);
/* Fails it as withdrawn (counted by reason) when it is abandoned; 1 if so. */
int ds_withdrawn(gw_dispatch_t *ds, gw_item_t *it);
void ds_enqueue_items(gw_dispatch_t *ds, ds_model_t *dm, gw_item_t **items, int n);
/* The requests that waited for dm's first load: queued, or failed. */
void ds_flush_pending(gw_dispatch_t *ds, ds_model_t *dm);
void ds_fail_pending(gw_dispatch_t *ds, ds_model_t *dm, int rc, const char *why);
/* A BATCH_DONE from w: finishes the batch's items. */
void ds_on_batch_done(gw_dispatch_t *ds, ds_worker_t *w, const sq_frame_t *f);

/* batches.c: forgets dm's live correction (its profile was measured anew,
 * or dm is freed). */
void ds_live_reset(gw_dispatch_t *ds, ds_model_t *dm);
/* batches.c: dm's profile on kind is corrected by scale (1: none, the
 * profile as measured): its sessions in the core, the planner, the metric
 * and other threads' gw_dispatch_least follow. */
void ds_live_set(gw_dispatch_t *ds, ds_model_t *dm, int kind, double scale);

/* submit.c: items handed over on the dispatch thread (a frontend's, linked
 * through clump_next as gw_sched_submit's): admitted and queued; the same
 * posted to the dispatch loop (from any thread); and the commands drained
 * (at the end of an event; ds_commands_on_post is the drain a command
 * posts to the loop). */
void ds_submit_chain(gw_dispatch_t *ds, gw_item_t *first);
/* The record whose loads serve dm's requests (its twin, then the prefix
 * group it runs in, with its index there in *member, -1 when none), made
 * active at SLO bucket_ms the first time: placed by the planner. NULL
 * when no worker that can run it is up. */
ds_model_t *ds_serving_record(gw_dispatch_t *ds, ds_model_t *dm, double bucket_ms,
                              const gw_item_t *it, int *member);
void ds_submit_post(gw_dispatch_t *ds, gw_item_t *first);
void ds_commands_drain(gw_dispatch_t *ds);
void ds_commands_on_post(sq_loop_t *loop, void *arg);

#endif
