/* The worker's serving state, shared by its threads (serve_int.h): the job
 * queues, the replies the execution thread hands the I/O thread, the models
 * held and the model files received. The lowest layer of the serving side:
 * it calls nothing above it. */
#include "serve_int.h"

#include <mdb.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void wk__jobq_init(jobq_t *q)
{
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->head = q->tail = NULL;
}

void wk__jobq_destroy(jobq_t *q)
{
    pthread_cond_destroy(&q->cond);
    pthread_mutex_destroy(&q->lock);
}

void wk__jobq_push(jobq_t *q, job_t *j)
{
    pthread_mutex_lock(&q->lock);
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cond);
    pthread_mutex_unlock(&q->lock);
}

job_t *wk__jobq_pop(jobq_t *q)
{
    pthread_mutex_lock(&q->lock);
    while (q->head == NULL)
        pthread_cond_wait(&q->cond, &q->lock);
    job_t *j = q->head;
    q->head = j->next;
    if (q->head == NULL)
        q->tail = NULL;
    pthread_mutex_unlock(&q->lock);
    return j;
}

/* Drops every job queued, then queues `then` (or nothing). */
void wk__jobq_replace(jobq_t *q, job_t *then)
{
    pthread_mutex_lock(&q->lock);
    for (job_t *j = q->head, *n; j != NULL; j = n) {
        n = j->next;
        wk__job_free(j);
    }
    q->head = q->tail = then;
    if (then != NULL) {
        then->next = NULL;
        pthread_cond_signal(&q->cond);
    }
    pthread_mutex_unlock(&q->lock);
}

void wk__job_free(job_t *j)
{
    free(j->load);
    free(j->batch);
    free(j->input);
    wk__model_free(j->built);
    free(j->build_why);
    free(j);
}

static void send_reply(sq_loop_t *loop, void *arg)
{
    reply_t *r = arg;
    server_t *s = r->srv;
    /* A frontend's outputs go to its data connection whatever became of
     * squishd's (the frontend holds the request). */
    if (r->frontend >= 0) {
        if (s->exit_status < 0 && s->send_data != NULL)
            s->send_data(s, (uint32_t)r->frontend, r->type, r->id, &r->payload);
    } else if (s->exit_status < 0 && !s->lost && r->gen == s->conn_gen &&
               sq_conn_send(s->conn, r->type, r->id, r->payload.data, (uint32_t)r->payload.len) ==
                   0 &&
               sq_conn_pending(s->conn))
        sq_loop_modify(loop, s->conn->fd, SQ_EV_READ | SQ_EV_WRITE);
    sq_buf_dispose(&r->payload);
    free(r);
    pthread_mutex_lock(&s->reply_lock);
    s->replies_written++;
    pthread_cond_broadcast(&s->reply_cond);
    pthread_mutex_unlock(&s->reply_lock);
}

/* Execution thread, before a job: waits until the replies of the jobs
 * before it are written to the socket (the kernel delivers them even if
 * this process dies next). */
void wk__replies_flushed(server_t *s)
{
    pthread_mutex_lock(&s->reply_lock);
    while (s->replies_written < s->replies_posted && !s->io_done)
        pthread_cond_wait(&s->reply_cond, &s->reply_lock);
    pthread_mutex_unlock(&s->reply_lock);
}

/* From the execution thread: queue a frame for the I/O thread to send. */
reply_t *wk__reply_new(server_t *s, uint16_t type, uint64_t id)
{
    reply_t *r = sq_xcalloc(1, sizeof(*r));
    r->srv = s;
    r->type = type;
    r->id = id;
    /* For the connection of the job running, or the I/O thread's. */
    r->gen = pthread_equal(pthread_self(), s->exec) ? s->exec_gen : s->conn_gen;
    r->frontend = -1;
    sq_buf_init(&r->payload);
    return r;
}

reply_t *wk__reply_new_data(server_t *s, uint16_t type, uint64_t id, uint32_t frontend)
{
    reply_t *r = wk__reply_new(s, type, id);
    r->frontend = frontend;
    return r;
}

