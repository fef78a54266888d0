/* gateway/image/pool.c: the preprocess pool, its queue, deadlines and
 * decode estimates. */
#include "preprocess_test.h"

/* ---- the pool ------------------------------------------------------- */

typedef struct {
    gw_prep_job_t job;
    atomic_int calls;
    int rc;
    pthread_t thread;
} tjob_t;

static pthread_t main_thread;

static void on_done(gw_prep_job_t *job, int rc)
{
    tjob_t *t = (tjob_t *)job;
    t->rc = rc;
    t->thread = pthread_self();
    atomic_fetch_add(&t->calls, 1);
}

static void tjob_init(tjob_t *t, blob_t b, int w, int h, uint8_t *dst, gw_prep_done_fn done)
{
    memset(t, 0, sizeof(*t));
    t->job = (gw_prep_job_t){.data = b.data,
                             .len = b.len,
                             .out_w = w,
                             .out_h = h,
                             .dst = dst,
                             .mode = GW_RESIZE_BILINEAR,
                             .done = done,
                             .user = t};
}

static gw_prep_pool_t *pool_new(int threads, int capacity)
{
    gw_prep_pool_config_t cfg = {
        .threads = threads, .queue_capacity = capacity, .limits = gw_prep_limits_default()};
    gw_prep_pool_t *pool = NULL;
    cr_assert_eq(gw_prep_pool_new(&cfg, &pool), 0);
    return pool;
}

static void wait_for(atomic_int *v, int want)
{
    for (int i = 0; i < 10000 && atomic_load(v) < want; i++)
        usleep(1000);
    cr_assert_geq(atomic_load(v), want, "timed out waiting");
}

Test(prep_pool, every_job_completes_once_on_a_pool_thread, .timeout = 60)
{
    main_thread = pthread_self();
    enum { N = 120 };
    blob_t imgs[3] = {scene_jpeg(640, 480), scene_jpeg(100, 80), {0}};
    imgs[2] = (blob_t){.data = (uint8_t *)"\x89PNG\r\n\x1a\n", .len = 8};
    uint8_t *want[2];
    gw_prep_ctx_t *ctx = ctx_with(1);
    for (int i = 0; i < 2; i++) {
        want[i] = malloc(64 * 48 * 3);
        cr_assert_eq(gw_image_to_rgb(ctx, imgs[i].data, imgs[i].len, 64, 48, GW_RESIZE_BILINEAR,
                                     want[i], NULL, NULL, 0),
                     0);
    }
    gw_prep_ctx_free(ctx);

    gw_prep_pool_t *pool = pool_new(3, N);
    tjob_t *jobs = calloc(N, sizeof(tjob_t));
    uint8_t *dst = malloc((size_t)N * 64 * 48 * 3);
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], imgs[i % 3], 64, 48, dst + (size_t)i * 64 * 48 * 3, on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    gw_prep_pool_shutdown(pool, GW_PREP_DRAIN);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(atomic_load(&jobs[i].calls), 1, "job %d called %d times", i,
                     atomic_load(&jobs[i].calls));
        cr_assert(!pthread_equal(jobs[i].thread, main_thread));
        cr_assert_leq(jobs[i].job.queued_ns, jobs[i].job.started_ns);
        cr_assert_leq(jobs[i].job.started_ns, jobs[i].job.finished_ns);
        if (i % 3 == 2) {
            cr_assert_eq(jobs[i].rc, SQ_MEDIA_TYPE);
            cr_assert(strstr(jobs[i].job.err, "png") != NULL, "%s", jobs[i].job.err);
        } else {
            cr_assert_eq(jobs[i].rc, 0, "job %d: %s", i, jobs[i].job.err);
            cr_assert_eq(memcmp(jobs[i].job.dst, want[i % 3], 64 * 48 * 3), 0, "job %d pixels", i);
            cr_assert_eq(jobs[i].job.info.width, i % 3 == 0 ? 640 : 100);
        }
    }
    tjob_t late;
    tjob_init(&late, imgs[0], 64, 48, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &late.job), SQ_SHUTTING_DOWN);
    gw_prep_pool_shutdown(pool, GW_PREP_CANCEL); /* a second call does nothing */
    gw_prep_pool_free(pool);
    cr_assert_eq(atomic_load(&late.calls), 0);
    free(jobs);
    free(dst);
    free(want[0]);
    free(want[1]);
    blob_free(&imgs[0]);
    blob_free(&imgs[1]);
}

