#include "gw_catalog.h"

#include <pl_loop.h>

/* The planning loop's buckets (pl_loop_slo_bucket_ms): squish-sim plans
 * its sessions at the same ones. */
double gw_slo_bucket_ms(double slo_ms)
{
    return pl_loop_slo_bucket_ms(slo_ms);
}
