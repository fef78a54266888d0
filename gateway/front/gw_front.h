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

/* Starts the frontend's thread, which joins the dispatcher (cfg->dispatcher,
 * each address in turn, with the cluster token and TLS settings) and keeps
 * rejoining while squishd runs; srv->front is set. Returns 0 or an SQ_*
 * error with a reason in err (the token file). */
int gw_front_start(gw_server_t *srv, char *err, size_t errlen);
/* Answers every item still held 503 (squishd stops), then stops the thread. */
void gw_front_stop(gw_server_t *srv);
void gw_front_free(gw_server_t *srv);

/* The frontend as this process's scheduler (gw_sched_t), picked by
 * server.c for --role frontend: items (a clump through clump_next) offered
 * to the dispatcher, abandoned items withdrawn there; readiness and held
 * models as the dispatcher last said them (and whether this frontend is
 * joined to one); the serving kind from the fleet it last said; the least
 * latency on the profiles the dispatcher plans with (live-corrected, sent
 * in FE_STATE; the measured ones where it sent none). */
gw_sched_t *gw_front_sched(gw_front_t *fr);
/* The dispatcher's HTTP address ("host:port"; "" before it is joined). */
void gw_front_dispatcher_http(gw_server_t *srv, char *out, size_t len);

/* What this frontend's links carried (bytes, frame headers included):
 * the dispatcher's (metadata) and the workers' (rows and outputs). */
typedef struct {
    uint64_t link_in, link_out, data_in, data_out;
    uint64_t data_shm; /* rows' bytes workers on this host read from the arena */
    uint64_t items;    /* items offered */
    int joined;
} gw_front_traffic_t;
void gw_front_traffic(gw_server_t *srv, gw_front_traffic_t *out);
/* Those figures as exposition text (squish_frontend_*), appended to out. */
void gw_front_metrics_text(gw_server_t *srv, sq_buf_t *out);

#endif
