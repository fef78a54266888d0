/* The planning loop's state (loop.c: models, sessions, pipelines, rates and
 * epochs) as its other files read it: loop_plan.c (the jobs and the plans
 * they adopt). Not for use outside planner/. */
#ifndef PL_LOOP_INT_H
#define PL_LOOP_INT_H

#include "pl_loop.h"

#include <sq.h>

typedef struct {
    int64_t key;
    pl_loop_model_t m;
} lmodel_t;

typedef struct {
    int id;
    int64_t model;
    double bucket_ms;
    /* Its own requests (not a pipeline's items: lstage_t counts those). */
    double ewma_rps; /* about epoch.ewma_tau_ms of history */
    double own_rps;  /* max(EWMA, the last interval's) */
    double rate_rps; /* own_rps plus the rates of the stages in its bucket */
    /* The SLO it is planned for: the bucket, or, for a session whose only
     * traffic is pipeline stages', the least of their budgets (at least
     * the bucket: a budget of 355 ms is not planned as 300). */
    double plan_slo_ms;
    double planned_rps;
    double arrivals; /* since the last rate step */
    /* Its own requests' SLO: the least of the last rate interval with
     * any (a bucket holds SLOs from the bucket up to the next one; planned
     * at the bucket, a session of 27 ms requests in bucket 25 may find no
     * batch at all), or the SLO it was made for. */
    double own_slo_ms;
    double least_slo_ms; /* of the arrivals since the last rate step */
} lsess_t;

/* A pipeline stage's items at one query SLO. Their rate is the stage's,
 * not a bucket's: when the split moves the stage's budget to another SLO
 * bucket, the whole rate moves to that bucket's session at once, and the
 * session it left has none of it. Counted per bucket, the old bucket's
 * rate would decay over the EWMA's tau (up fast, down slow) and hold a
 * device meanwhile. */
typedef struct {
    int64_t pipe;
    int stage;
    double query_slo_ms;
    int64_t model;
    double bucket_ms; /* where its rate went at the last compose; 0: nowhere yet */
    double ewma_rps, rate_rps, arrivals;
} lstage_t;

typedef struct {
    int64_t key;
    double slo_ms;
    int nstages;
    pl_loop_stage_t *stages; /* owned */
} lpipe_t;

typedef struct {
    int has;
    pl_plan_t plan;
    int *keys; /* plan device id -> the caller's key */
    int nkeys;
    int64_t last_epoch_us;
    int dirty;
    char reason[48];
    pl_session_t *sessions; /* what the last epoch gave pl_plan (its job's copies) */
    int nsessions;
    pl_profile_t *profiles; /* owned: the sessions' profiles */
    int nprofiles;
    char **names; /* owned: the sessions' names */
    int nnames;
    const pl_loop_job_t *inflight; /* begun, not finished nor freed */
    pl_plan_index_t index;         /* plan read by session */
} lkind_t;

struct pl_loop {
    pl_loop_config_t cfg;
    lmodel_t *models;
    int nmodels, capmodels;
    lsess_t *s;
    int n, cap, next_id;
    lstage_t *st;
    int nst, capst;
    lpipe_t *pipes;
    int npipes, cappipes;
    lkind_t kinds[PL_LOOP_MAX_KINDS];
    sq_map_t model_ix; /* key -> index into models */
    sq_map_t sess_ix;  /* (model, bucket's bits) -> index into s */
    int64_t last_rate_us;
    long long epochs;
};

/* loop.c */
const pl_loop_model_t *pl__loop_model_of(const pl_loop_t *l, int64_t key);
/* Whether model key is planned on kind (active, with a profile there). */
int pl__loop_plannable(const pl_loop_t *l, int64_t key, int kind);
double pl__loop_bucket_of(const pl_loop_t *l, double slo_ms);
/* The session of model at slo_ms's bucket, made (for slo_ms) when create. */
lsess_t *pl__loop_sess(pl_loop_t *l, int64_t model, double slo_ms, int create);
const lsess_t *pl__loop_sess_by_id(const pl_loop_t *l, int id);
/* Each session's rate from its own requests and its stages' (loop.c has
 * the whole rule); returns the kinds (bits) where a stage's rate moved to
 * another bucket since the last call. */
int pl__loop_compose(pl_loop_t *l);
void pl__loop_kind_clear(lkind_t *K);
void pl__loop_free_copies(pl_profile_t *profiles, int nprofiles, char **names, int nnames);

#endif
