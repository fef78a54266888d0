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

/* The lock's key: "squishd" in ASCII. */
#define GW_LEADER_LOCK_KEY 0x73717569736864LL

/* Exit status of a leader that found its lock taken by another squishd
 * (its DB session was lost meanwhile): it stops serving at once. */
#define GW_EXIT_LOST_LEADERSHIP 3

/* Opens the leadership connection for a PostgreSQL model DB (none for
 * sqlite: srv->leader stays NULL and squishd leads). */
int gw_leader_open(gw_server_t *srv, char *err, size_t errlen);
/* Returns 0 once this squishd leads (at once with sqlite or a free lock),
 * serving as a standby meanwhile (HTTP started with http, in srv->http);
 * 1 when one of sigs came first (then the standby's HTTP has stopped), or
 * an error. */
int gw_leader_wait(gw_server_t *srv, const gw_http_deps_t *http, const sigset_t *sigs, char *err,
                   size_t errlen);
/* The leader's watchdog thread: checks the lock every poll interval and
 * exits the process (GW_EXIT_LOST_LEADERSHIP) when another squishd holds
 * it. */
int gw_leader_watch(gw_server_t *srv);
/* Names this squishd's address (--advertise, or its listener's) for the
 * standbys to give clients; once HTTP listens. */
void gw_leader_announce(gw_server_t *srv);
/* Stops the watchdog and closes the connection (which releases the lock).
 * Accepts a server without one. */
void gw_leader_close(gw_server_t *srv);

#endif
