#include <criterion/criterion.h>
#include <sq.h>

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    uint64_t order[8];
    int n;
    uint64_t cancel_me;
} timers_t;

static void record(sq_loop_t *loop, uint64_t id, void *data)
{
    timers_t *t = data;
    t->order[t->n++] = id;
    if (t->n == 3)
        sq_loop_stop(loop);
}

Test(loop, timers_fire_in_time_order_and_cancelled_ones_do_not)
{
    sq_loop_t *l = sq_loop_new();
    timers_t t = {0};
    int64_t now = sq_now_ns();
    uint64_t a = sq_loop_timer_at(l, now + 30000000, record, &t);
    uint64_t b = sq_loop_timer_at(l, now + 10000000, record, &t);
    uint64_t c = sq_loop_timer_at(l, now + 20000000, record, &t);
    uint64_t d = sq_loop_timer_at(l, now + 15000000, record, &t);
    sq_loop_timer_cancel(l, d);
    sq_loop_run(l);
    cr_assert_eq(t.n, 3);
    cr_assert_eq(t.order[0], b);
    cr_assert_eq(t.order[1], c);
    cr_assert_eq(t.order[2], a);
    cr_assert_geq(sq_now_ns() - now, 30000000);
    sq_loop_free(l);
}

typedef struct {
    uint64_t first, second, fired_second, fired_guard;
} reuse_t;

static void second_fires(sq_loop_t *loop, uint64_t id, void *data)
{
    ((reuse_t *)data)->fired_second = id;
    sq_loop_stop(loop);
}

static void guard_fires(sq_loop_t *loop, uint64_t id, void *data)
{
    ((reuse_t *)data)->fired_guard = id;
    sq_loop_stop(loop);
}

/* The first timer has fired: its slot is free, the timer armed now takes
 * it, and a caller that kept the first id cancels with it. */
static void first_fires(sq_loop_t *loop, uint64_t id, void *data)
{
    reuse_t *r = data;
    r->second = sq_loop_timer_at(loop, sq_now_ns() + 1000000, second_fires, r);
    sq_loop_timer_cancel(loop, r->first);
    sq_loop_timer_cancel(loop, 0);
}

Test(loop, a_stale_timer_id_cancels_nothing_once_its_slot_is_reused)
{
    sq_loop_t *l = sq_loop_new();
    reuse_t r = {0};
    r.first = sq_loop_timer_at(l, sq_now_ns(), first_fires, &r);
    uint64_t guard = sq_loop_timer_at(l, sq_now_ns() + 2000000000, guard_fires, &r);
    sq_loop_run(l);
    cr_assert_neq(r.second, r.first);
    cr_assert_eq(r.fired_second, r.second, "the stale id cancelled the timer that reused its slot");
    cr_assert_eq(r.fired_guard, 0);
    sq_loop_timer_cancel(l, guard);
    sq_loop_free(l);
}

static void on_post(sq_loop_t *loop, void *arg)
{
    (*(int *)arg)++;
    if (*(int *)arg == 100)
        sq_loop_stop(loop);
}

static void *poster(void *arg)
{
    void **a = arg;
    for (int i = 0; i < 100; i++)
        sq_loop_post(a[0], on_post, a[1]);
    return NULL;
}

Test(loop, posts_from_another_thread_all_run_on_the_loop)
{
    sq_loop_t *l = sq_loop_new();
    int count = 0;
    void *args[2] = {l, &count};
    pthread_t th;
    pthread_create(&th, NULL, poster, args);
    sq_loop_run(l);
    pthread_join(th, NULL);
    cr_assert_eq(count, 100);
    sq_loop_free(l);
}

/* Several threads post at once while the loop runs the posts: every post
 * runs once, each thread's in its order, though most of them find the
 * queue not empty and write no wake-up of their own. */
#define BURST_THREADS 4
#define BURST_POSTS 20000

typedef struct {
    sq_loop_t *loop;
    int next[BURST_THREADS]; /* the next sequence number expected per thread */
    int ran;
    int out_of_order;
} burst_t;

typedef struct {
    burst_t *burst;
    int thread;
    int seq;
} burst_post_t;

static void on_burst_post(sq_loop_t *loop, void *arg)
{
    burst_post_t *p = arg;
    burst_t *b = p->burst;
    if (b->next[p->thread] != p->seq)
        b->out_of_order++;
    b->next[p->thread] = p->seq + 1;
    if (++b->ran == BURST_THREADS * BURST_POSTS)
        sq_loop_stop(loop);
}

