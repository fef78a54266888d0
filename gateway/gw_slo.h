/* SLO buckets: a request joins the dispatcher session of the largest bucket
 * not above its SLO, so that a session's batches fit every member's SLO and
 * the number of sessions (and of metric label values) stays bounded. */
#ifndef GW_SLO_H
#define GW_SLO_H

/* The bucket of slo_ms, in ms (the smallest bucket for anything below it). */
double gw_slo_bucket_ms(double slo_ms);

#endif
