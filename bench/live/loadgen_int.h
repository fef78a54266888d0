/* squish-loadgen's run and connection records (loadgen.c: runs, summaries,
 * main; loadgen_conn.c: connections and the answers read on them). */
#ifndef LOADGEN_INT_H
#define LOADGEN_INT_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

typedef enum {
    OUT_GOOD,
    OUT_LATE,
    OUT_DROPPED,
    OUT_ERROR,
    OUT_TIMEOUT,
    OUT_CONN_ERROR,
    OUT_UNSENT,
    OUT_PENDING,
} outcome_t;

typedef struct {
    int64_t sched_ns; /* from the run's start */
    int64_t sent_ns;  /* first byte written; 0 before */
    int64_t done_ns;
    int status;
    outcome_t outcome;
} lg_req_t;

typedef enum { CONN_FREE, CONN_CONNECTING, CONN_IDLE, CONN_WRITING, CONN_READING } conn_state_t;

typedef struct {
    int fd;
    conn_state_t state;
    long req; /* index into the run's requests, -1 when none */
    size_t written;
    char *rbuf;
    size_t rlen, rcap;
    int served; /* answers received on this connection */
} lg_conn_t;

typedef struct {
    /* target */
    struct sockaddr_in addr;
    /* the request bytes, identical for every request */
    char *wire;
    size_t wire_len;
    double slo_ms;
    double late_ms; /* good vs late threshold: slo_ms unless --late-ms */
    int max_conns;
    int64_t timeout_ns;
    double duration_s, warmup_s;
    uint64_t seed;
    int closed; /* > 0: closed loop, this many requests always in flight */
    int verbose;
    int per_second; /* add per-second counts to the summary */
} lg_opts_t;

typedef struct {
    const lg_opts_t *o;
    int ep, tfd;
    lg_conn_t *conns;
    int *idle; /* stack of idle connection slots (LIFO: hot ones first) */
    int nidle;
    int nopen;
    lg_req_t *reqs;
    long nreqs;
    long next_due;   /* first request not yet due */
    long next_start; /* first due request not yet given a connection */
    long inflight;
    int64_t t0;
    long opened, retries, errors_logged;
    long stray, no_retry_after;
} lg_run_t;

/* Per second of the run (after the warmup): requests offered by their
 * schedule, answers by the moment they came. */
enum { SEC_OFFERED, SEC_GOOD, SEC_LATE, SEC_DROPPED, SEC_BAD, SEC_NCOLS };

typedef struct {
    double rate_rps, offered_rps, sent_rps, goodput_rps, answered_rps;
    long n, counts[OUT_PENDING];
    double bad_rate;
    double lat_p50, lat_p90, lat_p99, lat_max;
    double lag_p50, lag_p99, lag_max;
    long opened, retries;
    long stray, no_retry_after;
    double cpu_fraction;
    long nsec;
    long (*sec)[SEC_NCOLS]; /* --per-second; owned */
} lg_summary_t;

static inline int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* loadgen_conn.c */
void lg_conn_close(lg_run_t *r, int slot);
int lg_conn_open(lg_run_t *r);
void lg_finish(lg_run_t *r, long i, outcome_t out, int status);
void lg_conn_start(lg_run_t *r, int slot, long i);
void lg_on_event(lg_run_t *r, int slot, uint32_t events);

#endif
