/* squish-sim's goodput search (sim_search_goodput): the largest rate scale
 * at which a run meets the target, by doubling or halving then bisection.
 * Calls sim.c (sim_run) and sim_result.c. */
#include "sim.h"

#include <string.h>

int sim_search_goodput(const wl_workload_t *w, const sim_opts_t *opts, double target, double *scale,
                       int *runs, sim_result_t *res)
{
    sim_opts_t o = *opts;
    double base = opts->rate_scale > 0 ? opts->rate_scale : 1;
    double lo = 0, hi = 0;
    int n = 0, rc;
    sim_result_t tmp;
    /* Bracket: double (or halve) until the verdict flips. */
    o.rate_scale = base;
    if ((rc = sim_run(w, &o, &tmp)) < 0)
        goto fail;
    n++;
    int ok = sim_ok_fraction(&tmp) >= target;
    sim_result_dispose(&tmp);
    if (ok) {
        lo = base;
        for (double s = base * 2; s <= base * 1024; s *= 2) {
            o.rate_scale = s;
            if ((rc = sim_run(w, &o, &tmp)) < 0)
                goto fail;
            n++;
            ok = sim_ok_fraction(&tmp) >= target;
            sim_result_dispose(&tmp);
            if (!ok) {
                hi = s;
                break;
            }
            lo = s;
        }
        if (hi == 0)
            hi = lo; /* never saturates within 1024x: report that */
    } else {
        hi = base;
        for (double s = base / 2; s >= base / 1024; s /= 2) {
            o.rate_scale = s;
            if ((rc = sim_run(w, &o, &tmp)) < 0)
                goto fail;
            n++;
            ok = sim_ok_fraction(&tmp) >= target;
            sim_result_dispose(&tmp);
            if (ok) {
                lo = s;
                break;
            }
            hi = s;
        }
    }
    while (lo > 0 && hi > lo && (hi - lo) / hi > 0.002) {
        o.rate_scale = (lo + hi) / 2;
        if ((rc = sim_run(w, &o, &tmp)) < 0)
            goto fail;
        n++;
        if (sim_ok_fraction(&tmp) >= target)
            lo = o.rate_scale;
        else
            hi = o.rate_scale;
        sim_result_dispose(&tmp);
    }
    *scale = lo;
    *runs = n;
    if (lo <= 0) {
        memset(res, 0, sizeof(*res));
        res->overlap_batch = -1;
        return 0;
    }
    o.rate_scale = lo;
    rc = sim_run(w, &o, res);
    (*runs)++;
    return rc;
fail:
    sim_result_dispose(&tmp);
    memset(res, 0, sizeof(*res));
    return rc;
}
