/* The preprocess pool (see gw_image.h): a fixed set of threads, each with
 * its own context, fed through a bounded FIFO; decodes that cannot end by
 * their deadline are refused at submit or skipped when they start. */
#include "image_int.h"

#include <sq.h>

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

struct gw_prep_pool {
    pthread_mutex_t mu;
    pthread_cond_t wake; /* a job arrived, or shutdown began */
    gw_prep_job_t *head, *tail;
    int queued;
    int capacity;
    int stopping; /* no more submits */
    int cancel;   /* queued jobs get SQ_SHUTTING_DOWN */
    int joined;
    int nthreads;
    pthread_t *threads;
    gw_prep_ctx_t **ctxs;
    /* Decode times (gw_prep_est_t: an EWMA of the mean and of the absolute
     * deviation), none before the first decode or gw_prep_pool_seed:
     * every decode's duration (what submit plans the queue by), the
     * duration of a small file's decode (below GW_PREP_BYTE_RATE_MIN: the
     * frames a split plans for) and the time per byte of a large file's. */
    gw_prep_costs_t costs;
    /* The time per byte of small files' decodes (not stored): a prior,
     * larger than a large file's, for the first large file a pool sees
     * (gw_prep_pool_decode_borrow_us_for). */
    gw_prep_est_t small_per_byte;
};

typedef struct {
    gw_prep_pool_t *pool;
    gw_prep_ctx_t *ctx;
} worker_arg_t;

/* Runs a job, leaving its result in *rc; returns how long the decode took
 * (0 when it was not decoded). A job that a decode of the usual duration
 * (expect_ns, 0 when none measured yet) would finish past its deadline is
 * not decoded. The caller records the decode, then calls the callback. */
static int64_t run_job(gw_prep_ctx_t *ctx, gw_prep_job_t *job, int cancelled, int64_t expect_ns,
                       int *rc_out)
{
    job->started_ns = sq_now_ns();
    int64_t decode_ns = 0;
    int rc;
    if (cancelled) {
        rc = gw__prep_fail(job->err, sizeof(job->err), SQ_SHUTTING_DOWN,
                           "preprocessing cancelled at shutdown");
    } else if (job->deadline_ns != 0 && job->started_ns >= job->deadline_ns) {
        rc = gw__prep_fail(job->err, sizeof(job->err), SQ_DEADLINE,
                           "deadline passed after %.3f ms in the preprocessing queue",
                           (double)(job->started_ns - job->queued_ns) / 1e6);
    } else if (job->deadline_ns != 0 && job->started_ns + expect_ns >= job->deadline_ns) {
        rc = gw__prep_fail(job->err, sizeof(job->err), SQ_DEADLINE,
                           "too close to its deadline to decode (%.3f ms left after %.3f ms in the "
                           "preprocessing queue, decodes take %.3f ms)",
                           (double)(job->deadline_ns - job->started_ns) / 1e6,
                           (double)(job->started_ns - job->queued_ns) / 1e6,
                           (double)expect_ns / 1e6);
    } else if (job->work != NULL) {
        rc = job->work(ctx, job);
    } else {
        rc = gw__prep_to_rgb(ctx, job->data, job->len, job->out_w, job->out_h, job->mode, job->dst,
                             &job->info, job->err, sizeof(job->err),
                             job->keep_original ? &job->original : NULL, job->keep_cover);
        decode_ns = sq_now_ns() - job->started_ns;
    }
    job->finished_ns = sq_now_ns();
    *rc_out = rc;
    return decode_ns;
}

/* What a decode of len bytes is expected to take (pool->mu held): the mean
 * decode, or for a large file (where the time per byte outweighs a
 * decode's fixed cost) the time per byte of large files times len when
 * that is more. Small files' time per byte is mostly their fixed cost: it
 * would make a large file's estimate several times too long. */
static double expect_decode_ns(const gw_prep_pool_t *pool, size_t len)
{
    double by_size = len >= GW_PREP_BYTE_RATE_MIN ? pool->costs.per_byte.mean_ns * (double)len : 0;
    return by_size > pool->costs.decode.mean_ns ? by_size : pool->costs.decode.mean_ns;
}

void gw_prep_est_add(gw_prep_est_t *est, double x)
{
    if (est->samples <= 0) {
        *est = (gw_prep_est_t){.mean_ns = x, .dev_ns = 0, .samples = 1};
        return;
    }
    /* The deviation from the mean before this sample moves it, so that a
     * sample far out counts in full. */
    double dev = x > est->mean_ns ? x - est->mean_ns : est->mean_ns - x;
    est->dev_ns = (1 - GW_PREP_EST_WEIGHT) * est->dev_ns + GW_PREP_EST_WEIGHT * dev;
    est->mean_ns = (1 - GW_PREP_EST_WEIGHT) * est->mean_ns + GW_PREP_EST_WEIGHT * x;
    est->samples++;
}

