/* Batching profiles l(b): the latency of a batch of b on one device kind.
 * Both pure cores (placement and dispatch) read latencies through here so
 * that the safety margin (mean + k * std) is applied in one place.
 *
 * A profile is a table of (batch, mean, std) rows sorted by batch, or the
 * linear form l(b) = alpha * b + beta. Between listed batch sizes nothing is
 * assumed: a batch size not in a table is not usable (latency -1), except
 * that a table may be queried at any b up to its largest row by rounding up
 * to the next listed size (a smaller batch never runs slower than a larger
 * one padded). */
#ifndef PL_PROFILE_H
#define PL_PROFILE_H

#include <stdint.h>

#define PL_MAX_BATCH 1024

typedef struct {
    int batch;
    double mean_us;
    double std_us;
} pl_profile_row_t;

typedef struct {
    int linear;                   /* 1: alpha/beta; 0: table */
    double alpha_us;              /* per-item cost, linear form */
    double beta_us;               /* fixed cost, linear form */
    int max_batch;                /* largest usable batch */
    int nrows;                    /* table form */
    pl_profile_row_t *rows;       /* owned; sorted by batch, ascending */
    double memory_bytes;          /* weights + workspace at batch 1 */
    double memory_per_item_bytes; /* activations per extra item */
} pl_profile_t;

/* Linear profile; max_batch bounds b. */
void pl_profile_init_linear(pl_profile_t *p, double alpha_us, double beta_us, int max_batch);
/* Table profile; copies rows (any order; duplicates rejected). Returns 0 or
 * SQ_INVAL for an empty table, a non-positive batch or latency, or a batch
 * listed twice. */
int pl_profile_init_table(pl_profile_t *p, const pl_profile_row_t *rows, int nrows);
void pl_profile_dispose(pl_profile_t *p);
/* Deep copy. */
void pl_profile_copy(pl_profile_t *dst, const pl_profile_t *src);
/* Multiplies every latency (mean and std, or alpha and beta) by factor > 0. */
void pl_profile_scale(pl_profile_t *p, double factor);

/* Latency of a batch of b in µs with the margin mean + k * std; for a table,
 * b is rounded up to the next listed batch. -1 when b < 1 or b exceeds the
 * profile. */
double pl_latency_us(const pl_profile_t *p, int b, double k_std);
/* Memory for a batch of b. */
double pl_memory_bytes(const pl_profile_t *p, int b);

#endif
