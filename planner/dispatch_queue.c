/* Deadline queues and wake-up heaps of the dispatcher core (dispatch_int.h). */
#include "dispatch_int.h"

#include "pl_dispatch.h"

#include <sq.h>

#include <stdlib.h>

/* ---- indexed heap ---- */

void pl__heap_reserve(pl__iheap_t *h, int cap)
{
    if (cap <= h->cap)
        return;
    int ncap = h->cap ? h->cap : 8;
    while (ncap < cap)
        ncap *= 2;
    h->heap = sq_xrealloc(h->heap, sizeof(int) * (size_t)ncap);
    h->pos = sq_xrealloc(h->pos, sizeof(int) * (size_t)ncap);
    h->key = sq_xrealloc(h->key, sizeof(int64_t) * (size_t)ncap);
    for (int i = h->cap; i < ncap; i++)
        h->pos[i] = -1;
    h->cap = ncap;
}

static void heap_swap(pl__iheap_t *h, int i, int j)
{
    int a = h->heap[i], b = h->heap[j];
    h->heap[i] = b;
    h->heap[j] = a;
    h->pos[b] = i;
    h->pos[a] = j;
}

static void heap_up(pl__iheap_t *h, int i)
{
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (h->key[h->heap[parent]] <= h->key[h->heap[i]])
            break;
        heap_swap(h, i, parent);
        i = parent;
    }
}

static void heap_down(pl__iheap_t *h, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->key[h->heap[l]] < h->key[h->heap[m]])
            m = l;
        if (r < h->n && h->key[h->heap[r]] < h->key[h->heap[m]])
            m = r;
        if (m == i)
            return;
        heap_swap(h, i, m);
        i = m;
    }
}

/* Sets id's wake time; PL_NEVER removes it. */
void pl__heap_set(pl__iheap_t *h, int id, int64_t key)
{
    int i = h->pos[id];
    if (key == PL_NEVER) {
        if (i < 0)
            return;
        h->n--;
        if (i != h->n) {
            heap_swap(h, i, h->n);
            h->pos[id] = -1;
            heap_down(h, i);
            heap_up(h, i);
        } else {
            h->pos[id] = -1;
        }
        return;
    }
    if (i < 0) {
        i = h->n++;
        h->heap[i] = id;
        h->pos[id] = i;
        h->key[id] = key;
        heap_up(h, i);
        return;
    }
    int64_t old = h->key[id];
    h->key[id] = key;
    if (key < old)
        heap_up(h, i);
    else if (key > old)
        heap_down(h, i);
}

int64_t pl__heap_top_key(const pl__iheap_t *h)
{
    return h->n ? h->key[h->heap[0]] : PL_NEVER;
}

void pl__heap_dispose(pl__iheap_t *h)
{
    free(h->heap);
    free(h->pos);
    free(h->key);
}

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
