/* The indexed min-heap (sq_heap.h). */
#include "sq_heap.h"

#include "sq_alloc.h"

#include <stdlib.h>

void sq_iheap_reserve(sq_iheap_t *h, int cap)
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

static int before(const sq_iheap_t *h, int a, int b)
{
    return h->key[a] < h->key[b] || (h->key[a] == h->key[b] && a < b);
}

static void swap_at(sq_iheap_t *h, int i, int j)
{
    int a = h->heap[i], b = h->heap[j];
    h->heap[i] = b;
    h->heap[j] = a;
    h->pos[b] = i;
    h->pos[a] = j;
}

static void sift_up(sq_iheap_t *h, int i)
{
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!before(h, h->heap[i], h->heap[parent]))
            break;
        swap_at(h, i, parent);
        i = parent;
    }
}

static void sift_down(sq_iheap_t *h, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && before(h, h->heap[l], h->heap[m]))
            m = l;
        if (r < h->n && before(h, h->heap[r], h->heap[m]))
            m = r;
        if (m == i)
            return;
        swap_at(h, i, m);
        i = m;
    }
}

void sq_iheap_set(sq_iheap_t *h, int id, int64_t key)
{
    int i = h->pos[id];
    if (i < 0) {
        i = h->n++;
        h->heap[i] = id;
        h->pos[id] = i;
        h->key[id] = key;
        sift_up(h, i);
        return;
    }
    int64_t old = h->key[id];
    h->key[id] = key;
    if (key < old)
        sift_up(h, i);
    else if (key > old)
        sift_down(h, i);
}

void sq_iheap_remove(sq_iheap_t *h, int id)
{
    if (id < 0 || id >= h->cap)
        return;
    int i = h->pos[id];
    if (i < 0)
        return;
    h->n--;
    if (i != h->n) {
        swap_at(h, i, h->n);
        h->pos[id] = -1;
        sift_down(h, i);
        sift_up(h, i);
    } else {
        h->pos[id] = -1;
    }
}

void sq_iheap_dispose(sq_iheap_t *h)
{
    free(h->heap);
    free(h->pos);
    free(h->key);
    *h = (sq_iheap_t){0};
}