void wk__reply_post(server_t *s, reply_t *r)
{
    pthread_mutex_lock(&s->reply_lock);
    s->replies_posted++;
    pthread_mutex_unlock(&s->reply_lock);
    sq_loop_post(s->loop, send_reply, r);
}

void wk__reply_failed(server_t *s, uint64_t key, int code, const char *msg)
{
    reply_t *r = wk__reply_new(s, SQ_MSG_MODEL_FAILED, key);
    sq_ipc_error_t e = {.code = code};
    snprintf(e.message, sizeof(e.message), "%s", msg);
    sq_ipc_error_encode(&r->payload, &e);
    wk__reply_post(s, r);
}

model_t *wk__model_find(server_t *s, uint64_t key)
{
    for (model_t *m = s->models; m != NULL; m = m->next)
        if (m->key == key)
            return m;
    return NULL;
}

void wk__model_free(model_t *m)
{
    if (m == NULL)
        return;
    wk_plan_free(m->plan);
    wk_group_free(m->group);
    free(m->ref_out);
    free(m->ref_why);
    free(m);
}

void wk__model_drop(server_t *s, uint64_t key)
{
    for (model_t **pm = &s->models; *pm != NULL; pm = &(*pm)->next) {
        if ((*pm)->key == key) {
            model_t *m = *pm;
            *pm = m->next;
            wk__model_free(m);
            return;
        }
    }
}

int wk__model_max_batch(const model_t *m)
{
    if (m->group != NULL)
        return wk_group_max_batch(m->group);
    return m->max_batch > 0 ? m->max_batch : wk_plan_max_batch(m->plan);
}

uint64_t wk__model_memory(const model_t *m)
{
    return m->group != NULL ? wk_group_memory_bytes(m->group) : wk_plan_memory_bytes(m->plan);
}

/* Floats of an item's row: every output of a model, one after the other
 * (wk_plan_row_elems); for a group (single-output members), its widest
 * member's output. */
int64_t wk__model_out_elems(const model_t *m)
{
    if (m->group == NULL)
        return wk_plan_row_elems(m->plan);
    int64_t most = 0;
    for (int i = 0; i < wk_group_n_members(m->group); i++)
        if (wk_group_output_elems(m->group, i) > most)
            most = wk_group_output_elems(m->group, i);
    return most;
}

const char *wk__model_errmsg(const model_t *m)
{
    return m->group != NULL ? wk_group_errmsg(m->group) : wk_plan_errmsg(m->plan);
}

/* Runs `batch` items of a model or group: pixels or FP32 tensors in `in`,
 * row i (every output of the item) at out + i * out_stride floats (a plain
 * model needs out_stride == its row size). */
int wk__model_run(model_t *m, int batch, int pixels, const uint8_t *in, const int *member,
                  float *out, size_t out_stride)
{
    if (m->group != NULL)
        return pixels ? wk_group_run_pixels(m->group, batch, in, member, out, out_stride)
                      : wk_group_run(m->group, batch, (const float *)in, member, out, out_stride);
    if (!pixels && wk_plan_n_inputs(m->plan) != 1)
        return SQ_INVAL;
    /* a batch over the plan's max runs in pieces of the plan's max */
    int piece = wk_plan_max_batch(m->plan), rc = 0;
    size_t item =
        pixels ? (size_t)m->pixel_h * (size_t)m->pixel_w * 3 : (size_t)m->in_elems * sizeof(float);
    for (int done = 0; done < batch && rc == 0; done += piece) {
        int n = batch - done < piece ? batch - done : piece;
        const uint8_t *at = in + (size_t)done * item;
        float *rows = out + (size_t)done * out_stride;
        const float *ins[1] = {(const float *)at};
        rc = pixels ? wk_plan_run_pixels(m->plan, n, at, rows)
                    : wk_plan_run_rows(m->plan, n, ins, rows);
    }
    return rc;
}

