/* Leadership among squishd processes that share one PostgreSQL model DB
 * (leader.c). Exactly one leads: it holds a PostgreSQL advisory lock on a
 * connection of its own, serves, and has workers; the others are standbys.
 * A standby answers HTTP (live 200; ready and everything else 503
 * {"code": "standby", "leader": ADDR} with Retry-After) and tries the lock
 * every --leader-timeout-ms / 10. The lock goes with the leader's DB
 * session: when the leader dies PostgreSQL ends the session (at once for a
 * dead process; within about half of --leader-timeout-ms for a host cut
 * off, by the session's TCP keepalives and user timeout) and a standby
 * takes it, then starts as squishd does: reads the models, reapplies the
 * last stored plan, and accepts the workers that reconnect to it.
 *
 * Why PostgreSQL's advisory lock and not an etcd lease: the model DB is
 * already the one store every squishd must reach to serve at all, so
 * leading means holding something in it; a second engine would add a
 * second thing that can fail and a split between "leads" and "can read the
 * models". With sqlite (one host) there is no standby: squishd leads. */
#ifndef GW_LEADER_H
#define GW_LEADER_H

#include "gw_http.h"
#include "gw_server.h"

#include <signal.h>
#include <stdatomic.h>

/* The lock's key: "squishd" in ASCII. */
#define GW_LEADER_LOCK_KEY 0x73717569736864LL

/* Exit status of a leader that found its lock taken by another squishd
 * (its DB session was lost meanwhile): it stops serving at once. */
#define GW_EXIT_LOST_LEADERSHIP 3

/* Leadership's settings, copied once from gw_config_t (server.c). */
typedef struct {
    char db_path[256];     /* --db: leadership is PostgreSQL's alone */
    int leader_timeout_ms; /* a standby takes over within this */
    char advertise[128];   /* the address standbys give clients ("" = from listen_host) */
    char listen_host[64];  /* --listen's host, for that address */
} gw_leader_config_t;

/* What leadership is given (server.c fills it, gw_leader_deps): its
 * settings and the server's facts it writes or reads, through the
 * pointers given. */
typedef struct {
    gw_leader_config_t cfg;
    atomic_int *leading;         /* set once this squishd leads (read by its standby routes) */
    const atomic_int *http_port; /* the bound port, for the announced address */
    gw_http_t **http;            /* the server's HTTP slot: the standby's room goes there */
} gw_leader_deps_t;

/* Leadership's settings and facts from srv's (server.c, which wires the
 * rooms). */
gw_leader_deps_t gw_leader_deps(gw_server_t *srv);

/* Makes leadership (*out, freed by gw_leader_close) and, for a PostgreSQL
 * model DB, opens its connection; with sqlite it holds none and squishd
 * leads. */
int gw_leader_open(const gw_leader_deps_t *deps, gw_leader_t **out, char *err, size_t errlen);
/* Returns 0 once this squishd leads (at once with sqlite or a free lock),
 * serving as a standby meanwhile (HTTP started with http, in the HTTP
 * slot); 1 when one of sigs came first (then the standby's HTTP has
 * stopped and the slot is NULL again), or an error. */
int gw_leader_wait(gw_leader_t *l, const gw_http_deps_t *http, const sigset_t *sigs, char *err,
                   size_t errlen);
/* The leader's watchdog thread: checks the lock every poll interval and
 * exits the process (GW_EXIT_LOST_LEADERSHIP) when another squishd holds
 * it. */
int gw_leader_watch(gw_leader_t *l);
/* Names this squishd's address (--advertise, or its listener's) for the
 * standbys to give clients; once HTTP listens. */
void gw_leader_announce(gw_leader_t *l);
/* Stops the watchdog, closes the connection (which releases the lock) and
 * frees l; accepts NULL. After the HTTP room stopped (a standby's routes
 * read l). */
void gw_leader_close(gw_leader_t *l);

#endif
