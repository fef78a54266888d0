/* wk_serve (wk_serve.h): starts the loader and execution threads, runs the
 * I/O loop until SHUTDOWN, EOF or (a remote worker) the link gives up, and
 * stops everything in order. The execution thread's loop is here: one job
 * at a time, in arrival order, each after the replies of those before it
 * are on the wire. The files of the serving side, each calling only those
 * before it: serve_state.c, serve_rows.c, serve_load.c, serve_batch.c,
 * serve_profile.c, serve_data.c, serve_link.c, serve_io.c, serve.c. */
#include "serve_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static void *exec_thread(void *arg)
{
    server_t *s = arg;
    for (;;) {
        job_t *j = wk__jobq_pop(&s->execq);
        job_kind_t kind = j->kind;
        s->exec_gen = j->gen;
        if (kind != JOB_STOP && kind != JOB_UNLOAD && kind != JOB_SWEEP)
            wk__replies_flushed(s);
        switch (kind) {
        case JOB_LOAD:
            if (wk__do_load(s, j))
                continue; /* the loader's now */
            break;
        case JOB_INSTALL:
            wk__do_install(s, j);
            break;
        case JOB_UNLOAD:
            wk__do_unload(s, j->id);
            break;
        case JOB_BATCH:
            wk__do_batch(s, j);
            break;
        case JOB_PROFILE:
            wk__do_profile(s, j);
            break;
        case JOB_SWEEP:
            wk__sweep_models(s, j->gen);
            break;
        case JOB_STOP:
            break;
        }
        wk__job_free(j);
        if (kind == JOB_STOP)
            return NULL;
    }
}

int wk_serve(const wk_serve_opts_t *opts)
{
    server_t s = {.o = *opts, .conn = opts->conn, .exit_status = -1, .on_socket = wk__on_socket};
    if (s.o.kept_models_ms <= 0)
        s.o.kept_models_ms = WK_KEPT_MODELS_MS;
    s.loop = sq_loop_new();
    if (s.loop == NULL)
        return 1;
    s.rows = wk__rows_new(WK_ROWS_MAX_BYTES);
    wk__jobq_init(&s.execq);
    pthread_mutex_init(&s.reply_lock, NULL);
    pthread_cond_init(&s.reply_cond, NULL);
    wk__jobq_init(&s.loadq);
    int err = pthread_create(&s.loader, NULL, wk__loader_thread, &s);
    if (err != 0) {
        SQ_ERROR("cannot start the loader thread error=\"%s\"", strerror(err));
        wk__jobq_destroy(&s.loadq);
        pthread_cond_destroy(&s.reply_cond);
        pthread_mutex_destroy(&s.reply_lock);
        wk__jobq_destroy(&s.execq);
        wk__rows_free(s.rows);
        sq_loop_free(s.loop);
        return 1;
    }
    err = pthread_create(&s.exec, NULL, exec_thread, &s);
    if (err != 0) {
        wk__loader_stop(&s);
        wk__jobq_destroy(&s.loadq);
        SQ_ERROR("cannot start the execution thread error=\"%s\"", strerror(err));
        pthread_cond_destroy(&s.reply_cond);
        pthread_mutex_destroy(&s.reply_lock);
        wk__jobq_destroy(&s.execq);
        wk__rows_free(s.rows);
        sq_loop_free(s.loop);
        return 1;
    }
    sq_buf_init(&s.rin.bytes);
    if (wk__data_start(&s) != 0) {
        wk__finish(&s, 1);
    } else if (opts->remote) {
        int rc = wk__link_join(&s);
        if (rc != 0)
            wk__finish(&s, rc > 0 ? 0 : 1);
        else
            s.silence_timer = sq_loop_timer_at(s.loop, sq_now_ns() + (int64_t)250 * 1000000,
                                               wk__on_silence_tick, &s);
        if (opts->stop_fd >= 0 && s.exit_status < 0 &&
            sq_loop_watch(s.loop, opts->stop_fd, SQ_EV_READ, wk__on_stop, &s) != 0)
            wk__finish(&s, 1);
    } else if ((err = sq_loop_watch(s.loop, opts->fd, SQ_EV_READ, wk__on_socket, &s)) != 0) {
        SQ_ERROR("cannot watch the squishd socket error=\"%s\"", strerror(-err));
        wk__finish(&s, 1);
    } else {
        wk__data_announce(&s);
    }
    /* Frames that arrived with WELCOME are handled before waiting. */
    sq_frame_t f;
    while (s.exit_status < 0 && !s.lost && sq_conn_next(s.conn, &f) == 1)
        if (wk__handle_frame(&s, &f) != 0)
            wk__finish(&s, 1);
    if (s.exit_status < 0)
        sq_loop_run(s.loop);

    /* Stop the execution thread after the work it has (a batch in flight
     * finishes; its answer is dropped with the connection). */
    pthread_mutex_lock(&s.reply_lock);
    s.io_done = 1; /* the loop runs no more posts until after the join */
    pthread_cond_broadcast(&s.reply_cond);
    pthread_mutex_unlock(&s.reply_lock);
    wk__rows_stop(s.rows); /* a batch waiting for rows runs without them */
    job_t *stop = sq_xcalloc(1, sizeof(*stop));
    stop->kind = JOB_STOP;
    wk__drop_queued(&s);
    wk__enqueue(&s, stop);
    pthread_join(s.exec, NULL);
    wk__loader_stop(&s);
    wk__drop_queued(&s); /* models the loader finished after the stop */
    while (s.building != NULL) {
        building_t *b = s.building;
        s.building = b->next;
        free(b);
    }
    while (s.models != NULL)
        wk__model_drop(&s, s.models->key);
    wk_arena_free(s.arena);
    wk__measure_free(s.meas);
    for (cached_t *c = s.cache, *n; c != NULL; c = n) {
        n = c->next;
        wk__file_free(c->bytes, c->len);
        free(c);
    }
    wk__reset_connection_state(&s);
    free(s.staging);
    sq_loop_run_posts(s.loop); /* replies still posted are dropped (exit_status set) */
    wk__data_stop(&s);
    wk__rows_free(s.rows);
    sq_loop_free(s.loop);
    wk__jobq_destroy(&s.execq);
    pthread_mutex_destroy(&s.reply_lock);
    pthread_cond_destroy(&s.reply_cond);
    wk__jobq_destroy(&s.loadq);
    return s.exit_status < 0 ? 1 : s.exit_status;
}
