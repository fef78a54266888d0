/* A frontend's connection to the dispatcher: joining it (FE_HELLO,
 * FE_WELCOME), reading its frames, sending to it, and leaving it. */
#include "front_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void on_fail(gw_front_t *fr, const sq_frame_t *f)
{
    sq_fe_fail_t fail;
    uint32_t idx;
    if (sq_fe_fail_decode(f, &fail) != 0) {
        SQ_WARN("malformed FE_FAIL from the dispatcher");
        return;
    }
    if (fr_slot_item(fr, f->id, &idx) != NULL)
        fr_answer_slot(fr, idx, fail.code, fail.detail);
}

void fr_send_dispatcher(gw_front_t *fr, uint16_t type, uint64_t id, const void *p, uint32_t len)
{
    if (!fr->joined)
        return;
    if (sq_conn_send(&fr->conn, type, id, p, len) < 0) {
        fr_leave(fr, "write_error");
        return;
    }
    atomic_fetch_add(&fr->link_out, (uint64_t)len + SQ_IPC_HEADER_SIZE);
    if (sq_conn_pending(&fr->conn))
        sq_loop_modify(fr->loop, fr->conn.fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* Handles the frames buffered on the dispatcher's connection; 0, or -1
 * when it was left. */
static int dispatcher_frames(gw_front_t *fr)
{
    sq_frame_t f;
    int rc;
    while (fr->joined && (rc = sq_conn_next(&fr->conn, &f)) == 1) {
        atomic_fetch_add(&fr->link_in, (uint64_t)f.len + SQ_IPC_HEADER_SIZE);
        switch (f.type) {
        case SQ_MSG_FE_CATALOG:
            fr_on_catalog(fr, &f);
            break;
        case SQ_MSG_FE_STATE:
            fr_on_state(fr, &f);
            break;
        case SQ_MSG_FE_ASSIGN:
            fr_on_assign(fr, &f);
            break;
        case SQ_MSG_FE_FAIL:
            on_fail(fr, &f);
            break;
        case SQ_MSG_PING:
            fr_send_dispatcher(fr, SQ_MSG_PONG, f.id, f.payload, f.len);
            break;
        case SQ_MSG_SHUTDOWN:
            fr_leave(fr, "the dispatcher is stopping");
            return -1;
        case SQ_MSG_ERROR: {
            sq_ipc_error_t e;
            if (sq_ipc_error_decode(&f, &e) == 0)
                SQ_WARN("dispatcher error code=%s message=\"%s\"", sq_err_name(e.code), e.message);
            break;
        }
        default:
            SQ_WARN("unexpected message from the dispatcher type=%s", sq_msg_name(f.type));
            fr_leave(fr, "protocol_error");
            return -1;
        }
    }
    if (!fr->joined)
        return -1;
    if (rc < 0) {
        fr_leave(fr, "bad_frame");
        return -1;
    }
    return 0;
}

static void on_dispatcher_io(sq_loop_t *loop, int fd, int events, void *data)
{
    gw_front_t *fr = data;
    if (events & SQ_EV_WRITE) {
        int rc = sq_conn_flush(&fr->conn);
        if (rc < 0) {
            fr_leave(fr, "write_error");
            return;
        }
        sq_loop_modify(loop, fd, SQ_EV_READ | (rc == 1 ? SQ_EV_WRITE : 0));
    }
    if (!(events & SQ_EV_READ))
        return;
    int rc = sq_conn_read(&fr->conn);
    if (rc == 0 || (rc < 0 && rc != -EAGAIN)) {
        fr_leave(fr, rc == 0 ? "eof" : "read_error");
        return;
    }
    fr->last_heard_ns = sq_now_ns();
    if (dispatcher_frames(fr) == 0 && sq_conn_pending(&fr->conn))
        sq_loop_modify(loop, fd, SQ_EV_READ | SQ_EV_WRITE);
}

/* ---- joining and leaving ----------------------------------------------------- */

/* One try at the next dispatcher address: connect, authenticate, FE_HELLO,
 * FE_WELCOME. 0 when joined. */
int fr_join(gw_front_t *fr)
{
    const char *addr = fr->addrs[fr->next_addr];
    fr->next_addr = (fr->next_addr + 1) % fr->naddrs;
    sq_dial_opts_t o = {.tls = fr->tls,
                        .token = fr->token,
                        .token_len = fr->token_len,
                        .dial_timeout_ms = DIAL_TIMEOUT_MS,
                        .auth_timeout_ms = HANDSHAKE_TIMEOUT_MS};
    char why[256] = "";
    sq_dial_step_t failed;
    int rc = sq_dial_open(&fr->conn, addr, -1, &o, &failed, why, sizeof(why));
    if (failed == SQ_DIAL_CONNECT) {
        SQ_DEBUG("cannot reach the dispatcher addr=%s error=\"%s\"", addr, strerror(-rc));
        return -1;
    }
    if (rc != 0) {
        SQ_WARN("cannot join the dispatcher addr=%s reason=\"%s\"", addr, why);
        return -1;
    }
    int fd = fr->conn.fd;
    sq_frame_t f;
    sq_fe_hello_t h = {.version = GW_FE_HELLO_VERSION};
    char host[48] = "";
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = '\0';
    snprintf(h.name, sizeof(h.name), "%s:%d", host, atomic_load(fr->http_port));
    fr->scratch.len = 0;
    sq_fe_hello_encode(&fr->scratch, &h);
    rc = sq_conn_send(&fr->conn, SQ_MSG_FE_HELLO, 0, fr->scratch.data, (uint32_t)fr->scratch.len);
    if (rc == 0)
        rc = sq_conn_read_frame(&fr->conn, &f, HANDSHAKE_TIMEOUT_MS);
    if (rc < 0)
        snprintf(why, sizeof(why), "no FE_WELCOME: %s", sq_err_msg(rc));
    sq_fe_welcome_t wel;
    if (rc == 1 && f.type == SQ_MSG_ERROR) {
        sq_ipc_error_t e;
        snprintf(why, sizeof(why), "refused: %s",
                 sq_ipc_error_decode(&f, &e) == 0 ? e.message : "?");
        rc = SQ_UNAUTHORIZED;
    } else if (rc == 1 && sq_fe_welcome_decode(&f, &wel) != 0) {
        snprintf(why, sizeof(why), "expected FE_WELCOME, got %s", sq_msg_name(f.type));
        rc = SQ_PROTOCOL;
    }
    if (rc == 1 &&
        sq_loop_watch(fr->loop, fd, SQ_EV_READ | SQ_EV_WRITE, on_dispatcher_io, fr) != 0) {
        snprintf(why, sizeof(why), "cannot watch the connection");
        rc = SQ_IO;
    }
    if (rc != 1) {
        SQ_WARN("cannot join the dispatcher addr=%s reason=\"%s\"", addr, why);
        sq_conn_dispose(&fr->conn);
        return -1;
    }
    fr->joined = 1;
    fr->fe_id = (int)wel.frontend;
    fr->heartbeat_ms = wel.heartbeat_ms > 0 ? wel.heartbeat_ms : 200;
    /* The dispatcher's HTTP: on a wildcard address, at the address this
     * connection reached (not the name dialed: a name that resolves to the
     * leader and its standbys would reach a standby as often). */
    char ahost[128], dhost[INET6_ADDRSTRLEN] = "";
    int aport = 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        inet_ntop(ss.ss_family,
                  ss.ss_family == AF_INET6 ? (void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
                                           : (void *)&((struct sockaddr_in *)&ss)->sin_addr,
                  dhost, sizeof(dhost));
    if (sq_hostport_split(wel.admin, ahost, sizeof(ahost), &aport) == 0 &&
        (strcmp(ahost, "0.0.0.0") == 0 || strcmp(ahost, "::") == 0 || ahost[0] == '\0') &&
        dhost[0] != '\0')
        snprintf(wel.admin, sizeof(wel.admin), strchr(dhost, ':') != NULL ? "[%s]:%d" : "%s:%d",
                 dhost, aport);
    pthread_mutex_lock(&fr->lock);
    snprintf(fr->admin, sizeof(fr->admin), "%s", wel.admin);
    pthread_mutex_unlock(&fr->lock);
    fr->last_heard_ns = sq_now_ns();
    sq_backoff_reset(&fr->rejoin);
    SQ_INFO("joined the dispatcher addr=%s frontend=%d dispatcher_http=%s", addr, fr->fe_id,
            fr->admin);
    dispatcher_frames(fr); /* what came with FE_WELCOME */
    return 0;
}

/* The dispatcher is gone (or stopping): every item held is answered 503
 * now (its client retries; a standby that takes over gets it), the data
 * connections close (they carry this frontend id, which goes with the
 * dispatcher), and readiness says why until it is joined again. */
void fr_leave(gw_front_t *fr, const char *why)
{
    if (!fr->joined)
        return;
    fr->joined = 0;
    fr->npend = 0;
    sq_loop_unwatch(fr->loop, fr->conn.fd);
    sq_conn_dispose(&fr->conn);
    char detail[200];
    snprintf(detail, sizeof(detail), "this frontend lost its dispatcher (%s); retry", why);
    int n = 0;
    for (uint32_t i = 0; i < fr->nslots; i++)
        if (fr->slots[i].item != NULL) {
            fr_answer_slot(fr, i, SQ_NOT_READY, detail);
            n++;
        }
    while (fr->data != NULL)
        fr_data_close(fr, fr->data, "left the dispatcher");
    pthread_mutex_lock(&fr->lock);
    fr_live_t *live = fr->live; /* the next dispatcher publishes its own */
    int nlive = fr->nlive;
    fr->live = NULL;
    fr->nlive = 0;
    fr_fleet_clear(&fr->fleet);
    fr->ready = 0;
    fr->admin[0] = '\0';
    snprintf(fr->why, sizeof(fr->why), "this frontend has no dispatcher (%s)", why);
    pthread_mutex_unlock(&fr->lock);
    fr_live_free(live, nlive);
    SQ_LOG(fr->stopping ? SQ_LOG_INFO : SQ_LOG_WARN,
           "left the dispatcher reason=\"%s\" items_failed=%d", why, n);
    fr->rejoin_at_ns = sq_now_ns();
}