/* A callback that holds its pool thread until the test opens the gate, so
 * that the queue state is deterministic. */
static atomic_int gate_entered, gate_open;

static void on_done_gated(gw_prep_job_t *job, int rc)
{
    atomic_fetch_add(&gate_entered, 1);
    while (!atomic_load(&gate_open))
        usleep(200);
    on_done(job, rc);
}

Test(prep_pool, a_full_queue_is_overload)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    blob_t b = scene_jpeg(64, 64);
    uint8_t dst[5][16 * 16 * 3];
    tjob_t jobs[5];
    gw_prep_pool_t *pool = pool_new(1, 2);
    tjob_init(&jobs[0], b, 16, 16, dst[0], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[0].job), 0);
    wait_for(&gate_entered, 1); /* the only thread is busy with job 0 */
    for (int i = 1; i < 5; i++)
        tjob_init(&jobs[i], b, 16, 16, dst[i], on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[1].job), 0);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[2].job), 0);
    cr_assert_eq(gw_prep_pool_queued(pool), 2);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[3].job), SQ_OVERLOAD);
    cr_assert_eq(sq_err_http_status(SQ_OVERLOAD), 503);
    atomic_store(&gate_open, 1);
    wait_for(&jobs[2].calls, 1);
    /* room again */
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[4].job), 0);
    gw_prep_pool_free(pool);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(atomic_load(&jobs[i].calls), i == 3 ? 0 : 1, "job %d", i);
    cr_assert_eq(jobs[1].rc, 0);
    cr_assert_eq(jobs[4].rc, 0);
    blob_free(&b);
}

static void *shutdown_cancel(void *pool)
{
    gw_prep_pool_shutdown(pool, GW_PREP_CANCEL);
    return NULL;
}