double gw_prep_est_p99(const gw_prep_est_t *est)
{
    return est->samples > 0 ? est->mean_ns + GW_PREP_EST_P99_DEVS * est->dev_ns : 0;
}

static void *pool_thread(void *arg)
{
    gw_prep_pool_t *pool = ((worker_arg_t *)arg)->pool;
    gw_prep_ctx_t *ctx = ((worker_arg_t *)arg)->ctx;
    free(arg);
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (pool->head == NULL && !pool->stopping)
            pthread_cond_wait(&pool->wake, &pool->mu);
        gw_prep_job_t *job = pool->head;
        if (job == NULL)
            break; /* stopping and drained */
        pool->head = job->next_;
        if (pool->head == NULL)
            pool->tail = NULL;
        pool->queued--;
        int cancelled = pool->cancel;
        /* A decode's time is planned from its own size (issue 23: a 12 MP
         * photo judged by the mean of small frames); other work by the mean. */
        size_t len = job->work == NULL ? job->len : 0;
        int64_t expect_ns = (int64_t)expect_decode_ns(pool, len);
        pthread_mutex_unlock(&pool->mu);
        job->next_ = NULL;
        int rc = 0;
        int64_t decode_ns = run_job(ctx, job, cancelled, expect_ns, &rc);
        /* The decode is counted before its callback runs: whoever the
         * callback wakes plans its next frame with this one in the
         * estimates. The job is gone after its callback. */
        pthread_mutex_lock(&pool->mu);
        if (decode_ns > 0) {
            gw_prep_est_add(&pool->costs.decode, (double)decode_ns);
            if (len >= GW_PREP_BYTE_RATE_MIN)
                gw_prep_est_add(&pool->costs.per_byte, (double)decode_ns / (double)len);
            else
                gw_prep_est_add(&pool->costs.frame, (double)decode_ns);
            if (len > 0 && len < GW_PREP_BYTE_RATE_MIN)
                gw_prep_est_add(&pool->small_per_byte, (double)decode_ns / (double)len);
        }
        pthread_mutex_unlock(&pool->mu);
        job->done(job, rc);
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void pool_release(gw_prep_pool_t *pool)
{
    for (int i = 0; i < pool->nthreads; i++)
        gw_prep_ctx_free(pool->ctxs[i]);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    free(pool->ctxs);
    free(pool->threads);
    free(pool);
}

int gw_prep_pool_new(const gw_prep_pool_config_t *cfg, gw_prep_pool_t **out)
{
    *out = NULL;
    if (cfg == NULL || cfg->threads < 1 || cfg->threads > 1024 || cfg->queue_capacity < 1)
        return SQ_INVAL;
    gw_prep_pool_t *pool = sq_xcalloc(1, sizeof(*pool));
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->capacity = cfg->queue_capacity;
    pool->nthreads = cfg->threads;
    pool->threads = sq_xcalloc((size_t)cfg->threads, sizeof(pthread_t));
    pool->ctxs = sq_xcalloc((size_t)cfg->threads, sizeof(gw_prep_ctx_t *));
    for (int i = 0; i < cfg->threads; i++) {
        pool->ctxs[i] = gw_prep_ctx_new(&cfg->limits);
        if (pool->ctxs[i] == NULL) {
            pool_release(pool);
            return SQ_NOMEM;
        }
    }
    for (int i = 0; i < cfg->threads; i++) {
        worker_arg_t *arg = sq_xmalloc(sizeof(*arg));
        *arg = (worker_arg_t){.pool = pool, .ctx = pool->ctxs[i]};
        int err = pthread_create(&pool->threads[i], NULL, pool_thread, arg);
        if (err != 0) {
            free(arg);
            SQ_ERROR("preprocess pool: cannot start a thread errno=%d", err);
            pthread_mutex_lock(&pool->mu);
            pool->stopping = 1;
            pthread_cond_broadcast(&pool->wake);
            pthread_mutex_unlock(&pool->mu);
            for (int j = 0; j < i; j++)
                pthread_join(pool->threads[j], NULL);
            pool_release(pool);
            return SQ_INTERNAL;
        }
    }
    *out = pool;
    return 0;
}

int gw_prep_pool_submit(gw_prep_pool_t *pool, gw_prep_job_t *job)
{
    if (pool == NULL || job == NULL || job->done == NULL)
        return SQ_INVAL;
    if (job->work == NULL &&
        (job->dst == NULL || job->out_w < 1 || job->out_h < 1 || job->out_w > MAX_TARGET_SIDE ||
         job->out_h > MAX_TARGET_SIDE || (job->data == NULL && job->len > 0)))
        return SQ_INVAL;
    job->original = NULL;
    job->next_ = NULL;
    job->err[0] = '\0';
    job->queued_ns = sq_now_ns();
    job->started_ns = job->finished_ns = 0;
    pthread_mutex_lock(&pool->mu);
    int rc = 0;
    if (pool->stopping) {
        rc = SQ_SHUTTING_DOWN;
    } else if (pool->queued >= pool->capacity) {
        rc = SQ_OVERLOAD;
    } else if (job->deadline_ns != 0 && pool->queued > 0 &&
               job->queued_ns + (int64_t)((double)(pool->queued + pool->nthreads) *
                                          pool->costs.decode.mean_ns / pool->nthreads) >=
                   job->deadline_ns) {
        /* The jobs ahead of it and its own decode, at the recent decode
         * time, leave it no chance to be done by its deadline: say so now
         * rather than at the deadline. */
        rc = SQ_DEADLINE;
    } else {
        if (pool->tail != NULL)
            pool->tail->next_ = job;
        else
            pool->head = job;
        pool->tail = job;
        pool->queued++;
        pthread_cond_signal(&pool->wake);
    }
    pthread_mutex_unlock(&pool->mu);
    return rc;
}

double gw_prep_pool_decode_us(gw_prep_pool_t *pool)
{
    pthread_mutex_lock(&pool->mu);
    double us = pool->costs.decode.mean_ns / 1000.0;
    pthread_mutex_unlock(&pool->mu);
    return us;
}

double gw_prep_pool_decode_p99_us(gw_prep_pool_t *pool)
{
    pthread_mutex_lock(&pool->mu);
    /* Small frames' when any were seen: a large file's decode is planned
     * by its own size, and counting it here would give every frame a 12
     * MP photo's decode. */
    const gw_prep_est_t *est =
        pool->costs.frame.samples > 0 ? &pool->costs.frame : &pool->costs.decode;
    double us = gw_prep_est_p99(est) / 1000.0;
    pthread_mutex_unlock(&pool->mu);
    return us;
}

void gw_prep_pool_costs(gw_prep_pool_t *pool, gw_prep_costs_t *out)
{
    pthread_mutex_lock(&pool->mu);
    *out = pool->costs;
    pthread_mutex_unlock(&pool->mu);
}

/* One estimate from a stored one, only while the pool has none of its
 * own (a decode measured here is worth more than one from before). */
static void seed_one(gw_prep_est_t *mine, const gw_prep_est_t *stored)
{
    if (mine->samples > 0 || stored->samples <= 0 || !(stored->mean_ns > 0) ||
        !(stored->dev_ns >= 0) || !isfinite(stored->mean_ns) || !isfinite(stored->dev_ns))
        return;
    *mine = *stored;
}

void gw_prep_pool_seed(gw_prep_pool_t *pool, const gw_prep_costs_t *stored)
{
    pthread_mutex_lock(&pool->mu);
    seed_one(&pool->costs.decode, &stored->decode);
    seed_one(&pool->costs.frame, &stored->frame);
    seed_one(&pool->costs.per_byte, &stored->per_byte);
    pthread_mutex_unlock(&pool->mu);
}

double gw_prep_pool_decode_us_for(gw_prep_pool_t *pool, size_t len)
{
    pthread_mutex_lock(&pool->mu);
    double us = expect_decode_ns(pool, len) / 1000.0;
    pthread_mutex_unlock(&pool->mu);
    return us;
}

double gw_prep_pool_decode_borrow_us_for(gw_prep_pool_t *pool, size_t len)
{
    pthread_mutex_lock(&pool->mu);
    double ns = expect_decode_ns(pool, len);
    if (len >= GW_PREP_BYTE_RATE_MIN && pool->costs.per_byte.samples <= 0 &&
        pool->small_per_byte.samples > 0) {
        double prior = pool->small_per_byte.mean_ns * (double)len;
        ns = prior > ns ? prior : ns;
    }
    pthread_mutex_unlock(&pool->mu);
    return ns / 1000.0;
}

int gw_prep_pool_queued(gw_prep_pool_t *pool)
{
    pthread_mutex_lock(&pool->mu);
    int n = pool->queued;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

void gw_prep_pool_shutdown(gw_prep_pool_t *pool, gw_prep_shutdown_t how)
{
    if (pool == NULL || pool->joined)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stopping = 1;
    if (how == GW_PREP_CANCEL)
        pool->cancel = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 0; i < pool->nthreads; i++)
        pthread_join(pool->threads[i], NULL);
    pool->joined = 1;
}

void gw_prep_pool_free(gw_prep_pool_t *pool)
{
    if (pool == NULL)
        return;
    gw_prep_pool_shutdown(pool, GW_PREP_DRAIN);
    pool_release(pool);
}
