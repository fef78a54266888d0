/* A pipeline's split for the planning loop (pl_loop.h: pl_loop_split): the
 * DP over the stages' budgets with the overhead and slack sharing, or the
 * even split. Pure: no loop state. */
#include "pl_loop.h"

#include <sq.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- splits ------------------------------------------------------------- */

double pl_loop_split_allowance(double cheapest_devices)
{
    double low = cheapest_devices * 2 < 1 ? cheapest_devices * 2 : 1;
    double high = cheapest_devices * PL_SPLIT_ALLOWANCE;
    return low > high ? low : high;
}

int pl_loop_split(const pl_loop_split_in_t *in, double *budget_us, pl_loop_split_why_t *why,
                  int *missing, pl_query_result_t *res)
{
    int n = in->nstages;
    *missing = -1;
    if (res != NULL)
        memset(res, 0, sizeof(*res));
    if (n < 1 || in->stages == NULL || !(in->slo_us > 0))
        return SQ_INVAL;
    for (int v = 0; v < n; v++)
        if (in->stages[v].profile == NULL)
            *missing = v;
    /* Of a stage's budget, its batches get what the overhead leaves: a
     * budget the DP finds cheapest on paper but that holds no batch live
     * would drop every query. */
    pl_stage_t *st = sq_xmalloc(sizeof(*st) * (size_t)n);
    for (int v = 0; v < n; v++) {
        st[v] = in->stages[v];
        st[v].overhead_us = in->overhead_us;
    }
    /* The DP minimizes devices at the rate: a rate of 0 makes every split
     * free, so at least one query a second is assumed. */
    double rate = in->rate_qps > 1 ? in->rate_qps : 1;
    int rc = 0;
    *why = in->even        ? PL_LOOP_SPLIT_EVEN_ASKED
           : *missing >= 0 ? PL_LOOP_SPLIT_EVEN_NO_PROFILE
                           : PL_LOOP_SPLIT_DP;
    if (*why == PL_LOOP_SPLIT_DP) {
        pl_query_result_t dp;
        /* 1000 steps over the SLO, or epsilon when that is finer (the DP's
         * series step is quadratic in the steps). */
        double eps = fmin(in->epsilon_us, in->slo_us / 1000.0);
        rc = pl_query_split(&dp, st, n, in->slo_us, rate, eps, in->k_std);
        /* The slack to where the load is (pl_query_share_slack); then, where
         * the devices the cheapest split needs hold more, the split with the
         * most slack for every stage (pl_query_most_slack): a frame slower to
         * decode than the mean, a burst, a busy neighbour. */
        if (rc == 0)
            rc = pl_query_share_slack(&dp, st, n, in->slo_us, in->k_std);
        if (rc == 0)
            rc = pl_query_most_slack(&dp, st, n, in->slo_us, in->k_std,
                                     pl_loop_split_allowance(dp.cost_devices));
        if (rc == 0) {
            memcpy(budget_us, dp.budget_us, sizeof(double) * (size_t)n);
            if (res != NULL)
                *res = dp;
            else
                pl_query_result_dispose(&dp);
        } else {
            pl_query_result_dispose(&dp);
            *why = PL_LOOP_SPLIT_EVEN_NO_DP;
        }
    }
    if (*why != PL_LOOP_SPLIT_DP) {
        rc = pl_query_even_budgets(st, n, in->slo_us, budget_us);
        if (rc == 0 && res != NULL)
            rc = *missing >= 0 ? SQ_DEADLINE
                               : pl_query_split_even(res, st, n, in->slo_us, rate, in->k_std);
    }
    free(st);
    return rc;
}