Test(prep_pool, shutdown_cancel_answers_queued_jobs_with_shutting_down)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    blob_t b = scene_jpeg(64, 64);
    enum { N = 8 };
    static uint8_t dst[N][16 * 16 * 3];
    static tjob_t jobs[N];
    gw_prep_pool_t *pool = pool_new(1, N - 1);
    tjob_init(&jobs[0], b, 16, 16, dst[0], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &jobs[0].job), 0);
    wait_for(&gate_entered, 1);
    for (int i = 1; i < N; i++) {
        tjob_init(&jobs[i], b, 16, 16, dst[i], on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    pthread_t t;
    pthread_create(&t, NULL, shutdown_cancel, pool);
    /* wait until shutdown has begun: submits are refused */
    tjob_t probe;
    tjob_init(&probe, b, 16, 16, dst[0], on_done);
    int refused = 0;
    for (int i = 0; i < 5000 && !refused; i++) {
        int rc = gw_prep_pool_submit(pool, &probe.job);
        cr_assert(rc == SQ_OVERLOAD || rc == SQ_SHUTTING_DOWN, "rc %d", rc);
        refused = rc == SQ_SHUTTING_DOWN;
        if (!refused)
            usleep(1000);
    }
    cr_assert(refused);
    atomic_store(&gate_open, 1);
    pthread_join(t, NULL);
    cr_assert_eq(jobs[0].rc, 0, "the running job finishes");
    for (int i = 1; i < N; i++) {
        cr_assert_eq(atomic_load(&jobs[i].calls), 1);
        cr_assert_eq(jobs[i].rc, SQ_SHUTTING_DOWN, "job %d rc %d", i, jobs[i].rc);
    }
    cr_assert_eq(atomic_load(&probe.calls), 0);
    gw_prep_pool_free(pool);
    blob_free(&b);
}

Test(prep_pool, a_job_that_cannot_start_in_time_is_refused_at_submit)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    enum { N = 20 };
    blob_t b = scene_jpeg(640, 480);
    static uint8_t dst[N + 4][32 * 32 * 3];
    tjob_t seed, gated, jobs[N], tight, loose;
    gw_prep_pool_t *pool = pool_new(1, 64);
    /* With no decode measured yet, nothing is predicted. */
    tjob_init(&seed, b, 32, 32, dst[0], on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &seed.job), 0);
    wait_for(&seed.calls, 1);
    cr_assert_eq(seed.rc, 0, "%s", seed.job.err);
    /* The only thread is held; N jobs wait behind it. */
    tjob_init(&gated, b, 32, 32, dst[1], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &gated.job), 0);
    wait_for(&gate_entered, 1);
    for (int i = 0; i < N; i++) {
        tjob_init(&jobs[i], b, 32, 32, dst[2], on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    /* N decodes of a 640x480 JPEG take far more than 2 us: refused now,
     * not answered at its deadline; one with a minute to spare waits. */
    tjob_init(&tight, b, 32, 32, dst[3], on_done);
    tight.job.deadline_ns = sq_now_ns() + 2000;
    cr_assert_eq(gw_prep_pool_submit(pool, &tight.job), SQ_DEADLINE);
    cr_assert_eq(sq_err_http_status(SQ_DEADLINE), 503);
    tjob_init(&loose, b, 32, 32, dst[4], on_done);
    loose.job.deadline_ns = sq_now_ns() + 60ll * 1000000000;
    cr_assert_eq(gw_prep_pool_submit(pool, &loose.job), 0);
    cr_assert_eq(gw_prep_pool_queued(pool), N + 1);
    atomic_store(&gate_open, 1);
    gw_prep_pool_free(pool);
    cr_assert_eq(atomic_load(&tight.calls), 0, "a refused job is never called back");
    cr_assert_eq(atomic_load(&loose.calls), 1);
    cr_assert_eq(loose.rc, 0, "%s", loose.job.err);
    blob_free(&b);
}

Test(prep_pool, a_job_too_close_to_its_deadline_for_a_decode_is_not_decoded)
{
    atomic_store(&gate_entered, 0);
    atomic_store(&gate_open, 0);
    blob_t b = scene_jpeg(2000, 1500);
    static uint8_t dst[3][224 * 224 * 3];
    tjob_t seed, gated, close;
    gw_prep_pool_t *pool = pool_new(1, 8);
    tjob_init(&seed, b, 224, 224, dst[0], on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &seed.job), 0);
    wait_for(&seed.calls, 1);
    int64_t decode_ns = seed.job.finished_ns - seed.job.started_ns;
    cr_assert_gt(decode_ns, 2000000, "a 2000x1500 decode takes over 2 ms (%lld ns)",
                 (long long)decode_ns);
    tjob_init(&gated, b, 224, 224, dst[1], on_done_gated);
    cr_assert_eq(gw_prep_pool_submit(pool, &gated.job), 0);
    wait_for(&gate_entered, 1);
    /* Nothing waits ahead of it, so it is accepted; when it reaches the
     * thread, half a decode is left before its deadline. */
    tjob_init(&close, b, 224, 224, dst[2], on_done);
    close.job.deadline_ns = sq_now_ns() + decode_ns / 2;
    cr_assert_eq(gw_prep_pool_submit(pool, &close.job), 0);
    atomic_store(&gate_open, 1);
    gw_prep_pool_free(pool);
    cr_assert_eq(atomic_load(&close.calls), 1);
    cr_assert_eq(close.rc, SQ_DEADLINE);
    cr_assert(strstr(close.job.err, "too close to its deadline") != NULL, "%s", close.job.err);
    cr_assert_lt(close.job.finished_ns - close.job.started_ns, decode_ns / 2, "not decoded");
    blob_free(&b);
}

