#include "pl_profile.h"

#include <sq.h>

#include <stdlib.h>
#include <string.h>

void pl_profile_init_linear(pl_profile_t *p, double alpha_us, double beta_us, int max_batch)
{
    memset(p, 0, sizeof(*p));
    p->linear = 1;
    p->alpha_us = alpha_us;
    p->beta_us = beta_us;
    p->max_batch = max_batch > PL_MAX_BATCH ? PL_MAX_BATCH : max_batch;
}

static int row_cmp(const void *a, const void *b)
{
    const pl_profile_row_t *x = a, *y = b;
    return (x->batch > y->batch) - (x->batch < y->batch);
}

int pl_profile_init_table(pl_profile_t *p, const pl_profile_row_t *rows, int nrows)
{
    memset(p, 0, sizeof(*p));
    if (nrows <= 0)
        return SQ_INVAL;
    pl_profile_row_t *copy = sq_xmalloc(sizeof(*copy) * (size_t)nrows);
    memcpy(copy, rows, sizeof(*copy) * (size_t)nrows);
    qsort(copy, (size_t)nrows, sizeof(*copy), row_cmp);
    for (int i = 0; i < nrows; i++) {
        if (copy[i].batch < 1 || copy[i].batch > PL_MAX_BATCH || copy[i].mean_us <= 0 ||
            copy[i].std_us < 0 || (i > 0 && copy[i].batch == copy[i - 1].batch)) {
            free(copy);
            return SQ_INVAL;
        }
    }
    p->rows = copy;
    p->nrows = nrows;
    p->max_batch = copy[nrows - 1].batch;
    return 0;
}

void pl_profile_dispose(pl_profile_t *p)
{
    free(p->rows);
    p->rows = NULL;
    p->nrows = 0;
}

void pl_profile_copy(pl_profile_t *dst, const pl_profile_t *src)
{
    *dst = *src;
    if (src->nrows > 0) {
        dst->rows = sq_xmalloc(sizeof(*dst->rows) * (size_t)src->nrows);
        memcpy(dst->rows, src->rows, sizeof(*dst->rows) * (size_t)src->nrows);
    }
}

void pl_profile_scale(pl_profile_t *p, double factor)
{
    p->alpha_us *= factor;
    p->beta_us *= factor;
    for (int i = 0; i < p->nrows; i++) {
        p->rows[i].mean_us *= factor;
        p->rows[i].std_us *= factor;
    }
}

double pl_latency_us(const pl_profile_t *p, int b, double k_std)
{
    if (b < 1 || b > p->max_batch)
        return -1;
    if (p->linear)
        return p->alpha_us * b + p->beta_us;
    for (int i = 0; i < p->nrows; i++) {
        if (p->rows[i].batch >= b)
            return p->rows[i].mean_us + k_std * p->rows[i].std_us;
    }
    return -1;
}

double pl_memory_bytes(const pl_profile_t *p, int b)
{
    return p->memory_bytes + p->memory_per_item_bytes * (b > 1 ? b - 1 : 0);
}
