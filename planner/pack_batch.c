/* Batch sizes for a rate under an SLO (pl.h): Nexus's saturated and
 * residual batches, with burst headroom (a Poisson quantile of what
 * arrives in a duty cycle, clumps counted by their dispersion); the lower
 * bound on devices and Symphony's autoscaling advice. */
#include "pack_int.h"

#include <sq.h>

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int pl__batch_for(double duty_us, double rate_rps)
{
    /* The batch that collects a duty cycle's worth of requests; the slack
     * keeps b / r * r from rounding up to b + 1. */
    double b = ceil(duty_us * rate_rps * 1e-6 - REL_EPS);
    return b < 1 ? 1 : (int)b;
}

/* Exact Poisson sums up to this mean; past it the normal approximation
 * with continuity correction (its error there is far below the margin). */
#define POISSON_EXACT_MAX 200.0
#define BURST_QUANTILE_MAX (1 - 1e-9)

static double poisson_cdf(int b, double lambda)
{
    double term = exp(-lambda), sum = term;
    for (int k = 1; k <= b; k++) {
        term *= lambda / k;
        sum += term;
    }
    return sum;
}

/* The smallest q with P(N <= q) >= p, N ~ Poisson(lambda). */
int pl__poisson_quantile(double lambda, const burst_t *bt)
{
    if (!(lambda > 0))
        return 0;
    if (lambda > POISSON_EXACT_MAX)
        return (int)ceil(lambda + bt->z * sqrt(lambda) - 0.5 - REL_EPS);
    double term = exp(-lambda), sum = term;
    int q = 0;
    while (sum < bt->p) {
        q++;
        term *= lambda / q;
        sum += term;
    }
    return q;
}

/* The largest lambda whose p-quantile is at most b. */
static double burst_lambda_max(burst_t *bt, int b)
{
    if (b < bt->cap && !isnan(bt->lam_max[b]))
        return bt->lam_max[b];
    double lam;
    if (b + 0.5 > POISSON_EXACT_MAX) {
        double root = (-bt->z + sqrt(bt->z * bt->z + 4 * (b + 0.5))) / 2;
        lam = root * root;
    } else {
        double lo = 0, hi = b + 1; /* P(N <= b) falls as lambda grows */
        for (int i = 0; i < 60; i++) {
            double mid = (lo + hi) / 2;
            if (poisson_cdf(b, mid) >= bt->p)
                lo = mid;
            else
                hi = mid;
        }
        lam = lo;
    }
    if (b >= bt->cap) {
        int cap = b + 64;
        bt->lam_max = sq_xrealloc(bt->lam_max, sizeof(double) * (size_t)cap);
        for (int i = bt->cap; i < cap; i++)
            bt->lam_max[i] = NAN;
        bt->cap = cap;
    }
    bt->lam_max[b] = lam;
    return lam;
}

void pl__burst_init(burst_t *bt, double p)
{
    memset(bt, 0, sizeof(*bt));
    if (!(p > 0))
        return;
    /* p = 1 would want unbounded batches: the closest finite quantile. */
    bt->p = p < BURST_QUANTILE_MAX ? p : BURST_QUANTILE_MAX;
    double lo = 0, hi = 10; /* Phi(z) = p, p in (0, 1) */
    for (int i = 0; i < 80; i++) {
        double mid = (lo + hi) / 2;
        if (0.5 * erfc(-mid / sqrt(2)) < p)
            lo = mid;
        else
            hi = mid;
    }
    bt->z = hi;
}

/* Clumped arrivals (pl_session_t.dispersion D) are sized as clumps of D
 * arriving as a Poisson stream: D times a Poisson count of mean lambda / D,
 * the compound Poisson with one clump size that has the count's mean and
 * variance. That stands for clumps of several requests; below D = 2 the
 * clumps are mostly single requests (a parent batch of 4 frames with 0.1
 * crops each: D = 1.4), whose count is nearly Poisson, and the one-size
 * approximation would wrongly round a batch down to whole clumps of 1.4
 * (measured live: a classifier of 30 req/s pushed off the planned devices,
 * 6% of queries dropped), so they are sized as Poisson. */
#define CLUMP_MIN_DISPERSION 2.0

int pl__clumped(double dispersion)
{
    return dispersion >= CLUMP_MIN_DISPERSION;
}

/* The batch a share of rate_rps runs per duty cycle: fluid (batch_for), or
 * the p-quantile of the count over the cycle, Poisson or clumped. */
int pl__burst_batch(const burst_t *bt, double duty_us, double rate_rps, double dispersion)
{
    if (bt == NULL || !(bt->p > 0))
        return pl__batch_for(duty_us, rate_rps);
    if (pl__clumped(dispersion)) {
        int q = pl__poisson_quantile(duty_us * rate_rps * 1e-6 * (1 - REL_EPS) / dispersion, bt);
        double b = ceil(q * dispersion - REL_EPS);
        return b < 1 ? 1 : b > INT_MAX / 2 ? INT_MAX / 2 : (int)b;
    }
    int q = pl__poisson_quantile(duty_us * rate_rps * 1e-6 * (1 - REL_EPS), bt);
    return q < 1 ? 1 : q;
}

