/* squish-worker: owns one device, talks to squishd over a UNIX socket, or
 * over TCP from another host:
 *
 *   squish-worker --connect /path/to/squishd.sock --device emu:0
 *   squish-worker --connect tcp://10.0.0.1:7100 [--connect tcp://...] \
 *                 --cluster-token-file token --device cpu
 *
 * A TCP worker authenticates (sq_auth.h), tries its addresses in turn and,
 * when the connection ends (squishd restarted, the network dropped), keeps
 * its models and reconnects with exponential backoff, capped.
 *
 * With --data-listen HOST:PORT (either kind of worker), frontends dial the
 * worker there with the batches' rows they hold (serve_data.c); they prove
 * --cluster-token-file's token, and with --cluster-tls-* the listener
 * speaks TLS with the same certificate.
 *
 * Exit status: 0 after SHUTDOWN or when squishd goes away, 1 on a protocol
 * or I/O error, 2 on bad usage, WK_EXIT_DEVICE_UNAVAILABLE (3) when the
 * device cannot be used. */
#include "wk.h"
#include "wk_serve.h"

#include <sq.h>
#include <sq_config.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_ADDRS 8
#define CONNECT_TIMEOUT_MS 3000

typedef struct {
    sq_conn_t conn;
    wk_device_t dev;
    uint32_t worker_id;
    uint8_t *shm;
    size_t shm_bytes;
    /* TCP */
    char addrs[MAX_ADDRS][256]; /* "HOST:PORT" */
    int naddrs;
    uint8_t token[SQ_AUTH_MAX_TOKEN];
    size_t token_len;
    int backoff_max_ms;
    sq_tls_t *tls; /* --cluster-tls-*, or NULL */
    int joined;    /* ever: an authentication refused before is fatal */
    int connected;
    uint32_t heartbeat_ms;
    int stop_fd; /* signalfd of SIGTERM and SIGINT */
} worker_t;

/* The flags, as one table (common/sq_opts.h, as squishd's). */
typedef struct {
    char socket[256];           /* --connect PATH */
    char addrs[MAX_ADDRS][256]; /* --connect tcp://HOST:PORT, as HOST:PORT */
    int naddrs;
    char device[64];
    int memory_mb; /* 0: the device's own */
    int threads;
    sq_log_level_t log_level;
    char token_file[4096];
    char host_name[64];
    int reconnect_max_ms;
    int kept_models_ms;
    char tls_cert[4096], tls_key[4096], tls_ca[4096];
    char data_listen[80], data_advertise[80];
} flags_t;

/* --connect: a UNIX socket path, or tcp://HOST:PORT (repeatable: tried in
 * turn). */
static int parse_connect(void *base, const sq_opt_t *o, const char *v, char *why, size_t len)
{
    flags_t *f = base;
    if (strncmp(v, "tcp://", 6) != 0) {
        if (f->socket[0] != '\0') {
            snprintf(why, len, "one UNIX socket at most");
            return -1;
        }
        if (strlen(v) >= sizeof(f->socket)) {
            snprintf(why, len, "longer than %zu characters", sizeof(f->socket) - 1);
            return -1;
        }
        snprintf(f->socket, sizeof(f->socket), "%s", v);
        return 0;
    }
    char host[256];
    int port;
    if (f->naddrs == MAX_ADDRS || strlen(v + 6) >= sizeof(f->addrs[0])) {
        snprintf(why, len, "at most %d addresses", MAX_ADDRS);
        return -1;
    }
    if (sq_hostport_split(v + 6, host, sizeof(host), &port) != 0) {
        snprintf(why, len, "expected tcp://HOST:PORT or tcp://[IPV6]:PORT, got '%s'", v);
        return -1;
    }
    snprintf(f->addrs[f->naddrs++], sizeof(f->addrs[0]), "%s", v + 6);
    return 0;
}

