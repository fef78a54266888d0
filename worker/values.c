/* What the backends ask of the lowered graph and of the plan they build,
 * below every file that calls it (the backends, the fusion passes, the
 * executor): the shape of a value at a batch size, and a plan's failure
 * text (wk_fail). */
#include "wk_exec_int.h"

#include <stdarg.h>
#include <stdio.h>

int64_t wk_value_elems(const wk_value_t *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->dims[d];
    return n;
}

int wk_value_dims_at(const wk_value_t *v, int batch, int64_t *out)
{
    for (int d = 0; d < v->ndim; d++)
        out[d] = v->dims[d];
    if (v->batched && v->ndim > 0)
        out[0] = batch;
    return v->ndim;
}

int64_t wk_value_elems_at(const wk_value_t *v, int batch)
{
    int64_t dims[WK_MAX_DIMS];
    int n = wk_value_dims_at(v, batch, dims);
    int64_t e = 1;
    for (int d = 0; d < n; d++)
        e *= dims[d];
    return e;
}

int wk_fail(wk_plan_t *plan, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(plan->why, sizeof(plan->why), fmt, ap);
    va_end(ap);
    return err;
}
