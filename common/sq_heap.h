/* One indexed min-heap for every module: ids 0..cap-1, each present at most
 * once with an int64 key, ordered by (key, id) so that equal keys come out
 * lowest id first whatever the order they went in (a simulation replays
 * exactly). set moves an id already present; remove takes it out. Used by
 * the dispatcher core's wake-ups, the event loop's timers and the
 * simulator's completions. Not thread-safe; the caller owns it. */
#ifndef SQ_HEAP_H
#define SQ_HEAP_H

#include <stdint.h>

typedef struct {
    int *heap;    /* ids in heap order */
    int *pos;     /* pos[id]: index in heap, -1 when absent */
    int64_t *key; /* key[id], valid while present */
    int n, cap;
} sq_iheap_t;

/* Makes room for ids 0..cap-1 (never shrinks). */
void sq_iheap_reserve(sq_iheap_t *h, int cap);
/* Puts id in with key, or moves it there; id < the reserved cap. */
void sq_iheap_set(sq_iheap_t *h, int id, int64_t key);
/* Takes id out; nothing when absent. */
void sq_iheap_remove(sq_iheap_t *h, int id);
/* The id with the least (key, id), or -1 when empty. */
static inline int sq_iheap_top(const sq_iheap_t *h)
{
    return h->n > 0 ? h->heap[0] : -1;
}
/* Its key, or when_empty. */
static inline int64_t sq_iheap_top_key(const sq_iheap_t *h, int64_t when_empty)
{
    return h->n > 0 ? h->key[h->heap[0]] : when_empty;
}
static inline int sq_iheap_has(const sq_iheap_t *h, int id)
{
    return id >= 0 && id < h->cap && h->pos[id] >= 0;
}
/* Frees the arrays; the heap may be reserved again. */
void sq_iheap_dispose(sq_iheap_t *h);

#endif