/* The longest duty cycle at which a share of rate_rps needs at most b. */
static double burst_duty_us(burst_t *bt, int b, double rate_rps, double dispersion)
{
    if (bt == NULL || !(bt->p > 0))
        return b / rate_rps * 1e6;
    if (pl__clumped(dispersion))
        return dispersion * burst_lambda_max(bt, (int)floor(b / dispersion + REL_EPS)) / rate_rps *
               1e6;
    return burst_lambda_max(bt, b) / rate_rps * 1e6;
}

int pl__fits_memory(const pl_options_t *opt, double bytes)
{
    return opt->device_memory_bytes <= 0 || bytes <= opt->device_memory_bytes;
}

double pl_max_throughput_rps(const pl_profile_t *p, double slo_us, double k_std,
                             double memory_bytes, int *batch)
{
    double best = 0;
    int best_b = 0;
    /* l(b)/b non-increasing is all we assume, so scan rather than solve:
     * tables round up and need not be linear. */
    for (int b = 1; b <= p->max_batch; b++) {
        double l = pl_latency_us(p, b, k_std);
        if (l <= 0 || 2 * l > slo_us + TIME_EPS_US)
            continue;
        if (memory_bytes > 0 && pl_memory_bytes(p, b) > memory_bytes)
            break;
        double thr = b / l * 1e6;
        if (thr >= best * (1 - REL_EPS)) {
            best = thr;
            best_b = b;
        }
    }
    *batch = best_b;
    return best;
}

/* pl_residue with burst sizing (bt NULL: fluid): the duty cycle for b is
 * the longest whose p-quantile count is at most b. */
int pl__residue(burst_t *bt, double dispersion, const pl_profile_t *p, double slo_us,
                double rate_rps, double k_std, double memory_bytes, int *batch,
                double *duty_cycle_us, double *occupancy)
{
    int best_b = 0;
    double best_d = 0, best_occ = INFINITY;
    /* For each b: the duty cycle that collects b requests (b / r), shortened
     * to L - l(b) when that is too long for the SLO (low rates: the batch
     * then collects fewer than b). The lowest occupancy wins; in the usual
     * case that is Nexus's largest b with b / r + l(b) <= L, since
     * r l(b) / b does not grow with b. */
    for (int b = 1; b <= p->max_batch; b++) {
        double l = pl_latency_us(p, b, k_std);
        if (l <= 0)
            continue;
        double d = slo_us - l;
        if (rate_rps > 0 && burst_duty_us(bt, b, rate_rps, dispersion) < d)
            d = burst_duty_us(bt, b, rate_rps, dispersion);
        if (d <= 0)
            continue;
        int eb = pl__burst_batch(bt, d, rate_rps, dispersion);
        double el = pl_latency_us(p, eb, k_std);
        if (el <= 0 || el > d + TIME_EPS_US || d + el > slo_us + TIME_EPS_US)
            continue;
        if (memory_bytes > 0 && pl_memory_bytes(p, eb) > memory_bytes)
            continue;
        double occ = el / d;
        if (occ <= best_occ * (1 + REL_EPS)) {
            best_occ = occ;
            best_b = eb;
            best_d = d;
        }
    }
    if (best_b == 0)
        return SQ_DEADLINE;
    *batch = best_b;
    *duty_cycle_us = best_d;
    *occupancy = best_occ;
    return 0;
}

int pl_residue(const pl_profile_t *p, double slo_us, double rate_rps, double k_std,
               double memory_bytes, int *batch, double *duty_cycle_us, double *occupancy)
{
    return pl__residue(NULL, 1, p, slo_us, rate_rps, k_std, memory_bytes, batch, duty_cycle_us,
                       occupancy);
}

double pl_lower_bound(const pl_session_t *sessions, int nsessions, const pl_options_t *opt)
{
    double sum = 0;
    for (int i = 0; i < nsessions; i++) {
        int b;
        double t = pl_max_throughput_rps(sessions[i].profile, sessions[i].slo_us, opt->k_std,
                                         opt->device_memory_bytes, &b);
        if (t > 0)
            sum += sessions[i].rate_rps / t;
    }
    return sum;
}

double pl_advice_add(int ndevices, double bad_rate)
{
    if (ndevices <= 0 || bad_rate <= 0)
        return 0;
    if (bad_rate > 0.99)
        bad_rate = 0.99;
    return ndevices * bad_rate / (1 - bad_rate);
}

double pl_advice_release(int ndevices, double idle_fraction)
{
    if (ndevices <= 0 || idle_fraction <= 0)
        return 0;
    if (idle_fraction > 1)
        idle_fraction = 1;
    return ndevices * idle_fraction;
}
