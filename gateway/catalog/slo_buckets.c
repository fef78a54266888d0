#include "gw_catalog.h"

#include <stddef.h>

/* In ms; see gw_catalog.h. */
static const double slo_buckets_ms[] = {5,   10,   15,   20,   25,   30,   40,    50,    60,
                                        75,  100,  125,  150,  200,  250,  300,   400,   500,
                                        750, 1000, 1500, 2000, 3000, 5000, 10000, 30000, 60000};
#define NBUCKETS (sizeof(slo_buckets_ms) / sizeof(slo_buckets_ms[0]))

double gw_slo_bucket_ms(double slo_ms)
{
    double b = slo_buckets_ms[0];
    for (size_t i = 0; i < NBUCKETS && slo_buckets_ms[i] <= slo_ms; i++)
        b = slo_buckets_ms[i];
    return b;
}
