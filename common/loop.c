#include "sq_loop.h"
#include "sq_alloc.h"
#include "sq_clock.h"

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

typedef struct {
    int64_t when_ns;
    uint64_t id;
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
    timer_t_ *heap; /* min-heap on (when_ns, id) */
    size_t nheap, capheap;
    uint64_t next_timer_id;
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
    l->next_timer_id = 1;
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
    free(l->heap);
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

static int timer_less(const timer_t_ *a, const timer_t_ *b)
{
    return a->when_ns < b->when_ns || (a->when_ns == b->when_ns && a->id < b->id);
}

static void heap_up(timer_t_ *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!timer_less(&h[i], &h[p]))
            break;
        timer_t_ t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

static void heap_down(timer_t_ *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && timer_less(&h[l], &h[m]))
            m = l;
        if (r < n && timer_less(&h[r], &h[m]))
            m = r;
        if (m == i)
            return;
        timer_t_ t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

uint64_t sq_loop_timer_at(sq_loop_t *l, int64_t when_ns, sq_timer_fn fn, void *data)
{
    if (l->nheap == l->capheap) {
        l->capheap = l->capheap ? l->capheap * 2 : 32;
        l->heap = sq_xrealloc(l->heap, sizeof(timer_t_) * l->capheap);
    }
    uint64_t id = l->next_timer_id++;
    l->heap[l->nheap] = (timer_t_){.when_ns = when_ns, .id = id, .fn = fn, .data = data};
    heap_up(l->heap, l->nheap++);
    return id;
}

void sq_loop_timer_cancel(sq_loop_t *l, uint64_t id)
{
    for (size_t i = 0; i < l->nheap; i++) {
        if (l->heap[i].id != id)
            continue;
        l->heap[i] = l->heap[--l->nheap];
        if (i < l->nheap) {
            heap_down(l->heap, l->nheap, i);
            heap_up(l->heap, i);
        }
        return;
    }
}

void sq_loop_post(sq_loop_t *l, sq_post_fn fn, void *arg)
{
    post_t *p = sq_xmalloc(sizeof(*p));
    p->next = NULL;
    p->fn = fn;
    p->arg = arg;
    pthread_mutex_lock(&l->post_lock);
    if (l->post_tail)
        l->post_tail->next = p;
    else
        l->post_head = p;
    l->post_tail = p;
    pthread_mutex_unlock(&l->post_lock);
    uint64_t one = 1;
    ssize_t rc = write(l->wakefd, &one, sizeof(one));
    (void)rc;
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
    while (l->nheap > 0 && l->heap[0].when_ns <= now) {
        timer_t_ t = l->heap[0];
        l->heap[0] = l->heap[--l->nheap];
        heap_down(l->heap, l->nheap, 0);
        t.fn(l, t.id, t.data);
    }
}

void sq_loop_stop(sq_loop_t *l)
{
    atomic_store(&l->stop, 1);
    uint64_t one = 1;
    ssize_t rc = write(l->wakefd, &one, sizeof(one));
    (void)rc;
}

void sq_loop_run(sq_loop_t *l)
{
    struct epoll_event evs[64];
    while (!atomic_load(&l->stop)) {
        int timeout_ms = -1;
        if (l->nheap > 0) {
            int64_t wait_ns = l->heap[0].when_ns - sq_now_ns();
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