Test(prep_pool, a_job_past_its_deadline_is_not_decoded)
{
    blob_t b = scene_jpeg(64, 64);
    uint8_t dst[16 * 16 * 3];
    memset(dst, 0xAB, sizeof(dst));
    tjob_t late, fine;
    tjob_init(&late, b, 16, 16, dst, on_done);
    late.job.deadline_ns = sq_now_ns() - 1;
    uint8_t dst2[16 * 16 * 3];
    tjob_init(&fine, b, 16, 16, dst2, on_done);
    fine.job.deadline_ns = sq_now_ns() + 60ll * 1000000000;
    gw_prep_pool_t *pool = pool_new(2, 4);
    cr_assert_eq(gw_prep_pool_submit(pool, &late.job), 0);
    cr_assert_eq(gw_prep_pool_submit(pool, &fine.job), 0);
    gw_prep_pool_free(pool);
    cr_assert_eq(late.rc, SQ_DEADLINE);
    cr_assert(strstr(late.job.err, "deadline") != NULL, "%s", late.job.err);
    for (size_t i = 0; i < sizeof(dst); i++)
        cr_assert_eq(dst[i], 0xAB, "dst untouched");
    cr_assert_eq(fine.rc, 0, "%s", fine.job.err);
    blob_free(&b);
}

Test(prep_pool, bad_configs_and_jobs_are_inval)
{
    gw_prep_pool_t *pool = (gw_prep_pool_t *)1;
    gw_prep_pool_config_t cfg = {
        .threads = 0, .queue_capacity = 4, .limits = gw_prep_limits_default()};
    cr_assert_eq(gw_prep_pool_new(&cfg, &pool), SQ_INVAL);
    cr_assert_null(pool);
    cfg.threads = 1;
    cfg.queue_capacity = 0;
    cr_assert_eq(gw_prep_pool_new(&cfg, &pool), SQ_INVAL);
    pool = pool_new(1, 1);
    uint8_t dst[3];
    tjob_t t;
    blob_t b = {.data = (uint8_t *)"x", .len = 1};
    tjob_init(&t, b, 1, 1, dst, NULL);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), SQ_INVAL, "no callback");
    tjob_init(&t, b, 0, 1, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), SQ_INVAL, "no size");
    tjob_init(&t, b, 1, 1, NULL, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), SQ_INVAL, "no dst");
    gw_prep_pool_free(pool);
    gw_prep_pool_free(NULL);
}

