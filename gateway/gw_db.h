/* The DB thread (dbthread.c): owns the model DB handle; the HTTP loops and
 * the dispatch thread post jobs to it and never touch the DB themselves. */
#ifndef GW_DB_H
#define GW_DB_H

#include "gw_server.h"

#include <mdb.h>

int gw_db_start(gw_server_t *srv, char *err, size_t errlen);
/* Runs fn(db, arg) on the DB thread. */
void gw_db_post(gw_server_t *srv, void (*fn)(mdb_t *db, void *arg), void *arg);
void gw_db_stop(gw_server_t *srv);
/* Waits until every job posted so far has run (their answers to HTTP
 * requests are on their way before the HTTP loops stop). */
void gw_db_quiesce(gw_server_t *srv);

#endif
