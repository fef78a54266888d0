/* Prefix-batched groups (Nexus section 6.3): fine-tuned variants that share
 * all but their last layers run the shared prefix once on the mixed batch
 * and each suffix on its own rows, so the group plans as one session whose
 * l(b) is built here. */
#include "pl.h"

#include <sq.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* std of a profile at b: the margin at k = 1 minus the mean. */
static double std_at(const pl_profile_t *p, int b)
{
    return pl_latency_us(p, b, 1) - pl_latency_us(p, b, 0);
}

int pl_prefix_profile(pl_profile_t *out, const pl_profile_t *prefix,
                      const pl_profile_t *const *suffixes, const double *rates, int n)
{
    memset(out, 0, sizeof(*out));
    if (n < 1 || !prefix || !suffixes || !rates)
        return SQ_INVAL;
    double total = 0;
    for (int i = 0; i < n; i++) {
        if (!suffixes[i] || !(rates[i] >= 0))
            return SQ_INVAL;
        total += rates[i];
    }
    pl_profile_row_t *rows = sq_xmalloc(sizeof(*rows) * (size_t)prefix->max_batch);
    int nrows = 0;
    for (int b = 1; b <= prefix->max_batch; b++) {
        double mean = pl_latency_us(prefix, b, 0), std = std_at(prefix, b);
        if (mean <= 0)
            break;
        int ok = 1;
        for (int i = 0; i < n && ok; i++) {
            double share = total > 0 ? rates[i] / total : 1.0 / n;
            /* the slack keeps b * (r / R) from rounding up past an exact count */
            int sb = (int)ceil(b * share - 1e-9);
            if (sb < 1)
                continue;
            double l = pl_latency_us(suffixes[i], sb, 0);
            if (l <= 0) {
                ok = 0;
                break;
            }
            mean += l;
            std += std_at(suffixes[i], sb);
        }
        if (!ok)
            break;
        rows[nrows++] = (pl_profile_row_t){.batch = b, .mean_us = mean, .std_us = std};
    }
    int rc = nrows > 0 ? pl_profile_init_table(out, rows, nrows) : SQ_INVAL;
    free(rows);
    if (rc < 0)
        return rc;
    out->memory_bytes = prefix->memory_bytes;
    out->memory_per_item_bytes = prefix->memory_per_item_bytes;
    for (int i = 0; i < n; i++) {
        double share = total > 0 ? rates[i] / total : 1.0 / n;
        out->memory_bytes += suffixes[i]->memory_bytes;
        out->memory_per_item_bytes += share * suffixes[i]->memory_per_item_bytes;
    }
    return 0;
}
