/* A small epoll event loop for the non-HTTP threads (the dispatcher thread
 * in squishd, the worker's I/O loop): fd watchers, one-shot timers on
 * CLOCK_MONOTONIC, and sq_loop_post() to run a function on the loop's
 * thread from any other thread (an eventfd wakes the loop).
 *
 * Callbacks run on the loop thread. A watcher or timer may be removed from
 * inside any callback, including its own. */
#ifndef SQ_LOOP_H
#define SQ_LOOP_H

#include <stdint.h>

typedef struct sq_loop sq_loop_t;

/* Events: SQ_EV_READ, SQ_EV_WRITE; errors and hang-ups are reported as
 * SQ_EV_READ so that the reader sees EOF or the error. */
enum { SQ_EV_READ = 1, SQ_EV_WRITE = 2 };

typedef void (*sq_io_fn)(sq_loop_t *loop, int fd, int events, void *data);
typedef void (*sq_timer_fn)(sq_loop_t *loop, uint64_t timer_id, void *data);
typedef void (*sq_post_fn)(sq_loop_t *loop, void *arg);

sq_loop_t *sq_loop_new(void);
/* Frees the loop; pending posts are dropped (their args leak unless the
 * owner drained them). Accepts NULL. */
void sq_loop_free(sq_loop_t *loop);

/* Watches fd for events. One watcher per fd. Returns 0 or negative errno. */
int sq_loop_watch(sq_loop_t *loop, int fd, int events, sq_io_fn fn, void *data);
int sq_loop_modify(sq_loop_t *loop, int fd, int events);
void sq_loop_unwatch(sq_loop_t *loop, int fd);

/* Arms a one-shot timer at an absolute CLOCK_MONOTONIC time in ns. Returns
 * an id (never 0). */
uint64_t sq_loop_timer_at(sq_loop_t *loop, int64_t when_ns, sq_timer_fn fn, void *data);
/* Cancels a pending timer; unknown or fired ids are ignored. */
void sq_loop_timer_cancel(sq_loop_t *loop, uint64_t timer_id);

/* Thread-safe: runs fn(loop, arg) on the loop thread soon. */
void sq_loop_post(sq_loop_t *loop, sq_post_fn fn, void *arg);

/* For a thread that posts many times in one turn of its own event loop
 * (an HTTP thread: a request per ready connection): after
 * sq_loop_defer_wakes, its posts queue their function but write no
 * wake-up, and sq_loop_flush_wakes wakes each loop posted to once. A loop
 * fed that way wakes once per turn of the poster, not once per post. The
 * poster must flush before it blocks (its posts, and other threads'
 * behind them, wait for the flush). Thread-local; not nested. */
void sq_loop_defer_wakes(void);
void sq_loop_flush_wakes(void);

/* Runs the functions posted so far, on the calling thread (the owner's,
 * after the loop stopped: so that posted work is not leaked at exit). */
void sq_loop_run_posts(sq_loop_t *loop);

/* Runs until sq_loop_stop() (callable from a callback or another thread). */
void sq_loop_run(sq_loop_t *loop);
void sq_loop_stop(sq_loop_t *loop);

#endif
