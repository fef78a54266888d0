/* A frontend's item slots (front_int.h): taking one for an item offered,
 * finding the item an id names, and answering an item exactly once. */
#include "front_int.h"

#include <stdlib.h>

/* ---- answering items -------------------------------------------------------- */

void fr_release_slot(gw_front_t *fr, uint32_t idx)
{
    slot_t *s = &fr->slots[idx];
    s->item = NULL;
    s->state = SLOT_FREE;
    s->gen++;
    s->next_free = fr->free_slot;
    fr->free_slot = idx + 1;
}

/* The item's answer: its input slot back to the arena, then its finish. */
void fr_finish(gw_front_t *fr, gw_item_t *it, int rc, const char *detail)
{
    if (it->input.in_off >= 0) {
        sq_shm_release(fr->arena, it->input.in_off);
        it->input.in_off = -1;
    }
    it->times.done_us = sq_now_us();
    it->owner.finish(it, rc, detail);
}

/* The item slot id names, if it still holds one. */
gw_item_t *fr_slot_item(gw_front_t *fr, uint64_t id, uint32_t *idx)
{
    uint32_t i = (uint32_t)id;
    if (i >= fr->nslots || fr->slots[i].item == NULL || fr->slots[i].gen != (uint32_t)(id >> 32))
        return NULL;
    *idx = i;
    return fr->slots[i].item;
}

void fr_answer_slot(gw_front_t *fr, uint32_t idx, int rc, const char *detail)
{
    gw_item_t *it = fr->slots[idx].item;
    fr_release_slot(fr, idx);
    fr_finish(fr, it, rc, detail);
}

/* ---- items in ------------------------------------------------------------------ */

int fr_slot_new(gw_front_t *fr, gw_item_t *it, uint64_t *id)
{
    if (fr->free_slot == 0) {
        if (fr->nslots == MAX_SLOTS)
            return -1;
        uint32_t cap = fr->nslots ? 2 * fr->nslots : 256;
        if (cap > MAX_SLOTS)
            cap = MAX_SLOTS;
        fr->slots = sq_xrealloc(fr->slots, sizeof(*fr->slots) * cap);
        for (uint32_t i = cap; i > fr->nslots; i--) {
            fr->slots[i - 1] = (slot_t){.next_free = fr->free_slot};
            fr->free_slot = i;
        }
        fr->nslots = cap;
    }
    uint32_t idx = fr->free_slot - 1;
    slot_t *s = &fr->slots[idx];
    fr->free_slot = s->next_free;
    s->item = it;
    s->state = SLOT_OFFERED;
    *id = ((uint64_t)s->gen << 32) | idx;
    return 0;
}

void fr_withdrawn(gw_front_t *fr, gw_item_t *it)
{
    int gone = atomic_load(it->owner.abandoned) == GW_ABANDONED_GONE;
    gw_metrics_withdrawn(fr->metrics, it->ask.model, gone ? "client_gone" : "request_failed");
    fr_finish(fr, it, SQ_DEADLINE,
              gone ? "withdrawn: its client went away"
                   : "withdrawn: another item of its request failed");
}