#define FSTR(f) SQ_OPT_STR, offsetof(flags_t, f), sizeof(((flags_t *)0)->f)
#define FINT(f) SQ_OPT_INT, offsetof(flags_t, f), sizeof(int)
#define STR_(x) #x
#define STR(x) STR_(x)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const sq_opt_t flag_table[] = {
    {"connect", SQ_OPT_CUSTOM, 0, 0, 0, 0, "",
     "squishd's worker socket, or tcp://HOST:PORT of its --cluster-listen on another host "
     "(repeatable: tried in turn; the worker reconnects when it loses it)",
     parse_connect},
    {"device", FSTR(device), 0, 0, "", "the device this worker owns: cpu, cuda:N or emu:N"},
    {"memory_mb", FINT(memory_mb), 0, 1 << 30, "0",
     "memory to report for an emulated device (0: 16384)"},
    {"threads", FINT(threads), 0, 1024, "0", "cpu kernel threads (0: every core)"},
    {"log_level", SQ_OPT_LOGLEVEL, offsetof(flags_t, log_level), 0, 0, 0, "info",
     "debug|info|warn|error|off"},
    {"cluster_token_file", FSTR(token_file), 0, 0, "",
     "the token squishd's --cluster-token-file holds (tcp://)"},
    {"host_name", FSTR(host_name), 0, 0, "",
     "this host's name in the device (cpu@NAME; default: the hostname)"},
    {"reconnect_max_ms", FINT(reconnect_max_ms), 100, 600000, "5000",
     "longest wait between reconnection rounds (tcp://)"},
    {"kept_models_ms", FINT(kept_models_ms), 100, 86400000, STR(WK_KEPT_MODELS_MS),
     "after a reconnect, drop the models squishd has not loaded again within this"},
    {"cluster_tls_cert", FSTR(tls_cert), 0, 0, "",
     "TLS to squishd (its --cluster-tls-*): this worker's certificate (PEM)"},
    {"cluster_tls_key", FSTR(tls_key), 0, 0, "", "its private key (PEM)"},
    {"cluster_tls_ca", FSTR(tls_ca), 0, 0, "", "the CA squishd's certificate must chain to (PEM)"},
    {"data_listen", FSTR(data_listen), 0, 0, "",
     "ADDR:PORT or [IPV6]:PORT where frontends send batches' rows (port 0: any; needs "
     "--cluster-token-file)"},
    {"data_advertise", FSTR(data_advertise), 0, 0, "",
     "HOST:PORT squishd tells frontends to dial (default: the bound address, a wildcard host "
     "replaced by this end of the link to squishd)"},
};
#pragma GCC diagnostic pop

static const sq_opts_spec_t flag_spec = {
    .opts = flag_table,
    .nopts = sizeof(flag_table) / sizeof(flag_table[0]),
};

static void usage(FILE *f)
{
    fprintf(f, "usage: squish-worker --connect SOCKET|tcp://HOST:PORT --device cpu|cuda:N|emu:N "
               "[options]\n\n");
    sq_opts_usage(&flag_spec, f);
}

/* The data listener (--data-listen): a non-blocking TCP socket bound to
 * spec (numeric, IPv4 or [IPv6]) and the address it got ("[::]:4711").
 * Returns the fd, or -1 with err. */

static int connect_unix(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* A cuda device is served by squish-worker-cuda, beside this binary, with
 * the same arguments (and the descriptors they name): this one has no
 * CUDA libraries in it (cuda_absent.c says why). Returns only when it
 * cannot be run. */
static int exec_cuda_worker(char **argv)
{
    char self[PATH_MAX], path[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL)
            slash[1] = '\0';
        snprintf(path, sizeof(path), "%ssquish-worker-cuda", slash != NULL ? self : "");
        execv(path, argv);
    } else {
        snprintf(path, sizeof(path), "squish-worker-cuda");
    }
    SQ_ERROR("device unavailable reason=\"cannot run %s: %s\"", path, strerror(errno));
    return WK_EXIT_DEVICE_UNAVAILABLE;
}

