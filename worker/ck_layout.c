/* The host side of the cuda backend's pointwise kernel (ck_types.h):
 * the order and shape its threads walk. Plain C, built with or without
 * CUDA. */
#include "ck_types.h"

#include <stdint.h>

/* The tensors a pointwise reads or writes through strides. */
static int tensors(ck_pointwise_t *p, ck_ten_t **t)
{
    int nt = 0;
    t[nt++] = &p->y;
    t[nt++] = &p->x;
    for (int k = 0; k < p->n_post; k++)
        if (p->post[k].op != CK_OP_ACT && p->post[k].op != CK_OP_SCALE)
            t[nt++] = &p->post[k].t;
    return nt;
}

static int64_t mag(int64_t s)
{
    return s < 0 ? -s : s;
}

/* Largest |y stride| first, stable (insertion sort over at most 8 dims):
 * an NHWC output walked in its logical NCHW order would put neighbouring
 * threads C elements apart, each access a memory transaction of its own. */
static void order_by_output(ck_pointwise_t *p, ck_ten_t **t, int nt)
{
    for (int i = 1; i < p->ndim; i++)
        for (int j = i; j > 0 && mag(p->y.st[j - 1]) < mag(p->y.st[j]); j--) {
            int64_t d = p->dims[j - 1];
            p->dims[j - 1] = p->dims[j];
            p->dims[j] = d;
            for (int k = 0; k < nt; k++) {
                int64_t s = t[k]->st[j - 1];
                t[k]->st[j - 1] = t[k]->st[j];
                t[k]->st[j] = s;
            }
        }
}

/* Drops dims of size 1 and merges neighbours that are contiguous in every
 * tensor (a plain elementwise op becomes one dim: no index arithmetic). */
static void collapse(ck_pointwise_t *p, ck_ten_t **t, int nt)
{
    int n = 0;
    for (int d = 0; d < p->ndim; d++) {
        if (p->dims[d] == 1)
            continue;
        bool merge = n > 0;
        for (int k = 0; k < nt && merge; k++)
            merge = t[k]->st[n - 1] == t[k]->st[d] * p->dims[d];
        if (merge) {
            p->dims[n - 1] *= p->dims[d];
            for (int k = 0; k < nt; k++)
                t[k]->st[n - 1] = t[k]->st[d];
            continue;
        }
        p->dims[n] = p->dims[d];
        for (int k = 0; k < nt; k++)
            t[k]->st[n] = t[k]->st[d];
        n++;
    }
    if (n == 0) {
        p->dims[0] = 1;
        for (int k = 0; k < nt; k++)
            t[k]->st[0] = 0;
        n = 1;
    }
    p->ndim = n;
}

static bool fits32(const ck_pointwise_t *p, ck_ten_t *const *t, int nt, int64_t n)
{
    const int64_t lim = INT32_MAX;
    if (n > lim / 2) /* the grid-stride step past n must not wrap either */
        return false;
    for (int k = 0; k < nt; k++) {
        int64_t reach = 0;
        for (int d = 0; d < p->ndim; d++) {
            if (t[k]->st[d] < 0)
                return false;
            reach += (p->dims[d] - 1) * t[k]->st[d];
        }
        if (reach > lim)
            return false;
    }
    return true;
}

bool ck_pointwise_prepare(ck_pointwise_t *p, int64_t n)
{
    ck_ten_t *t[2 + CK_MAX_POST];
    const int nt = tensors(p, t);
    order_by_output(p, t, nt);
    collapse(p, t, nt);
    return fits32(p, t, nt, n);
}

void ck_resize_prepare(ck_resize_t *p)
{
    for (int d = 0; d < 4; d++)
        p->order[d] = d;
    /* largest |y stride| first, stable (insertion sort over 4 dims): an
     * NHWC output is walked N, H, W, C */
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && mag(p->y.st[p->order[j - 1]]) < mag(p->y.st[p->order[j]]); j--) {
            int t = p->order[j - 1];
            p->order[j - 1] = p->order[j];
            p->order[j] = t;
        }
}
