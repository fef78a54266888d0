/* Internals of the dispatcher core shared between its files: the deadline
 * queue (a ring buffer kept sorted by deadline) and the indexed min-heap of
 * wake-up times. Not part of the public API (pl_dispatch.h). */
#ifndef PL_DISPATCH_INT_H
#define PL_DISPATCH_INT_H

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

/* Indexed min-heap over ids 0..cap-1 keyed by key[id]. */
typedef struct {
    int *heap;
    int *pos; /* -1 when absent */
    int64_t *key;
    int n, cap;
} pl__iheap_t;

/* The i-th request from the head (earliest deadline); i < q->n. */
static inline pl__entry_t *pl__q_at(const pl__queue_t *q, uint32_t i)
{
    return &q->buf[(q->head + i) & q->mask];
}

/* Inserts in deadline order (equal deadlines keep arrival order). */
void pl__q_insert(pl__queue_t *q, const pl__entry_t *e);
/* Removes and returns the head; q->n > 0. */
pl__entry_t pl__q_pop(pl__queue_t *q);

/* Makes room for ids 0..cap-1. */
void pl__heap_reserve(pl__iheap_t *h, int cap);
/* Sets id's wake time; PL_NEVER (INT64_MAX) removes it. */
void pl__heap_set(pl__iheap_t *h, int id, int64_t key);
/* The earliest wake time, INT64_MAX when empty. */
int64_t pl__heap_top_key(const pl__iheap_t *h);
void pl__heap_dispose(pl__iheap_t *h);

#endif
