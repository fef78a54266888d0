/* Epoch triggers and rate estimates for the planner thread (DESIGN.md,
 * Planner: epochs every 30 s, early on a rate change, at most every 10 s). */
#include "pl.h"

#include <math.h>

void pl_epoch_config_default(pl_epoch_config_t *c)
{
    *c = (pl_epoch_config_t){.period_ms = 30000,
                             .min_interval_ms = 10000,
                             .low = 0.8,
                             .high = 1.1,
                             .ewma_tau_ms = 10000};
}

double pl_rate_ewma(double prev_rps, double count, double interval_ms, double tau_ms)
{
    if (!(interval_ms > 0))
        return prev_rps;
    double sample = count * 1000.0 / interval_ms;
    if (!(tau_ms > 0))
        return sample;
    double w = 1 - exp(-interval_ms / tau_ms);
    return prev_rps + w * (sample - prev_rps);
}

double pl_plan_capacity_rps(const pl_plan_t *plan, int session_id)
{
    double cap = 0;
    for (int i = 0; i < plan->ndevices; i++) {
        const pl_device_t *d = &plan->devices[i];
        for (int a = 0; a < d->nallocs; a++)
            if (d->allocs[a].session_id == session_id && d->duty_cycle_us > 0)
                cap += d->allocs[a].batch * 1e6 / d->duty_cycle_us;
    }
    return cap;
}

pl_epoch_reason_t pl_epoch_due(const pl_epoch_config_t *c, double now_ms, double last_epoch_ms,
                               const double *rate_rps, const double *planned_rps, int n)
{
    double since = now_ms - last_epoch_ms;
    if (since < c->min_interval_ms)
        return PL_EPOCH_NONE;
    if (since >= c->period_ms)
        return PL_EPOCH_PERIODIC;
    for (int i = 0; i < n; i++) {
        double planned = planned_rps[i], rate = rate_rps[i];
        if (planned <= 0 ? rate > 0 : rate < c->low * planned || rate > c->high * planned)
            return PL_EPOCH_RATE_CHANGE;
    }
    return PL_EPOCH_NONE;
}