Test(prep_pool, a_kept_frame_is_decoded_at_the_smallest_scale_that_covers_keep_cover)
{
    /* Issue 23: a 12 MP frame kept for a pipeline's crops was decoded at
     * full size. 2048 x 1536 kept to cover 224 px: 1/4 (512 x 384; 1/8
     * gives 192 rows); without keep_cover, at full size. Its pixels are
     * what the same DCT scale gives without keeping it. */
    blob_t img = scene_jpeg(2048, 1536);
    gw_prep_pool_t *pool = pool_new(1, 4);
    uint8_t *dst = malloc(128 * 128 * 3 * 2);
    tjob_t jobs[2];
    for (int i = 0; i < 2; i++) {
        tjob_init(&jobs[i], img, 128, 128, dst + i * 128 * 128 * 3, on_done);
        jobs[i].job.keep_original = 1;
        jobs[i].job.keep_cover = i == 0 ? 224 : 0;
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    gw_prep_pool_shutdown(pool, GW_PREP_DRAIN);
    cr_assert_eq(jobs[0].rc, 0, "%s", jobs[0].job.err);
    cr_assert_eq(jobs[1].rc, 0, "%s", jobs[1].job.err);
    const gw_image_info_t *a = &jobs[0].job.info, *b = &jobs[1].job.info;
    cr_assert_eq(a->width, 2048);
    cr_assert_eq(a->decoded_width, 512);
    cr_assert_eq(a->decoded_height, 384);
    cr_assert_eq(b->decoded_width, 2048);
    cr_assert_eq(b->decoded_height, 1536);
    cr_assert_not_null(jobs[0].job.original);
    /* The target is the kept image resized. */
    gw_prep_ctx_t *ctx = ctx_with(1);
    uint8_t *want = malloc(128 * 128 * 3);
    cr_assert_eq(gw_resize_rgb(ctx, jobs[0].job.original, 512, 384, 512 * 3, want, 128, 128,
                               GW_RESIZE_BILINEAR),
                 0);
    cr_assert_eq(memcmp(want, dst, 128 * 128 * 3), 0);
    /* The pool plans a large file's decode from its size: one twice as
     * large is expected to take about twice as long; a small one, the mean
     * (a small file's time is mostly a decode's fixed cost). */
    cr_assert_geq(img.len, GW_PREP_BYTE_RATE_MIN, "%zu bytes", img.len);
    double mean = gw_prep_pool_decode_us(pool);
    double one = gw_prep_pool_decode_us_for(pool, 4 * img.len);
    double two = gw_prep_pool_decode_us_for(pool, 8 * img.len);
    cr_assert_gt(one, mean);
    cr_assert_float_eq(two, 2 * one, 1e-6 * one);
    cr_assert_float_eq(gw_prep_pool_decode_us_for(pool, 1000), mean, 1e-9);
    gw_prep_ctx_free(ctx);
    free(want);
    free(jobs[0].job.original);
    free(jobs[1].job.original);
    gw_prep_pool_free(pool);
    free(dst);
    blob_free(&img);
}

/* Before the pool has decoded a large file, what a large frame may borrow
 * for its decode (a pipeline's root_start) is planned by small files' time
 * per byte, which errs long, not at the mean decode (the first 12 MP photo
 * of a new model DB missed its detector's share so); once one is decoded,
 * by large files' own. */
Test(prep_pool, a_large_frame_borrows_by_small_files_time_per_byte_until_one_is_decoded)
{
    blob_t small = scene_jpeg(320, 240), large = scene_jpeg(2048, 1536);
    cr_assert_lt(small.len, GW_PREP_BYTE_RATE_MIN);
    cr_assert_geq(large.len, GW_PREP_BYTE_RATE_MIN);
    gw_prep_pool_t *pool = pool_new(1, 8);
    uint8_t *dst = malloc(64 * 64 * 3);
    tjob_t jobs[4];
    for (int i = 0; i < 4; i++) {
        tjob_init(&jobs[i], small, 64, 64, dst, on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &jobs[i].job), 0);
    }
    for (int i = 0; i < 4; i++)
        wait_for(&jobs[i].calls, 1);
    double mean = gw_prep_pool_decode_us(pool);
    size_t big = 16 * large.len;
    cr_assert_float_eq(gw_prep_pool_decode_us_for(pool, big), mean, 1e-9,
                       "no large file's time per byte yet: the mean");
    double borrow = gw_prep_pool_decode_borrow_us_for(pool, big);
    cr_assert_gt(borrow, 10 * mean, "borrow %.1f us, mean %.1f us", borrow, mean);
    cr_assert_float_eq(gw_prep_pool_decode_borrow_us_for(pool, small.len), mean, 1e-9,
                       "a small frame borrows nothing beyond the mean");
    tjob_t one;
    tjob_init(&one, large, 64, 64, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &one.job), 0);
    wait_for(&one.calls, 1);
    cr_assert_eq(one.rc, 0, "%s", one.job.err);
    cr_assert_float_eq(gw_prep_pool_decode_borrow_us_for(pool, big),
                       gw_prep_pool_decode_us_for(pool, big), 1e-9,
                       "once a large file is decoded, its time per byte");
    gw_prep_pool_free(pool);
    free(dst);
    blob_free(&small);
    blob_free(&large);
}

/* A decode is in the estimates before its callback runs: the callback
 * wakes whoever plans the next frame (and the tests above read the
 * estimates once a job is answered). Counted after it, the caller raced
 * the pool thread and planned without the decode it had just waited for. */
static gw_prep_pool_t *seen_pool;
static int seen_samples; /* decodes counted when the callback ran */

static void on_done_reads_costs(gw_prep_job_t *job, int rc)
{
    gw_prep_costs_t c;
    gw_prep_pool_costs(seen_pool, &c);
    seen_samples = c.decode.samples;
    on_done(job, rc);
}

Test(prep_pool, a_decode_is_counted_before_its_callback_runs)
{
    blob_t small = scene_jpeg(320, 240);
    seen_pool = pool_new(1, 4);
    static uint8_t dst[64 * 64 * 3];
    for (int i = 1; i <= 3; i++) {
        tjob_t t;
        tjob_init(&t, small, 64, 64, dst, on_done_reads_costs);
        cr_assert_eq(gw_prep_pool_submit(seen_pool, &t.job), 0);
        wait_for(&t.calls, 1);
        cr_assert_eq(t.rc, 0, "%s", t.job.err);
        cr_assert_eq(seen_samples, i, "decode %d was counted when its callback ran", i);
    }
    gw_prep_pool_free(seen_pool);
    blob_free(&small);
}

