/* Inside the placement core (pl.h): the records of one packing and the
 * functions its files share. pack_batch.c (batch sizes under bursts, the
 * lower bound, advice) is the lowest; pack_nodes.c (devices being built,
 * the merge, incremental re-planning) calls it; pack_links.c (devices
 * behind links, overflow routes) calls both; pack.c (assembling the plan,
 * pl_plan) calls all three. Not part of the public API. */
#ifndef PL_PACK_INT_H
#define PL_PACK_INT_H

#include "pl.h"

/* Float slack for comparisons of times (µs) and of rates that were computed
 * as sums and products: the worked examples sit exactly on their bounds
 * (125 ms duty + 75 ms batch = 200 ms SLO). */
#define TIME_EPS_US 1e-6
#define REL_EPS 1e-9

/* Burst headroom (pl.h, pl_options_t.burst_quantile): the count arriving
 * in a window is Poisson(lambda); a batch of b covers the window when
 * P(N <= b) >= p. lam_max[b] caches the largest such lambda (NAN: not yet
 * computed). p = 0: fluid, batch = ceil(lambda). */
typedef struct {
    double p, z; /* z: the standard normal quantile of p */
    double *lam_max;
    int cap;
} burst_t;

typedef struct {
    int session;
    double rate_rps;
    double solo_duty_us; /* the duty cycle this share would pick alone (pl_residue) */
    double solo_occupancy;
    int batch; /* at the node's duty cycle, filled by eval */
    double latency_us;
    double transfer_us; /* on the node's link, filled by eval_on_link */
} item_t;

typedef struct {
    int id; /* the previous plan's id, or -1 for a new device */
    int saturated;
    double duty_cycle_us;
    double occupancy;
    double memory_bytes;
    int nitems, cap;
    item_t *items;
} node_t;

typedef struct {
    const pl_session_t *sessions;
    int nsessions;
    pl_options_t opt;
    node_t *nodes; /* every device of the plan being built */
    int nnodes, capnodes;
    double *unplaced_rate; /* per session */
    int *unplaced_reason;  /* per session, 0 = none */
    item_t *scratch;       /* room for merged item lists */
    int capscratch;
    burst_t burst;
    double *rate; /* per session: the rate packed (pl.h, burst headroom) */
    char *pooled; /* per session: 1 when rate already holds its bursts (batches fluid) */
} ctx_t;

typedef struct {
    int *idx; /* node indices, sorted by occupancy descending */
    int n, cap;
} binlist_t;

typedef struct {
    int id, index;
} idmap_t;

/* A session's rate still to place (incremental re-planning's pool). */
typedef struct {
    int session;
    double rate_rps;
} share_t;

typedef struct {
    share_t *v;
    int n, cap;
} pool_t;

int pl__batch_for(double duty_us, double rate_rps);

/* The smallest q with P(N <= q) >= p, N ~ Poisson(lambda). */
int pl__poisson_quantile(double lambda, const burst_t *bt);

void pl__burst_init(burst_t *bt, double p);

int pl__clumped(double dispersion);

/* The batch a share of rate_rps runs per duty cycle: fluid (batch_for), or
 * the p-quantile of the count over the cycle, Poisson or clumped. */
int pl__burst_batch(const burst_t *bt, double duty_us, double rate_rps, double dispersion);

int pl__fits_memory(const pl_options_t *opt, double bytes);

/* pl_residue with burst sizing (bt NULL: fluid): the duty cycle for b is
 * the longest whose p-quantile count is at most b. */
int pl__residue(burst_t *bt, double dispersion, const pl_profile_t *p, double slo_us,
                double rate_rps, double k_std, double memory_bytes, int *batch,
                double *duty_cycle_us, double *occupancy);

/* Weights once per model, activations at the largest batch that model runs
 * at on this device (its batches run one at a time). */
double pl__items_memory(const ctx_t *c, const item_t *it, int n);

