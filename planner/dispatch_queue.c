/* Deadline queues of the dispatcher core (dispatch_int.h). */
#include "dispatch_int.h"

#include "pl_dispatch.h"

#include <sq.h>

#include <stdlib.h>

/* ---- queues ---- */

static void q_grow(pl__queue_t *q)
{
    uint32_t cap = q->buf ? (q->mask + 1) * 2 : 64;
    pl__entry_t *nb = sq_xmalloc(sizeof(*nb) * cap);
    for (uint32_t i = 0; i < q->n; i++)
        nb[i] = *pl__q_at(q, i);
    free(q->buf);
    q->buf = nb;
    q->mask = cap - 1;
    q->head = 0;
}

void pl__q_insert(pl__queue_t *q, const pl__entry_t *e)
{
    if (q->buf == NULL || q->n == q->mask + 1)
        q_grow(q);
    uint32_t i = q->n++;
    /* Deadline order; equal deadlines keep arrival order (FIFO). */
    while (i > 0 && pl__q_at(q, i - 1)->deadline_us > e->deadline_us) {
        *pl__q_at(q, i) = *pl__q_at(q, i - 1);
        i--;
    }
    *pl__q_at(q, i) = *e;
}

pl__entry_t pl__q_pop(pl__queue_t *q)
{
    pl__entry_t e = *pl__q_at(q, 0);
    q->head = (q->head + 1) & q->mask;
    q->n--;
    return e;
}