/* HELLO: this worker's protocol, device and memory. */
static int send_hello(worker_t *w)
{
    sq_hello_t hello = {.magic = SQ_IPC_MAGIC,
                        .version = SQ_IPC_VERSION,
                        .memory_bytes = w->dev.memory_bytes,
                        .pid = (uint32_t)getpid()};
    snprintf(hello.kind, sizeof(hello.kind), "%s", sq_dev_kind_name(w->dev.kind));
    snprintf(hello.name, sizeof(hello.name), "%s", w->dev.name);
    sq_buf_t b;
    sq_buf_init(&b);
    sq_hello_encode(&b, &hello);
    int rc = sq_conn_send(&w->conn, SQ_MSG_HELLO, 0, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
    return rc;
}

static int handshake(worker_t *w)
{
    int rc = send_hello(w);
    if (rc < 0)
        return rc;

    sq_frame_t f;
    if ((rc = sq_conn_read_frame(&w->conn, &f, 10000)) < 0)
        return rc;
    if (f.type == SQ_MSG_ERROR) {
        sq_ipc_error_t e;
        if (sq_ipc_error_decode(&f, &e) == 0)
            SQ_ERROR("squishd refused the handshake code=%s reason=\"%s\"", sq_err_name(e.code),
                     e.message);
        return SQ_PROTOCOL;
    }
    sq_welcome_t wel;
    if (sq_welcome_decode(&f, &wel) < 0 || wel.version != SQ_IPC_VERSION)
        return SQ_PROTOCOL;
    int shm_fd = sq_conn_take_fd(&w->conn);
    if (shm_fd < 0) {
        SQ_ERROR("WELCOME came without the shared-memory fd");
        return SQ_PROTOCOL;
    }
    w->shm = sq_shm_map(shm_fd, wel.shm_bytes);
    close(shm_fd);
    if (w->shm == NULL) {
        SQ_ERROR("cannot map the shared-memory arena bytes=%llu",
                 (unsigned long long)wel.shm_bytes);
        return SQ_NOMEM;
    }
    w->shm_bytes = wel.shm_bytes;
    w->worker_id = wel.worker_id;
    SQ_INFO("joined squishd worker_id=%u device=%s memory_mb=%llu heartbeat_ms=%u", wel.worker_id,
            w->dev.name, (unsigned long long)(w->dev.memory_bytes >> 20), wel.heartbeat_ms);
    return 0;
}

/* Reports squishd's ERROR, if f is one. */
static int refused_by_squishd(const sq_frame_t *f, int *auth)
{
    if (f->type != SQ_MSG_ERROR)
        return 0;
    sq_ipc_error_t e;
    if (sq_ipc_error_decode(f, &e) == 0) {
        SQ_ERROR("squishd refused the handshake code=%s reason=\"%s\"", sq_err_name(e.code),
                 e.message);
        *auth = e.code == SQ_UNAUTHORIZED;
    }
    return 1;
}

/* Refused by squishd or refusing it (authentication). */
#define REFUSED 1

/* HELLO (after MODELS_HELD) and WELCOME on an authenticated connection. */
static int remote_hello(worker_t *w, const sq_buf_t *held)
{
    int rc = sq_conn_send(&w->conn, SQ_MSG_MODELS_HELD, 0, held->data, (uint32_t)held->len);
    if (rc < 0)
        return rc;
    rc = send_hello(w);
    sq_frame_t f;
    if (rc == 0)
        rc = sq_conn_read_frame(&w->conn, &f, 10000);
    if (rc < 0)
        return rc;
    int auth = 0;
    if (refused_by_squishd(&f, &auth))
        return auth ? REFUSED : SQ_PROTOCOL;
    sq_welcome_t wel;
    if (sq_welcome_decode(&f, &wel) < 0 || wel.version != SQ_IPC_VERSION)
        return SQ_PROTOCOL;
    w->worker_id = wel.worker_id;
    w->heartbeat_ms = wel.heartbeat_ms;
    return 0;
}

/* wk_serve's reconnect: each address in turn, rounds apart by a backoff
 * that doubles up to backoff_max_ms. Gives up only when squishd refused
 * the authentication before this worker ever joined (a wrong token does
 * not fix itself); after that, it keeps trying. */
static int reconnect(void *ctx, const sq_buf_t *held, sq_conn_t **conn, uint32_t *heartbeat_ms)
{
    worker_t *w = ctx;
    if (w->connected) {
        sq_conn_dispose(&w->conn);
        w->connected = 0;
    }
    sq_backoff_t backoff;
    sq_backoff_init(&backoff, 100, w->backoff_max_ms);
    for (;;) {
        int refused = 0;
        for (int i = 0; i < w->naddrs; i++) {
            struct pollfd stop = {.fd = w->stop_fd, .events = POLLIN};
            if (w->stop_fd >= 0 && poll(&stop, 1, 0) > 0) {
                SQ_INFO("stopping on a signal");
                return 1;
            }
            /* Dial, TLS, authentication (either side refusing the other
             * is REFUSED: a wrong token does not fix itself). */
            sq_dial_opts_t o = {.tls = w->tls,
                                .token = w->token,
                                .token_len = w->token_len,
                                .dial_timeout_ms = CONNECT_TIMEOUT_MS,
                                .auth_timeout_ms = 10000};
            sq_dial_step_t failed;
            char why[256] = "";
            int rc = sq_dial_open(&w->conn, w->addrs[i], -1, &o, &failed, why, sizeof(why));
            if (failed == SQ_DIAL_CONNECT) {
                SQ_WARN("cannot connect addr=%s error=\"%s\"", w->addrs[i], strerror(-rc));
                continue;
            }
            if (rc == SQ_UNAUTHORIZED) {
                if (failed == SQ_DIAL_REFUSED)
                    SQ_ERROR("squishd refused the handshake addr=%s reason=\"%s\"", w->addrs[i],
                             why);
                else
                    SQ_ERROR("refusing squishd reason=\"%s\"", why);
                refused = 1;
                continue;
            }
            if (rc != 0) {
                SQ_WARN("handshake failed addr=%s error=\"%s\"", w->addrs[i], why);
                continue;
            }
            rc = remote_hello(w, held);
            if (rc == 0) {
                w->connected = 1;
                w->joined = 1;
                *conn = &w->conn;
                *heartbeat_ms = w->heartbeat_ms;
                SQ_INFO("joined squishd addr=%s worker_id=%u device=%s memory_mb=%llu", w->addrs[i],
                        w->worker_id, w->dev.name, (unsigned long long)(w->dev.memory_bytes >> 20));
                return 0;
            }
            if (rc == REFUSED)
                refused = 1;
            else
                SQ_WARN("handshake failed addr=%s error=%s", w->addrs[i],
                        rc == SQ_PROTOCOL ? "protocol" : strerror(-rc));
            sq_conn_dispose(&w->conn);
        }
        if (refused && !w->joined) {
            SQ_ERROR("authentication refused; check --cluster-token-file on both sides");
            return -1;
        }
        /* The backoff, cut short by a signal to stop. */
        struct pollfd stop = {.fd = w->stop_fd, .events = POLLIN};
        if (poll(&stop, w->stop_fd >= 0 ? 1 : 0, sq_backoff_next(&backoff)) > 0) {
            SQ_INFO("stopping on a signal");
            return 1;
        }
    }
}

int main(int argc, char **argv)
{
    flags_t fl;
    memset(&fl, 0, sizeof(fl));
    sq_opts_action_t action;
    char perr[600];
    if (sq_opts_parse(&flag_spec, &fl, argc, argv, NULL, &action, perr, sizeof(perr)) != 0) {
        fprintf(stderr, "squish-worker: %s\n", perr);
        usage(stderr);
        return 2;
    }
    if (action == SQ_OPTS_HELP) {
        usage(stdout);
        return 0;
    }
    if (action == SQ_OPTS_VERSION) {
        printf("squish-worker %s (protocol %d)\n", SQUISH_VERSION, SQ_IPC_VERSION);
        return 0;
    }
    sq_log_set_level(fl.log_level);
    const char *sock_path = fl.socket[0] ? fl.socket : NULL;
    const char *device = fl.device[0] ? fl.device : NULL;
    const char *token_file = fl.token_file[0] ? fl.token_file : NULL;
    const char *host_name = fl.host_name[0] ? fl.host_name : NULL;
    const char *tls_cert = fl.tls_cert[0] ? fl.tls_cert : NULL;
    const char *tls_key = fl.tls_key[0] ? fl.tls_key : NULL;
    const char *tls_ca = fl.tls_ca[0] ? fl.tls_ca : NULL;
    long memory_mb = fl.memory_mb, threads = fl.threads, kept_models_ms = fl.kept_models_ms;
    worker_t w = {0};
    w.backoff_max_ms = fl.reconnect_max_ms;
    memcpy(w.addrs, fl.addrs, sizeof(w.addrs));
    w.naddrs = fl.naddrs;
    if ((sock_path == NULL) == (w.naddrs == 0) || device == NULL) {
        if (sock_path != NULL && w.naddrs > 0)
            fprintf(stderr, "squish-worker: --connect: a UNIX socket or tcp:// addresses, not "
                            "both\n");
        usage(stderr);
        return 2;
    }
    int ntls = (tls_cert != NULL) + (tls_key != NULL) + (tls_ca != NULL);
    int data = fl.data_listen[0] != '\0';
    if (w.naddrs == 0 && (host_name != NULL || (!data && (token_file != NULL || ntls > 0)))) {
        fprintf(stderr, "squish-worker: --cluster-token-file, --cluster-tls-* and --host-name are "
                        "for tcp:// (the first two also for --data-listen)\n");
        return 2;
    }
    if (data && token_file == NULL) {
        fprintf(stderr, "squish-worker: --data-listen needs --cluster-token-file (frontends "
                        "prove that token)\n");
        return 2;
    }
    if (!data && fl.data_advertise[0] != '\0') {
        fprintf(stderr, "squish-worker: --data-advertise is for --data-listen\n");
        return 2;
    }
    int adv_port;
    char adv_host[128];
    if (fl.data_advertise[0] != '\0' &&
        (sq_hostport_split(fl.data_advertise, adv_host, sizeof(adv_host), &adv_port) != 0 ||
         adv_port == 0)) {
        fprintf(stderr,
                "squish-worker: --data-advertise: expected HOST:PORT or [IPV6]:PORT, "
                "got '%s'\n",
                fl.data_advertise);
        return 2;
    }
    if (ntls != 0 && ntls != 3) {
        fprintf(stderr, "squish-worker: --cluster-tls-cert, --cluster-tls-key, --cluster-tls-ca: "
                        "give all three or none\n");
        return 2;
    }
    if (wk_device_parse(device, &w.dev) != 0 || strchr(device, '@') != NULL) {
        fprintf(stderr, "squish-worker: --device: expected cpu, cuda:N or emu:N, got '%s'\n",
                device);
        return 2;
    }
    if (w.dev.kind == SQ_DEV_CUDA && !wk_cuda_in_process() && SQUISH_HAVE_CUDA)
        return exec_cuda_worker(argv);
    if (w.naddrs > 0) {
        /* Named after its host: squishd tells apart cpu@a and cpu@b. */
        char host[SQ_DEVICE_MAX_HOST + 1] = "";
        if (host_name != NULL)
            snprintf(host, sizeof(host), "%s", host_name);
        else if (gethostname(host, sizeof(host)) != 0)
            snprintf(host, sizeof(host), "remote");
        host[SQ_DEVICE_MAX_HOST] = '\0';
        char *dot = host_name == NULL ? strchr(host, '.') : NULL;
        if (dot != NULL)
            *dot = '\0';
        char spec[128];
        snprintf(spec, sizeof(spec), "%s@%s", w.dev.name, host);
        if (wk_device_parse(spec, &w.dev) != 0) {
            fprintf(stderr,
                    "squish-worker: --host-name: '%s' is not a valid name (letters, "
                    "digits, '.', '-', '_', at most %d)\n",
                    host, SQ_DEVICE_MAX_HOST);
            return 2;
        }
        if (ntls == 3) {
            char err[400];
            if (sq_tls_new(&w.tls, 0, tls_cert, tls_key, tls_ca, err, sizeof(err)) != 0) {
                fprintf(stderr, "squish-worker: --cluster-tls-*: %s\n", err);
                return 2;
            }
        }
    }
    if (token_file != NULL) {
        char err[300];
        if (sq_auth_read_token(token_file, w.token, sizeof(w.token), &w.token_len, err,
                               sizeof(err)) != 0) {
            fprintf(stderr, "squish-worker: --cluster-token-file: %s\n", err);
            sq_tls_free(w.tls);
            return 2;
        }
    }
    /* The data listener: bound before joining squishd, so that a port in
     * use is an error at start. */
    sq_tls_t *data_tls = NULL;
    char data_bound[80] = "";
    int data_fd = -1;
    if (data) {
        char err[400];
        if (ntls == 3 &&
            sq_tls_new(&data_tls, 1, tls_cert, tls_key, tls_ca, err, sizeof(err)) != 0) {
            fprintf(stderr, "squish-worker: --cluster-tls-* (data listener): %s\n", err);
            sq_tls_free(w.tls);
            return 2;
        }
        data_fd = sq_listen_tcp(fl.data_listen, data_bound, sizeof(data_bound), err, sizeof(err));
        if (data_fd < 0) {
            fprintf(stderr, "squish-worker: --data-listen: %s\n", err);
            sq_tls_free(data_tls);
            sq_tls_free(w.tls);
            return 2;
        }
    }
    char tag[80];
    snprintf(tag, sizeof(tag), "squish-worker[%s]", w.dev.name);
    sq_log_set_tag(tag);
    if (memory_mb > 0)
        w.dev.memory_bytes = (uint64_t)memory_mb << 20;

    char why[256] = "";
    if (wk_device_probe(&w.dev, why, sizeof(why)) != 0) {
        SQ_ERROR("device unavailable device=%s reason=\"%s\"", w.dev.name, why);
        return WK_EXIT_DEVICE_UNAVAILABLE;
    }
    signal(SIGPIPE, SIG_IGN);

    if (w.naddrs > 0) {
        if (w.token_len == 0)
            SQ_WARN("no --cluster-token-file: squishd will refuse this worker");
        /* SIGTERM and SIGINT stop a remote worker cleanly (its loop and
         * its backoff watch a signalfd; every thread blocks them). */
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        w.stop_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
        wk_serve_opts_t so = {.dev = w.dev,
                              .threads = (int)threads,
                              .fd = -1,
                              .remote = 1,
                              .reconnect = reconnect,
                              .reconnect_ctx = &w,
                              .kept_models_ms = (int)kept_models_ms,
                              .stop_fd = w.stop_fd,
                              .data_fd = data_fd,
                              .token = w.token,
                              .token_len = w.token_len,
                              .data_tls = data_tls};
        snprintf(so.data_bound, sizeof(so.data_bound), "%s", data_bound);
        snprintf(so.data_advertise, sizeof(so.data_advertise), "%s", fl.data_advertise);
        int status = wk_serve(&so);
        if (data_fd >= 0)
            close(data_fd);
        sq_tls_free(data_tls);
        if (w.stop_fd >= 0)
            close(w.stop_fd);
        if (w.connected)
            sq_conn_dispose(&w.conn);
        sq_tls_free(w.tls);
        OPENSSL_cleanse(w.token, sizeof(w.token));
        return status;
    }

    int fd = connect_unix(sock_path);
    if (fd < 0) {
        SQ_ERROR("cannot connect socket=%s error=\"%s\"", sock_path, strerror(errno));
        return 1;
    }
    sq_conn_init(&w.conn, fd);
    int rc = handshake(&w);
    if (rc < 0) {
        SQ_ERROR("handshake failed error=%s", rc == SQ_PROTOCOL ? "protocol" : strerror(-rc));
        sq_conn_dispose(&w.conn);
        return 1;
    }
    wk_serve_opts_t so = {.dev = w.dev,
                          .threads = (int)threads,
                          .fd = fd,
                          .conn = &w.conn,
                          .shm = w.shm,
                          .shm_bytes = w.shm_bytes,
                          .stop_fd = -1,
                          .data_fd = data_fd,
                          .token = w.token,
                          .token_len = w.token_len,
                          .data_tls = data_tls};
    snprintf(so.data_bound, sizeof(so.data_bound), "%s", data_bound);
    snprintf(so.data_advertise, sizeof(so.data_advertise), "%s", fl.data_advertise);
    int status = wk_serve(&so);
    if (data_fd >= 0)
        close(data_fd);
    sq_tls_free(data_tls);
    OPENSSL_cleanse(w.token, sizeof(w.token));
    sq_shm_unmap(w.shm, w.shm_bytes);
    sq_conn_dispose(&w.conn);
    return status;
}
