#include "sq_loop.h"
#include "sq_alloc.h"
#include "sq_clock.h"
#include "sq_heap.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct {
    int fd;
    int events;
    sq_io_fn fn;
    void *data;
    int active;
} watcher_t;

/* A timer lives in a slot; its id is (arming sequence << 32 | slot), so a
 * stale id (fired or cancelled, the slot since reused) matches nothing. */
typedef struct {
    uint64_t id; /* 0: the slot is free */
    sq_timer_fn fn;
    void *data;
} timer_t_;

typedef struct post_s {
    struct post_s *next;
    sq_post_fn fn;
    void *arg;
} post_t;

struct sq_loop {
    int epfd;
    int wakefd;
    watcher_t *watchers; /* indexed by fd */
    int nwatchers;
    timer_t_ *timers; /* slots */
    int ntimers;      /* slots in use or on the free list */
    int *free_slots;
    int nfree;
    sq_iheap_t due; /* slots by when_ns (equal times: the lower slot first) */
    uint64_t next_seq;
    pthread_mutex_t post_lock;
    post_t *post_head, *post_tail;
    atomic_int stop;
};

sq_loop_t *sq_loop_new(void)
{
    sq_loop_t *l = sq_xcalloc(1, sizeof(*l));
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->epfd < 0 || l->wakefd < 0) {
        if (l->epfd >= 0)
            close(l->epfd);
        if (l->wakefd >= 0)
            close(l->wakefd);
        free(l);
        return NULL;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l->wakefd};
    epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev);
    pthread_mutex_init(&l->post_lock, NULL);
    l->next_seq = 1;
    return l;
}

void sq_loop_free(sq_loop_t *l)
{
    if (l == NULL)
        return;
    close(l->epfd);
    close(l->wakefd);
    for (post_t *p = l->post_head, *n; p != NULL; p = n) {
        n = p->next;
        free(p);
    }
    free(l->watchers);
    free(l->timers);
    free(l->free_slots);
    sq_iheap_dispose(&l->due);
    pthread_mutex_destroy(&l->post_lock);
    free(l);
}

static uint32_t to_epoll(int events)
{
    return (events & SQ_EV_READ ? EPOLLIN | EPOLLRDHUP : 0) | (events & SQ_EV_WRITE ? EPOLLOUT : 0);
}

int sq_loop_watch(sq_loop_t *l, int fd, int events, sq_io_fn fn, void *data)
{
    if (fd < 0)
        return -EBADF;
    if (fd >= l->nwatchers) {
        int n = l->nwatchers ? l->nwatchers : 64;
        while (n <= fd)
            n *= 2;
        l->watchers = sq_xrealloc(l->watchers, sizeof(watcher_t) * (size_t)n);
        memset(l->watchers + l->nwatchers, 0, sizeof(watcher_t) * (size_t)(n - l->nwatchers));
        l->nwatchers = n;
    }
    struct epoll_event ev = {.events = to_epoll(events), .data.fd = fd};
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
        return -errno;
    l->watchers[fd] = (watcher_t){.fd = fd, .events = events, .fn = fn, .data = data, .active = 1};
    return 0;
}

int sq_loop_modify(sq_loop_t *l, int fd, int events)
{
    if (fd < 0 || fd >= l->nwatchers || !l->watchers[fd].active)
        return -ENOENT;
    if (l->watchers[fd].events == events)
        return 0;
    struct epoll_event ev = {.events = to_epoll(events), .data.fd = fd};
    if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) != 0)
        return -errno;
    l->watchers[fd].events = events;
    return 0;
}

void sq_loop_unwatch(sq_loop_t *l, int fd)
{
    if (fd < 0 || fd >= l->nwatchers || !l->watchers[fd].active)
        return;
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
    l->watchers[fd].active = 0;
}

uint64_t sq_loop_timer_at(sq_loop_t *l, int64_t when_ns, sq_timer_fn fn, void *data)
{
    int slot;
    if (l->nfree > 0) {
        slot = l->free_slots[--l->nfree];
    } else {
        slot = l->ntimers++;
        l->timers = sq_xrealloc(l->timers, sizeof(timer_t_) * (size_t)l->ntimers);
        l->free_slots = sq_xrealloc(l->free_slots, sizeof(int) * (size_t)l->ntimers);
        sq_iheap_reserve(&l->due, l->ntimers);
    }
    uint64_t id = l->next_seq++ << 32 | (uint64_t)slot;
    l->timers[slot] = (timer_t_){.id = id, .fn = fn, .data = data};
    sq_iheap_set(&l->due, slot, when_ns);
    return id;
}

