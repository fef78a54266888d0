/* common/dial.c: sq_dial_open, the dialing side's way in (TCP, TLS,
 * authentication) of remote workers and frontends, against a listener
 * thread that plays squishd's side of the authentication. */
#include <criterion/criterion.h>
#include <sq.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char token[] = "the cluster's token";

/* The listener's side of one handshake on fd: refuse_code 0 checks the
 * dialer's proof (ok: whether it verified); else it answers the challenge
 * with an ERROR of that code. */
typedef struct {
    int fd;
    int refuse_code;
    int ok;
} listener_t;

static void *listen_side(void *arg)
{
    listener_t *l = arg;
    int fl = fcntl(l->fd, F_GETFL);
    fcntl(l->fd, F_SETFL, fl | O_NONBLOCK);
    sq_conn_t c;
    sq_conn_init(&c, l->fd);
    sq_auth_t a;
    sq_buf_t b;
    sq_buf_init(&b);
    sq_frame_t f;
    cr_assert_eq(sq_auth_init(&a, SQ_AUTH_GATEWAY, token, strlen(token), NULL), 0);
    if (sq_conn_read_frame(&c, &f, 5000) == 1 && f.type == SQ_MSG_AUTH_CHALLENGE) {
        if (l->refuse_code != 0) {
            sq_ipc_error_t e = {.code = l->refuse_code};
            snprintf(e.message, sizeof(e.message), "go away");
            sq_ipc_error_encode(&b, &e);
            sq_conn_send(&c, SQ_MSG_ERROR, 0, b.data, (uint32_t)b.len);
        } else if (sq_auth_on_challenge(&a, f.payload, f.len, &b) == 0 &&
                   sq_conn_send(&c, SQ_MSG_AUTH_REPLY, 0, b.data, (uint32_t)b.len) == 0 &&
                   sq_conn_read_frame(&c, &f, 5000) == 1 && f.type == SQ_MSG_AUTH_PROOF) {
            l->ok = sq_auth_on_proof(&a, f.payload, f.len) == 0;
        }
        sq_conn_flush(&c);
    }
    sq_auth_wipe(&a);
    sq_buf_dispose(&b);
    sq_conn_dispose(&c);
    return NULL;
}

/* sq_dial_open on one end of a socketpair (fd given: no TCP dial), the
 * listener on the other; rc, and the step in *failed. */
static int dial_pair(const char *dialer_token, int refuse_code, sq_dial_step_t *failed, char *why,
                     size_t whylen, int *listener_ok)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    int fl = fcntl(sv[0], F_GETFL);
    fcntl(sv[0], F_SETFL, fl | O_NONBLOCK);
    listener_t l = {.fd = sv[1], .refuse_code = refuse_code};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, listen_side, &l), 0);
    sq_dial_opts_t o = {.token = (const uint8_t *)dialer_token,
                        .token_len = strlen(dialer_token),
                        .dial_timeout_ms = 1000,
                        .auth_timeout_ms = 5000};
    sq_conn_t c;
    int rc = sq_dial_open(&c, "127.0.0.1:1", sv[0], &o, failed, why, whylen);
    if (rc == 0) {
        cr_assert_eq(c.fd, sv[0], "the connection given is the one used");
        sq_conn_flush(&c);
    }
    pthread_join(th, NULL);
    if (rc == 0)
        sq_conn_dispose(&c);
    *listener_ok = l.ok;
    return rc;
}

Test(dial, the_same_token_on_both_sides_authenticates)
{
    sq_dial_step_t failed = SQ_DIAL_CONNECT;
    char why[256] = "";
    int ok;
    cr_assert_eq(dial_pair(token, 0, &failed, why, sizeof(why), &ok), 0, "%s", why);
    cr_assert_eq(failed, SQ_DIAL_OK);
    cr_assert(ok, "the listener verified the dialer's proof");
}

Test(dial, another_token_is_refused_by_the_dialer)
{
    sq_dial_step_t failed;
    char why[256] = "";
    int ok;
    cr_assert_eq(dial_pair("another token", 0, &failed, why, sizeof(why), &ok), SQ_UNAUTHORIZED);
    cr_assert_eq(failed, SQ_DIAL_AUTH, "this side refused the listener's proof");
    cr_assert(strncmp(why, "bad_proof", 9) == 0, "%s", why);
    cr_assert_not(ok);
}

Test(dial, the_listeners_refusal_says_whether_it_was_the_token)
{
    sq_dial_step_t failed;
    char why[256] = "";
    int ok;
    cr_assert_eq(dial_pair(token, SQ_UNAUTHORIZED, &failed, why, sizeof(why), &ok),
                 SQ_UNAUTHORIZED);
    cr_assert_eq(failed, SQ_DIAL_REFUSED);
    cr_assert_str_eq(why, "refused: go away");
    cr_assert_eq(dial_pair(token, SQ_PROTOCOL, &failed, why, sizeof(why), &ok), SQ_PROTOCOL,
                 "refused for something else: not the token's fault");
    cr_assert_eq(failed, SQ_DIAL_REFUSED);
}

/* The listener thread on a TCP listening socket: accepts one, then plays
 * its side. */
typedef struct {
    int lfd;
    listener_t l;
} acceptor_t;

static void *accept_side(void *arg)
{
    acceptor_t *a = arg;
    struct pollfd p = {.fd = a->lfd, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
        return NULL;
    a->l.fd = accept(a->lfd, NULL, NULL);
    return a->l.fd >= 0 ? listen_side(&a->l) : NULL;
}

Test(dial, over_tcp_on_loopback_and_a_port_nobody_listens_on)
{
    char bound[64], err[128];
    int lfd = sq_listen_tcp("127.0.0.1:0", bound, sizeof(bound), err, sizeof(err));
    cr_assert(lfd >= 0, "%s", err);
    sq_dial_opts_t o = {.token = (const uint8_t *)token,
                        .token_len = strlen(token),
                        .dial_timeout_ms = 1000,
                        .auth_timeout_ms = 5000};
    acceptor_t a = {.lfd = lfd, .l = {.fd = -1}};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, accept_side, &a), 0);
    sq_conn_t c;
    sq_dial_step_t failed;
    char why[256] = "";
    int rc = sq_dial_open(&c, bound, -1, &o, &failed, why, sizeof(why));
    if (rc == 0)
        sq_conn_flush(&c);
    pthread_join(th, NULL);
    cr_assert_eq(rc, 0, "%s", why);
    cr_assert_eq(failed, SQ_DIAL_OK);
    cr_assert(a.l.ok, "the listener verified the dialer's proof");
    sq_conn_dispose(&c);
    close(lfd);
    /* The port is free again: nobody listens. */
    cr_assert_lt(sq_dial_open(&c, bound, -1, &o, &failed, why, sizeof(why)), 0);
    cr_assert_eq(failed, SQ_DIAL_CONNECT);
    cr_assert(strncmp(why, "cannot connect: ", 16) == 0, "%s", why);
}