int wk__model_run_u8(model_t *m, int batch, const uint8_t *in, float *out, size_t out_stride)
{
    if (m->group != NULL || wk_plan_n_inputs(m->plan) != 1)
        return SQ_INVAL;
    int piece = wk_plan_max_batch(m->plan), rc = 0;
    for (int done = 0; done < batch && rc == 0; done += piece) {
        int n = batch - done < piece ? batch - done : piece;
        rc = wk_plan_run_u8(m->plan, n, in + (size_t)done * (size_t)m->in_elems,
                            out + (size_t)done * out_stride);
    }
    return rc;
}

void wk__profile_input(int pixels, size_t item_bytes, int items, uint8_t *in)
{
    size_t n = item_bytes * (size_t)items;
    if (pixels) {
        uint32_t seed = 12345;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            in[i] = (uint8_t)(seed >> 24);
        }
        return;
    }
    for (size_t i = 0; i < n / sizeof(float); i++)
        ((float *)in)[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
}

void wk__enqueue(server_t *s, job_t *j)
{
    j->received_ns = sq_now_ns();
    j->gen = s->conn_gen;
    wk__jobq_push(&s->execq, j);
}

void wk__finish(server_t *s, int status)
{
    s->exit_status = status;
    sq_loop_stop(s->loop);
}

/* A model file's bytes are mapped, not malloc'd: nothing touches their
 * pages before the chunks do. An allocator that fills new memory
 * (MALLOC_PERTURB_, as meson sets for tests) held this thread, and its
 * PONGs, for over a second on a 500 MB file.
 *
 * They are kept for the worker's life (a reload needs no transfer, and a
 * remote worker tells the next squishd which files it holds), but read
 * only while a model loads. So they go to an unlinked file in the
 * temporary directory ($TMPDIR, else /var/tmp), its blocks reserved first
 * (a full disk then refuses here rather than faulting in the copy), and
 * once loaded its pages live in the page cache, which the kernel may
 * write back and reclaim, not in the worker's resident memory: six
 * classifiers' files were 203 MB of it. A directory without O_TMPFILE or
 * fallocate, or a full one, gets anonymous memory as before. */
uint8_t *wk__file_alloc(size_t n, bool *file)
{
    *file = false;
    const char *dir = getenv("TMPDIR");
    if (dir == NULL || dir[0] == '\0')
        dir = "/var/tmp";
    int fd = n > 0 ? open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600) : -1;
    if (fd >= 0) {
        void *p = MAP_FAILED;
        if (fallocate(fd, 0, 0, (off_t)n) == 0)
            p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd); /* the mapping holds the file */
        if (p != MAP_FAILED) {
            *file = true;
            return p;
        }
    }
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void wk__file_idle(const uint8_t *p, size_t n, bool file)
{
    if (file && p != NULL && n > 0)
        madvise((void *)(uintptr_t)p, n, MADV_DONTNEED);
}

void wk__file_free(uint8_t *p, size_t n)
{
    if (p != NULL)
        munmap(p, n);
}

cached_t *wk__cache_find(server_t *s, const char *sha)
{
    for (cached_t *c = s->cache; c != NULL; c = c->next)
        if (strcmp(c->sha256, sha) == 0)
            return c;
    return NULL;
}

/* Jobs still queued came on a connection that is gone: nobody waits for
 * their answers (squishd re-sends what it still wants). */
void wk__drop_queued(server_t *s)
{
    wk__jobq_replace(&s->execq, NULL);
}

/* What belonged to the connection: a file half received, a batch's inputs. */
void wk__reset_connection_state(server_t *s)
{
    if (s->rx.spec != NULL)
        wk__file_free(s->rx.bytes, s->rx.spec->total_bytes);
    free(s->rx.spec);
    mdb_sha256_free(s->rx.digest);
    memset(&s->rx, 0, sizeof(s->rx));
    sq_buf_dispose(&s->rin.bytes);
    s->rin.active = 0;
}