static void release_slot(sq_loop_t *l, int slot)
{
    sq_iheap_remove(&l->due, slot);
    l->timers[slot].id = 0;
    l->free_slots[l->nfree++] = slot;
}

void sq_loop_timer_cancel(sq_loop_t *l, uint64_t id)
{
    uint64_t slot = id & 0xffffffffu;
    if (id == 0 || slot >= (uint64_t)l->ntimers || l->timers[slot].id != id)
        return;
    release_slot(l, (int)slot);
}

/* The loops this thread posted to while deferring, not woken yet. */
#define DEFERRED_MAX 8
static _Thread_local int deferring;
static _Thread_local sq_loop_t *deferred[DEFERRED_MAX];
static _Thread_local int ndeferred;

static void wake(sq_loop_t *l)
{
    uint64_t one = 1;
    ssize_t rc = write(l->wakefd, &one, sizeof(one));
    (void)rc;
}

/* Remembers l for sq_loop_flush_wakes; 0 when it cannot (the list is
 * full: the caller wakes it now). */
static int defer_wake(sq_loop_t *l)
{
    for (int i = 0; i < ndeferred; i++)
        if (deferred[i] == l)
            return 1;
    if (ndeferred == DEFERRED_MAX)
        return 0;
    deferred[ndeferred++] = l;
    return 1;
}

void sq_loop_defer_wakes(void)
{
    deferring = 1;
}

void sq_loop_flush_wakes(void)
{
    deferring = 0;
    for (int i = 0; i < ndeferred; i++)
        wake(deferred[i]);
    ndeferred = 0;
}

void sq_loop_post(sq_loop_t *l, sq_post_fn fn, void *arg)
{
    post_t *p = sq_xmalloc(sizeof(*p));
    p->next = NULL;
    p->fn = fn;
    p->arg = arg;
    pthread_mutex_lock(&l->post_lock);
    int was_empty = l->post_head == NULL;
    if (l->post_tail)
        l->post_tail->next = p;
    else
        l->post_head = p;
    l->post_tail = p;
    pthread_mutex_unlock(&l->post_lock);
    /* Only the post that finds the queue empty wakes the loop. A later one
     * joins a queue that run_posts has not taken yet, and run_posts reads
     * the eventfd before it takes the queue, so that wake-up is still to
     * come or is being served now. Under load (one loop fed by several
     * threads, or one busy thread) this saves a write(2) and a wake-up per
     * post. */
    if (was_empty && !(deferring && defer_wake(l)))
        wake(l);
}

static void run_posts(sq_loop_t *l)
{
    uint64_t v;
    ssize_t rc = read(l->wakefd, &v, sizeof(v));
    (void)rc;
    pthread_mutex_lock(&l->post_lock);
    post_t *p = l->post_head;
    l->post_head = l->post_tail = NULL;
    pthread_mutex_unlock(&l->post_lock);
    while (p != NULL) {
        post_t *n = p->next;
        p->fn(l, p->arg);
        free(p);
        p = n;
    }
}

void sq_loop_run_posts(sq_loop_t *l)
{
    run_posts(l);
}

static void run_timers(sq_loop_t *l)
{
    int64_t now = sq_now_ns();
    while (sq_iheap_top_key(&l->due, INT64_MAX) <= now) {
        int slot = sq_iheap_top(&l->due);
        timer_t_ t = l->timers[slot];
        release_slot(l, slot);
        t.fn(l, t.id, t.data);
    }
}

void sq_loop_stop(sq_loop_t *l)
{
    atomic_store(&l->stop, 1);
    wake(l);
}

void sq_loop_run(sq_loop_t *l)
{
    struct epoll_event evs[64];
    while (!atomic_load(&l->stop)) {
        int timeout_ms = -1;
        if (l->due.n > 0) {
            int64_t wait_ns = sq_iheap_top_key(&l->due, INT64_MAX) - sq_now_ns();
            timeout_ms = wait_ns <= 0 ? 0 : (int)((wait_ns + 999999) / 1000000);
        }
        int n = epoll_wait(l->epfd, evs, 64, timeout_ms);
        if (n < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == l->wakefd) {
                run_posts(l);
                continue;
            }
            if (fd >= l->nwatchers || !l->watchers[fd].active)
                continue;
            uint32_t e = evs[i].events;
            int events = 0;
            if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                events |= SQ_EV_READ;
            if (e & EPOLLOUT)
                events |= SQ_EV_WRITE;
            watcher_t w = l->watchers[fd];
            w.fn(l, fd, events, w.data);
        }
        run_timers(l);
    }
}
