/* A plan read by session (pl.h: pl_plan_index_t): counted once, then each
 * session's allocations and overflow devices listed in plan order. */
#include "pl.h"

#include <sq.h>

#include <stdlib.h>
#include <string.h>

static void widen(int id, int *lo, int *hi)
{
    if (id < *lo)
        *lo = id;
    if (id > *hi)
        *hi = id;
}

void pl_plan_index_build(pl_plan_index_t *ix, const pl_plan_t *plan)
{
    memset(ix, 0, sizeof(*ix));
    int lo = 0x7fffffff, hi = -1, nallocs = 0;
    for (int i = 0; i < plan->ndevices; i++)
        for (int a = 0; a < plan->devices[i].nallocs; a++, nallocs++)
            widen(plan->devices[i].allocs[a].session_id, &lo, &hi);
    for (int o = 0; o < plan->noverflow; o++)
        widen(plan->overflow[o].session_id, &lo, &hi);
    for (int u = 0; u < plan->nunplaced; u++)
        widen(plan->unplaced[u].session_id, &lo, &hi);
    if (hi < lo || lo < 0)
        return; /* empty, or ids the plan never hands out */
    ix->min_id = lo;
    ix->nids = hi - lo + 1;
    ix->entry = sq_xcalloc((size_t)ix->nids, sizeof(*ix->entry));
    for (int i = 0; i < plan->ndevices; i++) {
        const pl_device_t *d = &plan->devices[i];
        for (int a = 0; a < d->nallocs; a++) {
            pl_plan_entry_t *e = &ix->entry[d->allocs[a].session_id - lo];
            e->nallocs++;
            e->packed_rps += d->allocs[a].rate_rps;
            if (d->duty_cycle_us > 0)
                e->capacity_rps += d->allocs[a].batch * 1e6 / d->duty_cycle_us;
        }
    }
    for (int o = 0; o < plan->noverflow; o++)
        ix->entry[plan->overflow[o].session_id - lo].nover++;
    for (int u = 0; u < plan->nunplaced; u++)
        ix->entry[plan->unplaced[u].session_id - lo].unplaced_rps += plan->unplaced[u].rate_rps;
    int na = 0, no = 0;
    for (int k = 0; k < ix->nids; k++) {
        ix->entry[k].first_alloc = na;
        ix->entry[k].first_over = no;
        na += ix->entry[k].nallocs;
        no += ix->entry[k].nover;
        ix->entry[k].nallocs = ix->entry[k].nover = 0; /* filled again below */
    }
    ix->alloc_device = sq_xmalloc(sizeof(int) * (size_t)(na ? na : 1));
    ix->alloc_ix = sq_xmalloc(sizeof(int) * (size_t)(na ? na : 1));
    ix->over = sq_xmalloc(sizeof(int) * (size_t)(no ? no : 1));
    for (int i = 0; i < plan->ndevices; i++)
        for (int a = 0; a < plan->devices[i].nallocs; a++) {
            pl_plan_entry_t *e = &ix->entry[plan->devices[i].allocs[a].session_id - lo];
            int at = e->first_alloc + e->nallocs++;
            ix->alloc_device[at] = i;
            ix->alloc_ix[at] = a;
        }
    for (int o = 0; o < plan->noverflow; o++) {
        pl_plan_entry_t *e = &ix->entry[plan->overflow[o].session_id - lo];
        ix->over[e->first_over + e->nover++] = o;
    }
}

void pl_plan_index_dispose(pl_plan_index_t *ix)
{
    free(ix->entry);
    free(ix->alloc_device);
    free(ix->alloc_ix);
    free(ix->over);
    memset(ix, 0, sizeof(*ix));
}

const pl_plan_entry_t *pl_plan_index_get(const pl_plan_index_t *ix, int session_id)
{
    if (ix == NULL || session_id < ix->min_id || session_id - ix->min_id >= ix->nids)
        return NULL;
    return &ix->entry[session_id - ix->min_id];
}