/* A decode estimate: the first sample is the mean; then the mean and the
 * mean absolute deviation move by GW_PREP_EST_WEIGHT, the deviation taken
 * from the mean before the sample; the p99 is the mean plus
 * GW_PREP_EST_P99_DEVS deviations. */
Test(prep_pool, a_decode_estimate_follows_its_mean_and_its_spread)
{
    gw_prep_est_t e = {0};
    cr_assert_float_eq(gw_prep_est_p99(&e), 0, 1e-12);
    gw_prep_est_add(&e, 1000);
    cr_assert_eq(e.samples, 1);
    cr_assert_float_eq(e.mean_ns, 1000, 1e-9);
    cr_assert_float_eq(e.dev_ns, 0, 1e-9);
    cr_assert_float_eq(gw_prep_est_p99(&e), 1000, 1e-9);
    gw_prep_est_add(&e, 3000); /* 2000 above the mean */
    cr_assert_eq(e.samples, 2);
    cr_assert_float_eq(e.mean_ns, 0.9 * 1000 + 0.1 * 3000, 1e-9);
    cr_assert_float_eq(e.dev_ns, 0.1 * 2000, 1e-9);
    cr_assert_float_eq(gw_prep_est_p99(&e), 1200 + GW_PREP_EST_P99_DEVS * 200, 1e-9);
    gw_prep_est_add(&e, 200); /* 1000 below the mean */
    cr_assert_float_eq(e.mean_ns, 0.9 * 1200 + 0.1 * 200, 1e-9);
    cr_assert_float_eq(e.dev_ns, 0.9 * 200 + 0.1 * 1000, 1e-9);
    /* Steady samples: the deviation decays, the p99 comes to the mean. */
    for (int i = 0; i < 300; i++)
        gw_prep_est_add(&e, 1000);
    cr_assert_float_eq(gw_prep_est_p99(&e), 1000, 1e-6);
    /* Samples that alternate 1000 and 3000 (a decode that loses its core
     * every other time): the mean near 2000, the deviation near 1000, the
     * p99 above the slow ones, where the mean is below them. */
    for (int i = 0; i < 400; i++)
        gw_prep_est_add(&e, i % 2 ? 3000 : 1000);
    cr_assert_float_eq(e.mean_ns, 2000, 150);
    cr_assert_float_eq(e.dev_ns, 1000, 150);
    cr_assert_gt(gw_prep_est_p99(&e), 3000);
}

/* The split reserves a small frame's p99: the large files' decodes (planned
 * from their size) count in the per-byte estimate, not in it; before any
 * small frame, the p99 of every decode. The mean submit and the "too close"
 * check use stays every decode's mean. */
Test(prep_pool, the_split_reserves_the_p99_of_small_frames, .timeout = 60)
{
    blob_t big = scene_jpeg(2048, 1536);
    blob_t small = scene_jpeg(320, 240);
    cr_assert_geq(big.len, GW_PREP_BYTE_RATE_MIN);
    cr_assert_lt(small.len, GW_PREP_BYTE_RATE_MIN);
    gw_prep_pool_t *pool = pool_new(1, 4);
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), 0, 1e-12, "nothing measured yet");
    static uint8_t dst[224 * 224 * 3];
    tjob_t t;
    tjob_init(&t, big, 224, 224, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), 0);
    wait_for(&t.calls, 1);
    double big_us = (double)(t.job.finished_ns - t.job.started_ns) / 1e3;
    gw_prep_costs_t c;
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.decode.samples, 1);
    cr_assert_eq(c.per_byte.samples, 1);
    cr_assert_eq(c.frame.samples, 0);
    cr_assert_float_eq(c.per_byte.mean_ns * (double)big.len, c.decode.mean_ns, 1e-6 * big_us);
    /* Only a large file so far: its decode. */
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), c.decode.mean_ns / 1e3, 1e-9);
    for (int i = 0; i < 8; i++) {
        tjob_init(&t, small, 224, 224, dst, on_done);
        cr_assert_eq(gw_prep_pool_submit(pool, &t.job), 0);
        wait_for(&t.calls, 1);
    }
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.frame.samples, 8);
    cr_assert_eq(c.decode.samples, 9);
    cr_assert_eq(c.per_byte.samples, 1);
    double p99 = gw_prep_pool_decode_p99_us(pool);
    cr_assert_float_eq(p99, gw_prep_est_p99(&c.frame) / 1e3, 1e-9);
    cr_assert_geq(p99, c.frame.mean_ns / 1e3);
    cr_assert_lt(p99, big_us, "a small frame's p99 (%.0f us) is not the large decode (%.0f us)",
                 p99, big_us);
    cr_assert_float_eq(gw_prep_pool_decode_us(pool), c.decode.mean_ns / 1e3, 1e-9);
    gw_prep_pool_free(pool);
    blob_free(&big);
    blob_free(&small);
}

