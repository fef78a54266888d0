/* squish-loadgen: an open-loop HTTP/1.1 load generator for loopback
 * benchmarks of squishd (and of bench/live/bare_h2o.c, the baseline).
 *
 * Arrivals are a seeded Poisson process fixed before the run; each request
 * is due at its scheduled moment whatever happened to earlier ones (open
 * loop). One thread, epoll, non-blocking sockets, a pool of HTTP/1.1
 * keep-alive connections (one request in flight per connection, no
 * pipelining); a due request takes an idle connection or opens a new one,
 * and waits in the loadgen only when --connections are all busy.
 *
 * Latency and the SLO are measured from the request's first byte written
 * (the moment squishd could know of it), not from its scheduled moment: on
 * a shared box the loadgen itself wakes late, and that is not squishd's
 * doing. The lag between schedule and write is reported on its own
 * (send_lag_ms, sent_rps): that is how a loadgen bottleneck shows. Requests
 * still keep their schedule (a late one does not delay the next), and a
 * request waiting for a free connection is sent late and shows as lag.
 *
 * Outcomes: good (200 within the SLO), late (200 past it), dropped (503
 * with "code":"deadline" or "overloaded" and a Retry-After header: shed by
 * squishd to keep SLOs), error (any other status, or a 503 without
 * Retry-After), timeout (no complete answer within --timeout-ms of the
 * schedule), conn_error (connect, reset, close before the answer), unsent
 * (no connection free before the timeout). Bytes the server sends on a
 * connection with no request pending are counted apart (stray_answers:
 * every request must get exactly one answer). --per-second adds each
 * second's counts: offered by schedule, answers by the time they came.
 *
 * --closed N is the other mode, for throughput: N requests always in
 * flight (one per connection), a new one as soon as one is answered;
 * answered_rps is then the server's (or the loadgen's, see
 * loadgen_cpu_fraction) capacity.
 *
 * Output: one JSON summary on stdout; with --search-goodput, the trials and
 * the highest rate at which >= --target of the requests were good
 * (Symphony's goodput, as squish-sim --search-goodput computes it). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "sq_alloc.h"

#include "loadgen_int.h"

/* splitmix64: seeds and draws; enough for exponential gaps. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) /* (0, 1] */
{
    return ((double)(rng_next(s) >> 11) + 1.0) / 9007199254740992.0;
}

/* ---- one run at one rate ---------------------------------------------- */

