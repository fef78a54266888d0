/* The hash map of sq_map.h. */
#include "sq_map.h"

#include "sq_alloc.h"

#include <stdlib.h>
#include <string.h>

static uint32_t slot_of(const sq_map_t *m, uint64_t a, uint64_t b)
{
    uint64_t h = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull + (a << 6) + (a >> 2));
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return (uint32_t)h & (m->cap - 1);
}

static void grow(sq_map_t *m)
{
    sq_map_t old = *m;
    m->cap = old.cap ? 2 * old.cap : 64;
    m->n = 0;
    m->a = sq_xmalloc(sizeof(uint64_t) * m->cap);
    m->b = sq_xmalloc(sizeof(uint64_t) * m->cap);
    m->val = sq_xmalloc(sizeof(int) * m->cap);
    memset(m->val, 0xff, sizeof(int) * m->cap);
    for (uint32_t i = 0; i < old.cap; i++)
        if (old.val[i] >= 0)
            sq_map_put(m, old.a[i], old.b[i], old.val[i]);
    free(old.a);
    free(old.b);
    free(old.val);
}

void sq_map_put(sq_map_t *m, uint64_t a, uint64_t b, int v)
{
    if (2 * (m->n + 1) > m->cap)
        grow(m);
    uint32_t i = slot_of(m, a, b);
    while (m->val[i] >= 0 && !(m->a[i] == a && m->b[i] == b))
        i = (i + 1) & (m->cap - 1);
    if (m->val[i] < 0)
        m->n++;
    m->a[i] = a;
    m->b[i] = b;
    m->val[i] = v;
}

int sq_map_get(const sq_map_t *m, uint64_t a, uint64_t b)
{
    if (m->cap == 0)
        return -1;
    uint32_t i = slot_of(m, a, b);
    while (m->val[i] >= 0) {
        if (m->a[i] == a && m->b[i] == b)
            return m->val[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

void sq_map_clear(sq_map_t *m)
{
    if (m->cap > 0)
        memset(m->val, 0xff, sizeof(int) * m->cap);
    m->n = 0;
}

void sq_map_dispose(sq_map_t *m)
{
    free(m->a);
    free(m->b);
    free(m->val);
    memset(m, 0, sizeof(*m));
}