typedef struct {
    burst_t *burst;
    int thread;
    burst_post_t *posts;
} burst_arg_t;

static void *burst_poster(void *arg)
{
    burst_arg_t *a = arg;
    for (int i = 0; i < BURST_POSTS; i++) {
        a->posts[i] = (burst_post_t){a->burst, a->thread, i};
        sq_loop_post(a->burst->loop, on_burst_post, &a->posts[i]);
    }
    return NULL;
}

Test(loop, concurrent_posts_each_run_once_in_order_per_thread)
{
    burst_t b = {.loop = sq_loop_new()};
    pthread_t th[BURST_THREADS];
    burst_arg_t args[BURST_THREADS];
    for (int t = 0; t < BURST_THREADS; t++) {
        args[t] = (burst_arg_t){&b, t, calloc(BURST_POSTS, sizeof(burst_post_t))};
        pthread_create(&th[t], NULL, burst_poster, &args[t]);
    }
    sq_loop_run(b.loop);
    for (int t = 0; t < BURST_THREADS; t++) {
        pthread_join(th[t], NULL);
        free(args[t].posts);
    }
    cr_assert_eq(b.ran, BURST_THREADS * BURST_POSTS);
    cr_assert_eq(b.out_of_order, 0);
    for (int t = 0; t < BURST_THREADS; t++)
        cr_assert_eq(b.next[t], BURST_POSTS);
    sq_loop_free(b.loop);
}

/* A function posted by a posted function runs too (it finds the queue
 * just taken, so it writes the wake-up), as do posts queued before the
 * loop starts. */
static void on_second(sq_loop_t *loop, void *arg)
{
    (*(int *)arg) += 10;
    sq_loop_stop(loop);
}

static void on_first(sq_loop_t *loop, void *arg)
{
    (*(int *)arg)++;
    sq_loop_post(loop, on_second, arg);
}

Test(loop, a_post_from_a_posted_function_runs)
{
    sq_loop_t *l = sq_loop_new();
    int count = 0;
    sq_loop_post(l, on_first, &count);
    sq_loop_run(l);
    cr_assert_eq(count, 11);
    sq_loop_free(l);
}

/* A thread that defers its wake-ups: its post runs only after it flushes
 * them, though the loop waits meanwhile (a guard timer fails the test if
 * the flush never wakes it). */
typedef struct {
    sq_loop_t *loop;
    int64_t flushed_ns, ran_ns;
} deferred_t;

static void on_deferred_post(sq_loop_t *loop, void *arg)
{
    ((deferred_t *)arg)->ran_ns = sq_now_ns();
    sq_loop_stop(loop);
}

static void *deferring_poster(void *arg)
{
    deferred_t *d = arg;
    sq_loop_defer_wakes();
    sq_loop_post(d->loop, on_deferred_post, d);
    usleep(50 * 1000);
    d->flushed_ns = sq_now_ns();
    sq_loop_flush_wakes();
    return NULL;
}

static void on_guard(sq_loop_t *loop, uint64_t id, void *data)
{
    (void)id;
    (void)data;
    sq_loop_stop(loop);
}

Test(loop, deferred_wake_ups_wait_for_the_flush)
{
    deferred_t d = {.loop = sq_loop_new()};
    sq_loop_timer_at(d.loop, sq_now_ns() + 2000000000ll, on_guard, NULL);
    pthread_t th;
    pthread_create(&th, NULL, deferring_poster, &d);
    sq_loop_run(d.loop);
    pthread_join(th, NULL);
    cr_assert_gt(d.ran_ns, 0, "the flush did not wake the loop");
    cr_assert_geq(d.ran_ns, d.flushed_ns, "the post ran before its wake-up was flushed");
    sq_loop_free(d.loop);
}

static void on_readable(sq_loop_t *loop, int fd, int events, void *data)
{
    char buf[8];
    cr_assert(events & SQ_EV_READ);
    *(ssize_t *)data = read(fd, buf, sizeof(buf));
    sq_loop_unwatch(loop, fd);
    sq_loop_stop(loop);
}

Test(loop, fd_watchers_see_readable_data)
{
    sq_loop_t *l = sq_loop_new();
    int p[2];
    cr_assert_eq(pipe(p), 0);
    ssize_t got = -1;
    cr_assert_eq(sq_loop_watch(l, p[0], SQ_EV_READ, on_readable, &got), 0);
    cr_assert_eq(write(p[1], "abc", 3), 3);
    sq_loop_run(l);
    cr_assert_eq(got, 3);
    close(p[0]);
    close(p[1]);
    sq_loop_free(l);
}