/* Estimates stored by an earlier run seed a pool that has none: its first
 * frame is planned from them (the split's p99, the per-size estimate of
 * the "too close" check); a decode then moves them as one more sample.
 * An estimate measured here is never replaced, and junk is ignored. */
Test(prep_pool, stored_estimates_seed_a_new_pool_and_only_a_new_one, .timeout = 60)
{
    gw_prep_pool_t *pool = pool_new(1, 4);
    gw_prep_costs_t stored = {
        .decode = {.mean_ns = 6e6, .dev_ns = 1e6, .samples = 1000},
        .frame = {.mean_ns = 5e6, .dev_ns = 2e6, .samples = 900},
        .per_byte = {.mean_ns = 40, .dev_ns = 4, .samples = 100},
    };
    gw_prep_pool_seed(pool, &stored);
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), (5e6 + GW_PREP_EST_P99_DEVS * 2e6) / 1e3,
                       1e-9);
    cr_assert_float_eq(gw_prep_pool_decode_us(pool), 6000, 1e-9);
    cr_assert_float_eq(gw_prep_pool_decode_us_for(pool, 1000000), 40000, 1e-9);
    cr_assert_float_eq(gw_prep_pool_decode_us_for(pool, 1000), 6000, 1e-9);
    blob_t small = scene_jpeg(320, 240);
    static uint8_t dst[224 * 224 * 3];
    tjob_t t;
    tjob_init(&t, small, 224, 224, dst, on_done);
    cr_assert_eq(gw_prep_pool_submit(pool, &t.job), 0);
    wait_for(&t.calls, 1);
    double took_ns = (double)(t.job.finished_ns - t.job.started_ns);
    gw_prep_costs_t c;
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.frame.samples, 901);
    cr_assert_float_eq(c.frame.mean_ns, 0.9 * 5e6 + 0.1 * took_ns, 0.02 * 5e6);
    /* A second seed changes nothing measured or seeded. */
    gw_prep_costs_t other = {.frame = {.mean_ns = 1, .dev_ns = 0, .samples = 5}};
    gw_prep_pool_seed(pool, &other);
    gw_prep_costs_t after;
    gw_prep_pool_costs(pool, &after);
    cr_assert_eq(memcmp(&after, &c, sizeof(c)), 0);
    gw_prep_pool_free(pool);
    /* Junk (not finite, negative, no samples) seeds nothing. */
    pool = pool_new(1, 4);
    gw_prep_costs_t junk = {
        .decode = {.mean_ns = NAN, .dev_ns = 1, .samples = 3},
        .frame = {.mean_ns = 1e6, .dev_ns = -1, .samples = 3},
        .per_byte = {.mean_ns = 40, .dev_ns = 4, .samples = 0},
    };
    gw_prep_pool_seed(pool, &junk);
    gw_prep_pool_costs(pool, &c);
    cr_assert_eq(c.decode.samples + c.frame.samples + c.per_byte.samples, 0);
    cr_assert_float_eq(gw_prep_pool_decode_p99_us(pool), 0, 1e-12);
    gw_prep_pool_free(pool);
    blob_free(&small);
}
