/* front/: a frontend's side of the cluster (squishd --role frontend,
 * issue 25). The frontend takes requests, decodes them and holds their
 * inputs in its own arena; instead of a dispatcher of its own it offers
 * each item's metadata to the cluster's dispatcher (FE_ITEMS), sends the
 * rows the dispatcher assigns straight to the workers (DATA_ROWS on a
 * connection of its own to each), and answers the items with the outputs
 * they send back. It learns the models (FE_CATALOG) and the cluster's
 * readiness (FE_STATE) from the dispatcher. All of it runs on one thread
 * of its own; the entry points below are for any thread. */
#ifndef GW_FRONT_H
#define GW_FRONT_H

#include "gw_catalog.h"
#include "gw_sched.h"
#include "gw_server.h"

#include <stdint.h>

typedef struct gw_front gw_front_t;

/* A frontend's settings, copied once from gw_config_t (server.c). */
typedef struct {
    char dispatcher[512]; /* the dispatchers' cluster addresses, comma-separated */
    char cluster_token_file[256];
    char cluster_tls_cert[256]; /* "" = plain TCP */
    char cluster_tls_key[256];
    char cluster_tls_ca[256];
    pl_dispatch_opts_t core; /* the least latency's rule (gw_sched_least_on) */
} gw_front_config_t;

/* What a frontend needs of the server, given once at gw_front_start
 * (server.c fills it, gw_front_deps): its settings and the handles it
 * uses; the bound HTTP port is read through the pointer given. */
typedef struct {
    gw_front_config_t cfg;
    gw_registry_t *registry;
    gw_pipes_t *pipelines;
    sq_shm_arena_t *arena;
    gw_metrics_t *metrics;
    const atomic_int *http_port;
} gw_front_deps_t;

/* A frontend's settings and handles from srv's (server.c, which wires the
 * rooms). */
gw_front_deps_t gw_front_deps(gw_server_t *srv);

/* Starts the frontend's thread, which joins the dispatcher (cfg.dispatcher,
 * each address in turn, with the cluster token and TLS settings) and keeps
 * rejoining while squishd runs. Returns 0 with *out set, or an SQ_* error
 * with a reason in err (the token file); *out is also set when only the
 * thread could not start (gw_front_free frees it). */
int gw_front_start(const gw_front_deps_t *deps, gw_front_t **out, char *err, size_t errlen);
/* Answers every item still held 503 (squishd stops), then stops the
 * thread; accepts NULL. */
void gw_front_stop(gw_front_t *fr);
/* Frees the frontend (after gw_front_stop); accepts NULL. */
void gw_front_free(gw_front_t *fr);

/* The frontend as this process's scheduler (gw_sched_t), picked by
 * server.c for --role frontend: items (a clump through clump_next) offered
 * to the dispatcher, abandoned items withdrawn there; readiness and held
 * models as the dispatcher last said them (and whether this frontend is
 * joined to one); the serving kind from the fleet it last said; the least
 * latency on the profiles the dispatcher plans with (live-corrected, sent
 * in FE_STATE; the measured ones where it sent none). */
gw_sched_t *gw_front_sched(gw_front_t *fr);
/* The dispatcher's HTTP address ("host:port"; "" before it is joined). */
void gw_front_dispatcher_http(gw_front_t *fr, char *out, size_t len);

/* What this frontend's links carried (bytes, frame headers included):
 * the dispatcher's (metadata) and the workers' (rows and outputs). */
typedef struct {
    uint64_t link_in, link_out, data_in, data_out;
    uint64_t data_shm; /* rows' bytes workers on this host read from the arena */
    uint64_t items;    /* items offered */
    int joined;
} gw_front_traffic_t;
void gw_front_traffic(gw_front_t *fr, gw_front_traffic_t *out);
/* Those figures as exposition text (squish_frontend_*), appended to out. */
void gw_front_metrics_text(gw_front_t *fr, sq_buf_t *out);

#endif