static void arm_timer(lg_run_t *r, int64_t at_ns)
{
    int64_t abs = r->t0 + at_ns;
    struct itimerspec its = {.it_value = {.tv_sec = abs / 1000000000, .tv_nsec = abs % 1000000000}};
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0)
        its.it_value.tv_nsec = 1;
    timerfd_settime(r->tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *sorted, long n, double q)
{
    if (n == 0)
        return 0;
    long k = (long)ceil(q * (double)n) - 1;
    return sorted[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static void summarize(const lg_run_t *r, double rate, double cpu_s, double wall_s, lg_summary_t *s)
{
    const lg_opts_t *o = r->o;
    int64_t warm_ns = (int64_t)(o->warmup_s * 1e9);
    memset(s, 0, sizeof(*s));
    s->rate_rps = rate;
    double *lat = sq_xcalloc((size_t)r->nreqs + 1, sizeof(double));
    double *lag = sq_xcalloc((size_t)r->nreqs + 1, sizeof(double));
    long nlat = 0, nlag = 0;
    int64_t first_sent = INT64_MAX, last_sent = 0;
    for (long i = 0; i < r->nreqs; i++) {
        const lg_req_t *q = &r->reqs[i];
        if (q->sched_ns < warm_ns)
            continue;
        s->n++;
        s->counts[q->outcome]++;
        if (q->outcome == OUT_GOOD || q->outcome == OUT_LATE)
            lat[nlat++] = (double)(q->done_ns - q->sent_ns) / 1e6;
        if (q->sent_ns > 0) {
            lag[nlag++] = (double)(q->sent_ns - q->sched_ns) / 1e6;
            first_sent = q->sent_ns < first_sent ? q->sent_ns : first_sent;
            last_sent = q->sent_ns > last_sent ? q->sent_ns : last_sent;
        }
    }
    qsort(lat, (size_t)nlat, sizeof(double), cmp_double);
    qsort(lag, (size_t)nlag, sizeof(double), cmp_double);
    s->offered_rps = (double)s->n / o->duration_s;
    s->sent_rps = nlag > 1 && last_sent > first_sent
                      ? (double)(nlag - 1) / ((double)(last_sent - first_sent) / 1e9)
                      : 0;
    s->goodput_rps = (double)s->counts[OUT_GOOD] / o->duration_s;
    s->answered_rps = (double)(s->counts[OUT_GOOD] + s->counts[OUT_LATE]) / o->duration_s;
    s->bad_rate = s->n ? 1.0 - (double)s->counts[OUT_GOOD] / (double)s->n : 0;
    s->lat_p50 = quantile(lat, nlat, 0.50);
    s->lat_p90 = quantile(lat, nlat, 0.90);
    s->lat_p99 = quantile(lat, nlat, 0.99);
    s->lat_max = nlat ? lat[nlat - 1] : 0;
    s->lag_p50 = quantile(lag, nlag, 0.50);
    s->lag_p99 = quantile(lag, nlag, 0.99);
    s->lag_max = nlag ? lag[nlag - 1] : 0;
    s->opened = r->opened;
    s->retries = r->retries;
    s->stray = r->stray;
    s->no_retry_after = r->no_retry_after;
    s->cpu_fraction = wall_s > 0 ? cpu_s / wall_s : 0;
    if (o->per_second) {
        s->nsec = (long)ceil(o->duration_s + (double)o->timeout_ns / 1e9) + 1;
        s->sec = sq_xcalloc((size_t)s->nsec, sizeof(*s->sec));
        for (long i = 0; i < r->nreqs; i++) {
            const lg_req_t *q = &r->reqs[i];
            if (q->sched_ns < warm_ns)
                continue;
            long at = (long)((q->sched_ns - warm_ns) / 1000000000);
            s->sec[at < s->nsec ? at : s->nsec - 1][SEC_OFFERED]++;
            at = q->done_ns > warm_ns ? (long)((q->done_ns - warm_ns) / 1000000000) : 0;
            at = at < s->nsec ? at : s->nsec - 1;
            int col = q->outcome == OUT_GOOD      ? SEC_GOOD
                      : q->outcome == OUT_LATE    ? SEC_LATE
                      : q->outcome == OUT_DROPPED ? SEC_DROPPED
                                                  : SEC_BAD;
            s->sec[at][col]++;
        }
    }
    free(lat);
    free(lag);
}

/* Runs warmup + duration seconds of Poisson arrivals at rate_rps through
 * the shared connection pool r (kept between runs), then waits for every
 * request's answer or timeout. */
static void run_at(lg_run_t *r, double rate_rps, uint64_t seed, lg_summary_t *s)
{
    const lg_opts_t *o = r->o;
    double total_s = o->warmup_s + o->duration_s;
    long cap = (long)(rate_rps * total_s * 1.2) + 64;
    r->reqs = sq_xcalloc((size_t)cap, sizeof(lg_req_t));
    r->nreqs = 0;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ULL + 1;
    double t = 0;
    for (; o->closed == 0;) {
        t += -log(rng_unit(&rng)) / rate_rps;
        if (t >= total_s)
            break;
        if (r->nreqs == cap) {
            cap *= 2;
            r->reqs = sq_xrealloc(r->reqs, (size_t)cap * sizeof(lg_req_t));
        }
        r->reqs[r->nreqs++] = (lg_req_t){.sched_ns = (int64_t)(t * 1e9), .outcome = OUT_PENDING};
    }
    r->next_due = r->next_start = 0;
    r->inflight = 0;
    r->opened = r->retries = 0;
    double cpu0 = cpu_seconds();
    r->t0 = now_ns() + 2000000; /* 2 ms to get going */
    int64_t last_scan = 0;
    struct epoll_event evs[256];
    int64_t total_ns = (int64_t)(total_s * 1e9);
    for (;;) {
        int64_t now = now_ns() - r->t0;
        /* Closed loop: a new request as soon as one is answered. */
        while (o->closed > 0 && now >= 0 && now < total_ns &&
               r->inflight + (r->nreqs - r->next_start) < o->closed) {
            if (r->nreqs == cap) {
                cap *= 2;
                r->reqs = sq_xrealloc(r->reqs, (size_t)cap * sizeof(lg_req_t));
            }
            r->reqs[r->nreqs++] = (lg_req_t){.sched_ns = now, .outcome = OUT_PENDING};
        }
        if (r->next_start >= r->nreqs && r->inflight == 0 && (o->closed == 0 || now >= total_ns))
            break;
        while (r->next_due < r->nreqs && r->reqs[r->next_due].sched_ns <= now)
            r->next_due++;
        while (r->next_start < r->next_due) {
            int slot = -1;
            while (r->nidle > 0 && slot < 0) {
                slot = r->idle[--r->nidle];
                if (r->conns[slot].state != CONN_IDLE)
                    slot = -1;
            }
            if (slot < 0 && (slot = lg_conn_open(r)) < 0)
                break;
            long i = r->next_start++;
            r->inflight++;
            lg_conn_start(r, slot, i);
        }
        if (now - last_scan > 2000000) {
            last_scan = now;
            /* Requests still waiting for a connection past their timeout. */
            while (r->next_start < r->next_due &&
                   now - r->reqs[r->next_start].sched_ns > o->timeout_ns) {
                r->reqs[r->next_start].outcome = OUT_UNSENT;
                r->reqs[r->next_start].done_ns = now;
                r->next_start++;
            }
            for (int k = 0; k < o->max_conns; k++) {
                lg_conn_t *c = &r->conns[k];
                if (c->state == CONN_FREE || c->req < 0)
                    continue;
                if (now - r->reqs[c->req].sched_ns > o->timeout_ns) {
                    long i = c->req;
                    lg_conn_close(r, k);
                    lg_finish(r, i, OUT_TIMEOUT, 0);
                }
            }
        }
        if (r->next_due < r->nreqs)
            arm_timer(r, r->reqs[r->next_due].sched_ns);
        int n = epoll_wait(r->ep, evs, 256, 2);
        for (int k = 0; k < n; k++) {
            if (evs[k].data.u32 == UINT32_MAX) {
                uint64_t ticks;
                if (read(r->tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
                    perror("squish-loadgen: timerfd");
                continue;
            }
            lg_on_event(r, (int)evs[k].data.u32, evs[k].events);
        }
    }
    double wall = (double)(now_ns() - r->t0) / 1e9;
    summarize(r, rate_rps, cpu_seconds() - cpu0, wall, s);
    free(r->reqs);
    r->reqs = NULL;
}

static void print_summary(FILE *f, const lg_summary_t *s, const lg_opts_t *o, const char *indent)
{
    double n = s->n ? (double)s->n : 1;
    fprintf(f,
            "%s{\"rate_rps\": %.1f, \"duration_s\": %.1f, \"warmup_s\": %.1f, \"slo_ms\": %.3f, "
            "\"requests\": %ld, \"offered_rps\": %.1f, \"sent_rps\": %.1f, "
            "\"goodput_rps\": %.1f, \"answered_rps\": %.1f, \"closed_loop\": %d, "
            "\"bad_rate\": %.5f, "
            "\"good\": %ld, \"late\": %ld, \"dropped\": %ld, \"errors\": %ld, \"timeouts\": %ld, "
            "\"conn_errors\": %ld, \"unsent\": %ld, "
            "\"dropped_rate\": %.5f, \"late_rate\": %.5f, \"error_rate\": %.5f, "
            "\"latency_ms\": {\"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f, \"max\": %.3f}, "
            "\"send_lag_ms\": {\"p50\": %.3f, \"p99\": %.3f, \"max\": %.3f}, "
            "\"connections_opened\": %ld, \"retries\": %ld, \"stray_answers\": %ld, "
            "\"no_retry_after\": %ld, \"loadgen_cpu_fraction\": %.3f",
            indent, s->rate_rps, o->duration_s, o->warmup_s, o->slo_ms, s->n, s->offered_rps,
            s->sent_rps, s->goodput_rps, s->answered_rps, o->closed, s->bad_rate,
            s->counts[OUT_GOOD], s->counts[OUT_LATE], s->counts[OUT_DROPPED], s->counts[OUT_ERROR],
            s->counts[OUT_TIMEOUT], s->counts[OUT_CONN_ERROR], s->counts[OUT_UNSENT],
            (double)s->counts[OUT_DROPPED] / n, (double)s->counts[OUT_LATE] / n,
            (double)(s->counts[OUT_ERROR] + s->counts[OUT_TIMEOUT] + s->counts[OUT_CONN_ERROR] +
                     s->counts[OUT_UNSENT]) /
                n,
            s->lat_p50, s->lat_p90, s->lat_p99, s->lat_max, s->lag_p50, s->lag_p99, s->lag_max,
            s->opened, s->retries, s->stray, s->no_retry_after, s->cpu_fraction);
    static const char *const cols[SEC_NCOLS] = {"offered", "good", "late", "dropped", "bad"};
    for (int k = 0; s->sec != NULL && k < SEC_NCOLS; k++) {
        fprintf(f, "%s\"%s\": [", k == 0 ? ", \"per_second\": {" : ", ", cols[k]);
        for (long i = 0; i < s->nsec; i++)
            fprintf(f, "%s%ld", i ? ", " : "", s->sec[i][k]);
        fprintf(f, "]%s", k == SEC_NCOLS - 1 ? "}" : "");
    }
    fprintf(f, "}");
}

/* ---- request bytes ---------------------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return NULL;
    }
    char *buf = sq_xmalloc((size_t)st.st_size + 1);
    size_t n = fread(buf, 1, (size_t)st.st_size, f);
    fclose(f);
    if (n != (size_t)st.st_size) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

/* Triton's binary tensor extension: a JSON header naming the input, then the
 * raw little-endian tensor of shape [1, dims...] (deterministic pseudo-random
 * pixels). */
static char *tensor_body(const int *dims, int ndims, const char *dtype, double slo_ms, size_t *len,
                         size_t *header_len)
{
    size_t elems = 1;
    char shape[128] = "1";
    for (int i = 0; i < ndims; i++) {
        elems *= (size_t)dims[i];
        size_t at = strlen(shape);
        snprintf(shape + at, sizeof(shape) - at, ",%d", dims[i]);
    }
    int fp32 = strcmp(dtype, "FP32") == 0;
    size_t bytes = elems * (fp32 ? 4 : 1);
    char head[512];
    int hl = snprintf(head, sizeof(head),
                      "{\"inputs\":[{\"name\":\"input\",\"shape\":[%s],\"datatype\":\"%s\","
                      "\"parameters\":{\"binary_data_size\":%zu}}],"
                      "\"parameters\":{\"slo_ms\":%g}}",
                      shape, dtype, bytes, slo_ms);
    char *body = sq_xmalloc((size_t)hl + bytes);
    memcpy(body, head, (size_t)hl);
    uint64_t rng = 7;
    for (size_t i = 0; i < elems; i++) {
        uint8_t px = (uint8_t)(rng_next(&rng) >> 56);
        if (fp32) {
            float v = (float)px / 255.0f;
            memcpy(body + hl + 4 * i, &v, 4);
        } else {
            body[hl + i] = (char)px;
        }
    }
    *len = (size_t)hl + bytes;
    *header_len = (size_t)hl;
    return body;
}

/* Closes the connections and frees the run (a clean exit under LeakSanitizer). */
static void lg_free(lg_run_t *r)
{
    fflush(stdout);
    for (int i = 0; i < r->o->max_conns; i++) {
        if (r->conns[i].fd >= 0)
            close(r->conns[i].fd);
        free(r->conns[i].rbuf);
    }
    free(r->conns);
    free(r->idle);
    free(r->o->wire);
    close(r->ep);
    close(r->tfd);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: squish-loadgen --port P [--host 127.0.0.1] --path /v1/models/M/infer\n"
               "         (--body FILE [--content-type T] | --tensor CxHxW [--dtype FP32|UINT8])\n"
               "         (--rate RPS | --closed N) [--duration S] [--warmup S] [--seed N]\n"
               "         [--slo-ms MS] [--late-ms MS (good/late threshold, default the SLO)]\n"
               "         [--connections N] [--timeout-ms MS] [--per-second]\n"
               "         [--search-goodput [--target F] [--precision F] [--pause-ms MS]]\n"
               "Open-loop Poisson load over HTTP/1.1 keep-alive (--closed N: closed loop, N\n"
               "requests always in flight, for the highest throughput); JSON summary on stdout.\n");
}

int main(int argc, char **argv)
{
    lg_opts_t o = {.slo_ms = 25, .max_conns = 512, .duration_s = 10, .warmup_s = 1, .seed = 1};
    const char *host = "127.0.0.1", *path = NULL, *body_file = NULL, *tensor = NULL;
    const char *ctype = "image/jpeg", *dtype = "FP32";
    int port = 0, search = 0;
    double rate = 0, timeout_ms = -1, target = 0.99, precision = 0.02, pause_ms = 1000;
    static const struct option longopts[] = {{"host", required_argument, 0, 'H'},
                                             {"port", required_argument, 0, 'p'},
                                             {"path", required_argument, 0, 'P'},
                                             {"body", required_argument, 0, 'b'},
                                             {"content-type", required_argument, 0, 'c'},
                                             {"tensor", required_argument, 0, 't'},
                                             {"dtype", required_argument, 0, 'd'},
                                             {"rate", required_argument, 0, 'r'},
                                             {"duration", required_argument, 0, 'D'},
                                             {"warmup", required_argument, 0, 'w'},
                                             {"seed", required_argument, 0, 's'},
                                             {"slo-ms", required_argument, 0, 'S'},
                                             {"connections", required_argument, 0, 'n'},
                                             {"timeout-ms", required_argument, 0, 'T'},
                                             {"search-goodput", no_argument, 0, 'g'},
                                             {"target", required_argument, 0, 'G'},
                                             {"precision", required_argument, 0, 'e'},
                                             {"pause-ms", required_argument, 0, 'z'},
                                             {"closed", required_argument, 0, 'C'},
                                             {"late-ms", required_argument, 0, 'L'},
                                             {"per-second", no_argument, 0, 'E'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'H':
            host = optarg;
            break;
        case 'p':
            port = atoi(optarg);
            break;
        case 'P':
            path = optarg;
            break;
        case 'b':
            body_file = optarg;
            break;
        case 'c':
            ctype = optarg;
            break;
        case 't':
            tensor = optarg;
            break;
        case 'd':
            dtype = optarg;
            break;
        case 'r':
            rate = atof(optarg);
            break;
        case 'D':
            o.duration_s = atof(optarg);
            break;
        case 'w':
            o.warmup_s = atof(optarg);
            break;
        case 's':
            o.seed = strtoull(optarg, NULL, 10);
            break;
        case 'S':
            o.slo_ms = atof(optarg);
            break;
        case 'n':
            o.max_conns = atoi(optarg);
            break;
        case 'T':
            timeout_ms = atof(optarg);
            break;
        case 'g':
            search = 1;
            break;
        case 'G':
            target = atof(optarg);
            break;
        case 'e':
            precision = atof(optarg);
            break;
        case 'z':
            pause_ms = atof(optarg);
            break;
        case 'C':
            o.closed = atoi(optarg);
            break;
        case 'L':
            o.late_ms = atof(optarg);
            break;
        case 'E':
            o.per_second = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (o.closed > 0 && rate <= 0)
        rate = 1; /* unused: the closed loop sends as fast as answers come */
    if (port <= 0 || port > 65535 || path == NULL || rate <= 0 || o.duration_s <= 0 ||
        o.closed < 0 || (o.closed > 0 && search) || (o.per_second && search) || o.warmup_s < 0 ||
        o.slo_ms <= 0 || o.max_conns < 1 || o.max_conns > 60000 ||
        (body_file == NULL) == (tensor == NULL) || target <= 0 || target > 1 || precision <= 0 ||
        (strcmp(dtype, "FP32") != 0 && strcmp(dtype, "UINT8") != 0)) {
        usage(stderr);
        return 2;
    }
    if (o.late_ms <= 0)
        o.late_ms = o.slo_ms;
    o.timeout_ns = (int64_t)((timeout_ms > 0 ? timeout_ms : 10 * o.slo_ms + 1000) * 1e6);
    o.addr.sin_family = AF_INET;
    o.addr.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &o.addr.sin_addr) != 1) {
        fprintf(stderr, "squish-loadgen: --host %s: expected an IPv4 address\n", host);
        return 2;
    }

    size_t body_len = 0, header_len = 0;
    char *body;
    if (body_file != NULL) {
        if ((body = read_file(body_file, &body_len)) == NULL) {
            fprintf(stderr, "squish-loadgen: --body %s: %s\n", body_file, strerror(errno));
            return 2;
        }
    } else {
        int dims[4], nd = 0;
        for (const char *p = tensor; nd < 4 && *p != '\0';) {
            char *e;
            long v = strtol(p, &e, 10);
            if (e == p || v < 1 || v > 4096 || (*e != '\0' && *e != 'x')) {
                nd = 0;
                break;
            }
            dims[nd++] = (int)v;
            p = *e == 'x' ? e + 1 : e;
        }
        if (nd == 0) {
            fprintf(stderr, "squish-loadgen: --tensor %s: expected CxHxW\n", tensor);
            return 2;
        }
        body = tensor_body(dims, nd, dtype, o.slo_ms, &body_len, &header_len);
        ctype = "application/octet-stream";
    }
    char head[1024];
    int hl = snprintf(head, sizeof(head),
                      "POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: %s\r\n"
                      "Content-Length: %zu\r\nX-SLO-Ms: %g\r\n",
                      path, host, port, ctype, body_len, o.slo_ms);
    if (header_len > 0)
        hl += snprintf(head + hl, sizeof(head) - (size_t)hl,
                       "Inference-Header-Content-Length: %zu\r\n", header_len);
    hl += snprintf(head + hl, sizeof(head) - (size_t)hl, "\r\n");
    o.wire_len = (size_t)hl + body_len;
    o.wire = sq_xmalloc(o.wire_len);
    memcpy(o.wire, head, (size_t)hl);
    memcpy(o.wire + hl, body, body_len);
    free(body);

    /* Wake-ups on time: the default 50 µs slack would skew the schedule. */
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)o.max_conns + 64) {
        rl.rlim_cur =
            rl.rlim_max < (rlim_t)o.max_conns + 64 ? rl.rlim_max : (rlim_t)o.max_conns + 64;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    lg_run_t r = {.o = &o};
    r.ep = epoll_create1(EPOLL_CLOEXEC);
    r.tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (r.ep < 0 || r.tfd < 0) {
        perror("squish-loadgen: epoll/timerfd");
        return 1;
    }
    struct epoll_event tev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
    epoll_ctl(r.ep, EPOLL_CTL_ADD, r.tfd, &tev);
    r.conns = sq_xcalloc((size_t)o.max_conns, sizeof(lg_conn_t));
    r.idle = sq_xcalloc((size_t)o.max_conns, sizeof(int));
    for (int i = 0; i < o.max_conns; i++)
        r.conns[i].fd = -1;

    lg_summary_t s;
    if (!search) {
        run_at(&r, rate, o.seed, &s);
        print_summary(stdout, &s, &o, "");
        printf("\n");
        free(s.sec);
        lg_free(&r);
        return 0;
    }

    /* Goodput search: bracket by doubling or halving, then bisect until the
     * bracket is within --precision (relative). Each trial is a fresh run;
     * live numbers are noisy, so a trial is one sample, not a proof. */
    double lo = 0, hi = 0, best_goodput = 0;
    lg_summary_t best = {0};
    printf("{\"trials\": [\n");
    int trials = 0;
    for (double x = rate;;) {
        run_at(&r, x, o.seed + (uint64_t)trials, &s);
        print_summary(stdout, &s, &o, trials ? ",\n  " : "  ");
        fflush(stdout);
        trials++;
        int ok = s.n > 0 && 1.0 - s.bad_rate >= target;
        if (ok) {
            if (x > lo) {
                lo = x;
                best = s;
                best_goodput = x;
            }
        } else {
            hi = x;
        }
        usleep((useconds_t)(pause_ms * 1000));
        if (lo == 0 && hi > 0) {
            x = hi / 2; /* halving until one passes */
            if (x < 1)
                break;
        } else if (hi == 0) {
            x = lo * 2;
        } else if ((hi - lo) / hi > precision && trials < 30) {
            x = (lo + hi) / 2;
        } else {
            break;
        }
    }
    printf("\n],\n\"goodput_rps\": %.1f, \"target\": %.3f, \"best\": ", best_goodput, target);
    print_summary(stdout, &best, &o, "");
    printf("}\n");
    lg_free(&r);
    return 0;
}
