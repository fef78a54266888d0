/* Internals of the dispatcher core shared between its files: the deadline
 * queue (a ring buffer kept sorted by deadline) and the wake-up times (on
 * common's indexed heap). Not part of the public API (pl_dispatch.h). */
#ifndef PL_DISPATCH_INT_H
#define PL_DISPATCH_INT_H

#include "pl_dispatch.h"

#include <sq_heap.h>

#include <stdint.h>

/* The request came back from a lost worker: a drop then says worker_lost. */
#define PL__ENTRY_RETRIED 1u

typedef struct {
    uint64_t id;
    int64_t deadline_us;
    int64_t arrival_us;
    uint32_t flags;
} pl__entry_t;

/* Ring buffer sorted by deadline, earliest at head. */
typedef struct {
    pl__entry_t *buf;
    uint32_t mask; /* capacity - 1; capacity is a power of two */
    uint32_t head;
    uint32_t n;
} pl__queue_t;

/* The i-th request from the head (earliest deadline); i < q->n. */
static inline pl__entry_t *pl__q_at(const pl__queue_t *q, uint32_t i)
{
    return &q->buf[(q->head + i) & q->mask];
}

/* Inserts in deadline order (equal deadlines keep arrival order). */
void pl__q_insert(pl__queue_t *q, const pl__entry_t *e);
/* Removes and returns the head; q->n > 0. */
pl__entry_t pl__q_pop(pl__queue_t *q);

/* Wake-ups are common/sq_heap.h's indexed heap: sets id's wake time, and
 * PL_NEVER (INT64_MAX) takes it out. */
static inline void pl__wake_set(sq_iheap_t *h, int id, int64_t when_us)
{
    if (when_us == PL_NEVER)
        sq_iheap_remove(h, id);
    else
        sq_iheap_set(h, id, when_us);
}

#endif
