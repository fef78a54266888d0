/* squish-bare-h2o: the baseline of the gateway-overhead benchmark. The same
 * HTTP stack as squishd (libh2o-evloop 2.2, the same event-loop-per-thread
 * setup as gateway/http.c, one shared listening socket) with nothing behind
 * it: every request's body is read in full by h2o, and the answer is 200
 * with a small JSON body of --reply-bytes (about the size of squishd's
 * top-k answer). What squishd does beyond this (routing, SLO bookkeeping,
 * JPEG decode, dispatch, the worker round trip) is its overhead.
 *
 *   squish-bare-h2o [--listen 127.0.0.1:0] [--port-file F] [--threads N]
 *                   [--reply-bytes N] */
#include <arpa/inet.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <h2o.h>
#include <sq_text.h>

typedef struct {
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    h2o_socket_t *listener;
    pthread_t thread;
    h2o_globalconf_t *config;
    int fd; /* its own dup of the listening socket */
} bare_thread_t;

static char *reply;
static size_t reply_len;

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    /* h2o has buffered the whole body (req->entity) before calling us. */
    if (!h2o_memis(req->method.base, req->method.len, H2O_STRLIT("POST")) ||
        req->entity.base == NULL)
        return -1;
    req->res.status = 200;
    req->res.reason = "OK";
    req->res.content_length = reply_len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("application/json"));
    h2o_send_inline(req, reply, reply_len);
    return 0;
}

static void on_accept(h2o_socket_t *listener, const char *err)
{
    bare_thread_t *t = listener->data;
    h2o_socket_t *sock;
    if (err != NULL || (sock = h2o_evloop_socket_accept(listener)) == NULL)
        return;
    h2o_accept(&t->accept_ctx, sock);
}

/* As gateway/http.c: each thread creates its own loop, context and
 * listener (libh2o's socket buffers recycle into per-thread lists). */
static void *loop_thread(void *arg)
{
    bare_thread_t *t = arg;
    h2o_context_init(&t->ctx, h2o_evloop_create(), t->config);
    t->accept_ctx.ctx = &t->ctx;
    t->accept_ctx.hosts = t->config->hosts;
    t->listener = h2o_evloop_socket_create(t->ctx.loop, t->fd, H2O_SOCKET_FLAG_DONT_READ);
    t->listener->data = t;
    h2o_socket_read_start(t->listener, on_accept);
    for (;;)
        h2o_evloop_run(t->ctx.loop, INT32_MAX);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *listen_at = "127.0.0.1:0", *port_file = NULL;
    int nthreads = 1;
    long reply_bytes = 400;
    static const struct option longopts[] = {{"listen", required_argument, 0, 'l'},
                                             {"port-file", required_argument, 0, 'f'},
                                             {"threads", required_argument, 0, 't'},
                                             {"reply-bytes", required_argument, 0, 'r'},
                                             {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (ch) {
        case 'l':
            listen_at = optarg;
            break;
        case 'f':
            port_file = optarg;
            break;
        case 't':
            nthreads = atoi(optarg);
            break;
        case 'r':
            reply_bytes = atol(optarg);
            break;
        default:
            fprintf(stderr, "usage: squish-bare-h2o [--listen HOST:PORT] [--port-file F] "
                            "[--threads N] [--reply-bytes N]\n");
            return 2;
        }
    }
    char host[64];
    int port;
    struct sockaddr_in sin = {.sin_family = AF_INET};
    if (sq_hostport_split(listen_at, host, sizeof(host), &port) != 0 || nthreads < 1 ||
        nthreads > 64 || reply_bytes < 16 || reply_bytes > 1 << 20) {
        fprintf(stderr, "squish-bare-h2o: bad arguments\n");
        return 2;
    }
    sin.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sin.sin_addr) != 1) {
        fprintf(stderr, "squish-bare-h2o: --listen %s: expected IPv4:PORT\n", listen_at);
        return 2;
    }

    /* {"ok":true,"pad":"xxx..."} of exactly reply_bytes, newline included. */
    reply_len = (size_t)reply_bytes;
    reply = malloc(reply_len + 1);
    if (reply == NULL)
        return 1;
    int head = snprintf(reply, reply_len + 1, "{\"ok\":true,\"pad\":\"");
    memset(reply + head, 'x', reply_len - (size_t)head - 3);
    memcpy(reply + reply_len - 3, "\"}\n", 3);

    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 || listen(fd, SOMAXCONN) != 0) {
        perror("squish-bare-h2o: listen");
        return 1;
    }
    socklen_t sl = sizeof(sin);
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    printf("listening on %s:%d\n", host, ntohs(sin.sin_port));
    fflush(stdout);
    if (port_file != NULL) {
        char tmp[512];
        snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (f == NULL || fprintf(f, "%d\n", ntohs(sin.sin_port)) < 0 || fclose(f) != 0 ||
            rename(tmp, port_file) != 0) {
            perror("squish-bare-h2o: --port-file");
            return 1;
        }
    }

    static h2o_globalconf_t config;
    h2o_config_init(&config);
    config.max_request_entity_size = 64 << 20;
    h2o_hostconf_t *hostconf =
        h2o_config_register_host(&config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *path = h2o_config_register_path(hostconf, "/", 0);
    h2o_handler_t *handler = h2o_create_handler(path, sizeof(*handler));
    handler->on_req = on_req;

    bare_thread_t *threads = calloc((size_t)nthreads, sizeof(*threads));
    if (threads == NULL)
        return 1;
    for (int i = 0; i < nthreads; i++) {
        threads[i].config = &config;
        threads[i].fd = i == 0 ? fd : dup(fd);
    }
    for (int i = 1; i < nthreads; i++)
        pthread_create(&threads[i].thread, NULL, loop_thread, &threads[i]);
    loop_thread(&threads[0]); /* runs until killed */
    return 0;
}