/* The batch of session s's share at duty cycle d: fluid when its packed
 * rate already holds its bursts (pooled), else the burst quantile. */
int pl__share_batch(const ctx_t *c, int s, double duty_us, double rate_rps);

void pl__add_unplaced(ctx_t *c, int s, double rate, int reason);

/* Residual items sharing one device: duty cycle the least solo duty
 * cycle, batches at it (filled in it). Returns the occupancy, or -1 when
 * a batch misses its SLO, the batches overrun the cycle or the memory
 * does not fit. */
double pl__eval_items(const ctx_t *c, item_t *it, int n, double *duty_out, double *mem_out);

/* Saturate and residue for one share of a session (Algorithm 1, lines 1-9):
 * whole devices at the saturation batch, the rest as one residual item
 * returned in *res (1) or none (0). */
int pl__pack_share(ctx_t *c, int s, double rate, item_t *res);

/* The rate session s is packed at (c->rate[s]). Fluid: its rate. With
 * burst headroom, a session big enough to fill a device at its saturation
 * throughput is sized pooled over all its devices (the dispatcher's
 * matchmaking lets any of them take any of its batches, so the bursts of
 * its shares do not add up) and over its SLO L: a request may wait up to
 * L - l(B) >= l(B) for a batch, so a burst is absorbed over L, not within
 * one cycle. Its rate is then q_p(r L) / L (the p-quantile of the count
 * arriving in one SLO, spread over it) and its shares run fluid batches.
 * A smaller session keeps its rate, and each of its shares sizes its batch
 * for the p-quantile of the count over its own duty cycle (share_batch):
 * there the cycle is the window, since the batch is fixed per cycle. */
void pl__packed_rate(ctx_t *c, int s);

void pl__bins_insert(binlist_t *bl, const ctx_t *c, int node);

/* Best-fit decreasing leaves a tail of lightly filled devices. Try to empty
 * each device, least occupied first, by moving all its sessions into other
 * devices (best fit again); undo when one of them finds no room. Kept
 * devices (an incremental epoch) are emptied too: when load falls, sessions
 * that each kept a device of their own consolidate onto fewer, and the
 * device given back is worth the model loads (squishd moves make before
 * break). At unchanged rates nothing moves: the plan that made them was
 * consolidated already. */
void pl__consolidate(ctx_t *c, binlist_t *bl);

void pl__place_item(ctx_t *c, binlist_t *bl, const item_t *it);

void pl__pool_add(pool_t *p, int s, double rate);

/* Rebuilds the previous plan's devices at the new rates: saturated devices
 * stay while their session still fills them, a residual share takes what is
 * left of its session's rate. Load that no kept device covers goes to pool. */
int pl__keep_previous(ctx_t *c, const pl_plan_t *prev, pool_t *pool);

pl_link_t pl__link_of(const pl_options_t *o, int id);

/* Gives every new node (id -1) of order[0..*keep) an id, and so a link
 * (pl.h): most constrained first (fewest free ids whose link carries it),
 * each the link that carries it at the lowest occupancy (a local device
 * first), its smallest free id there; the local ids past the listed links
 * (an uncapped plan's extra devices) only when no listed one carries it. Feasibility is nested in
 * practice (a node a worse link carries, a better one does too), and then serving the nodes by
 * increasing room places all of them whenever any assignment does, whichever carrying id each
 * takes. A kept node its link no longer carries is re-assigned too. Nodes take their evaluation on
 * the chosen link; those no free id carries leave order (their sessions unplaced,
 * PL_UNPLACED_LINK). ids_limit: ids run 0..ids_limit-1. */
void pl__assign_links(ctx_t *c, int *order, int *keep, const char *used, int ids_limit);

void pl__add_overflow(const ctx_t *c, pl_plan_t *out);

/* qsort orders: items by solo occupancy, decreasing (ties by session);
 * a previous plan's device ids. */
int pl__item_cmp_occ_desc(const void *a, const void *b);
int pl__idmap_cmp(const void *a, const void *b);

#endif
