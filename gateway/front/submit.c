/* Items in: those submitted are offered to the dispatcher (FE_ITEMS, a
 * loop turn's together), those abandoned withdrawn (FE_WITHDRAW). */
#include "front_int.h"

#include <stdio.h>

/* Items offered go out together: those submitted in one turn of the
 * frontend's loop (every post queued by then) share FE_ITEMS frames, so
 * that the dispatcher reads many items a wake-up at high rates. */
static void flush_items(gw_front_t *fr)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < fr->npend; i++) {
        uint32_t idx;
        if (fr_slot_item(fr, fr->pend[i].slot, &idx) != NULL) /* not answered meanwhile */
            fr->pend[n++] = fr->pend[i];
        else if (n > 0)
            fr->pend[n - 1].clump_next = fr->pend[i].clump_next;
    }
    fr->npend = 0;
    if (n == 0 || !fr->joined)
        return;
    fr->pend[n - 1].clump_next = 0;
    fr->scratch.len = 0;
    sq_fe_items_encode(&fr->scratch, fr->pend, n);
    fr_send_dispatcher(fr, SQ_MSG_FE_ITEMS, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
    atomic_fetch_add(&fr->offered, n);
}

static void on_flush(sq_loop_t *loop, void *arg)
{
    gw_front_t *fr = arg;
    (void)loop;
    fr->flush_posted = 0;
    flush_items(fr);
}

static void on_submit(sq_loop_t *loop, void *arg)
{
    gw_item_t *it = arg;
    gw_front_t *fr = it->held.holder;
    int64_t now = sq_now_us();
    for (gw_item_t *next; it != NULL; it = next) {
        next = it->owner.clump_next;
        it->owner.clump_next = NULL;
        it->times.ready_us = now;
        if (!fr->joined || fr->stopping) {
            fr_finish(fr, it, fr->stopping ? SQ_SHUTTING_DOWN : SQ_NOT_READY,
                      fr->stopping ? "squishd is shutting down"
                                   : "this frontend has no dispatcher now; retry");
            continue;
        }
        if (it->owner.abandoned != NULL && atomic_load(it->owner.abandoned) != 0) {
            fr_withdrawn(fr, it);
            continue;
        }
        if (it->ask.deadline_us <= now) {
            fr_finish(fr, it, SQ_DEADLINE, "the deadline passed during preprocessing");
            continue;
        }
        uint64_t slot;
        if (fr_slot_new(fr, it, &slot) != 0) {
            fr_finish(fr, it, SQ_OVERLOAD, "this frontend holds as many items as it can");
            continue;
        }
        if (fr->npend == SQ_MAX_FE_ITEMS)
            flush_items(fr);
        fr->pend[fr->npend++] =
            (sq_fe_item_t){.slot = slot,
                           .model_key = it->ask.model->key,
                           .slo_ms = it->ask.slo_ms,
                           .budget_us = it->ask.deadline_us - now,
                           .age_us = now > it->ask.arrival_us ? now - it->ask.arrival_us : 0,
                           .input_kind = it->ask.input_kind,
                           .priority = it->ask.priority,
                           .best_effort = it->ask.best_effort,
                           .clump_next = next != NULL,
                           .stage = -1};
        if (it->pipe.pipeline != NULL) { /* a query's stage: the dispatcher counts it there */
            sq_fe_item_t *e = &fr->pend[fr->npend - 1];
            e->stage = it->pipe.stage;
            e->query_slo_ms = it->pipe.query_slo_ms;
            snprintf(e->pipeline, sizeof(e->pipeline), "%s", it->pipe.pipeline->name);
        }
    }
    if (fr->npend > 0) {
        fr->pend[fr->npend - 1].clump_next = 0; /* a clump ends with its request */
        if (!fr->flush_posted) {
            fr->flush_posted = 1;
            sq_loop_post(loop, on_flush, fr);
        }
    }
}

/* gw_sched_ops_t.submit: offered to the dispatcher from this thread. */
void fr_sched_submit(gw_sched_t *s, gw_item_t *first)
{
    gw_front_t *fr = (gw_front_t *)s;
    first->held.holder = fr;
    sq_loop_post(fr->loop, on_submit, first);
}

/* Items abandoned while the dispatcher queues them are answered here and
 * withdrawn there; those whose rows went to a worker are answered as it
 * answers them. */
static void on_withdraw(sq_loop_t *loop, void *arg)
{
    gw_front_t *fr = arg;
    (void)loop;
    atomic_store(&fr->withdraw_posted, 0);
    uint64_t ids[SQ_MAX_FE_ITEMS];
    uint32_t n = 0;
    for (uint32_t i = 0; i < fr->nslots; i++) {
        slot_t *s = &fr->slots[i];
        gw_item_t *it = s->item;
        if (it == NULL || s->state != SLOT_OFFERED || it->owner.abandoned == NULL ||
            atomic_load(it->owner.abandoned) == 0)
            continue;
        ids[n++] = ((uint64_t)s->gen << 32) | i;
        fr_release_slot(fr, i);
        fr_withdrawn(fr, it);
        if (n == SQ_MAX_FE_ITEMS) {
            fr->scratch.len = 0;
            sq_fe_withdraw_encode(&fr->scratch, ids, n);
            fr_send_dispatcher(fr, SQ_MSG_FE_WITHDRAW, 0, fr->scratch.data,
                               (uint32_t)fr->scratch.len);
            n = 0;
        }
    }
    if (n > 0) {
        fr->scratch.len = 0;
        sq_fe_withdraw_encode(&fr->scratch, ids, n);
        fr_send_dispatcher(fr, SQ_MSG_FE_WITHDRAW, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
    }
}

void fr_sched_withdraw(gw_sched_t *s)
{
    gw_front_t *fr = (gw_front_t *)s;
    if (atomic_exchange(&fr->withdraw_posted, 1) == 0)
        sq_loop_post(fr->loop, on_withdraw, fr);
}
