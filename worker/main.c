/* squish-worker: owns one device, talks to squishd over a UNIX socket.
 *
 *   squish-worker --connect /path/to/squishd.sock --device emu:0
 *
 * Exit status: 0 after SHUTDOWN or when squishd goes away, 1 on a protocol
 * or I/O error, 2 on bad usage, WK_EXIT_DEVICE_UNAVAILABLE (3) when the
 * device cannot be used. */
#include "wk.h"
#include "wk_serve.h"

#include <sq.h>

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct {
    sq_conn_t conn;
    wk_device_t dev;
    uint32_t worker_id;
    uint8_t *shm;
    size_t shm_bytes;
} worker_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: squish-worker --connect SOCKET --device cpu|cuda:N|emu:N\n"
               "                     [--memory-mb N] [--log-level LEVEL] [--help] [--version]\n"
               "  --connect SOCKET   squishd's worker socket\n"
               "  --device SPEC      the device this worker owns\n"
               "  --memory-mb N      memory to report for an emulated device (default 16384)\n"
               "  --threads N        cpu kernel threads (default 0: every core)\n"
               "  --log-level LEVEL  debug|info|warn|error (default info)\n");
}

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

/* Blocks (poll) until one whole frame is in, up to timeout_ms. */
static int read_frame_blocking(sq_conn_t *c, sq_frame_t *f, int timeout_ms)
{
    int64_t deadline = sq_now_ms() + timeout_ms;
    for (;;) {
        int rc = sq_conn_next(c, f);
        if (rc != 0)
            return rc;
        int left = (int)(deadline - sq_now_ms());
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, left) < 0 && errno != EINTR)
            return -errno;
        rc = sq_conn_read(c);
        if (rc == 0)
            return -ECONNRESET;
        if (rc < 0 && rc != -EAGAIN)
            return rc;
    }
}

static int handshake(worker_t *w)
{
    sq_hello_t hello = {.magic = SQ_IPC_MAGIC,
                        .version = SQ_IPC_VERSION,
                        .memory_bytes = w->dev.memory_bytes,
                        .pid = (uint32_t)getpid()};
    snprintf(hello.kind, sizeof(hello.kind), "%s", wk_dev_kind_name(w->dev.kind));
    snprintf(hello.name, sizeof(hello.name), "%s", w->dev.name);
    sq_buf_t b;
    sq_buf_init(&b);
    sq_hello_encode(&b, &hello);
    int rc = sq_conn_send(&w->conn, SQ_MSG_HELLO, 0, b.data, (uint32_t)b.len);
    sq_buf_dispose(&b);
    if (rc < 0)
        return rc;

    sq_frame_t f;
    if ((rc = read_frame_blocking(&w->conn, &f, 10000)) < 0)
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

int main(int argc, char **argv)
{
    const char *sock_path = NULL, *device = NULL;
    long memory_mb = 0, threads = 0;
    static const struct option opts[] = {
        {"connect", required_argument, NULL, 'c'},   {"device", required_argument, NULL, 'd'},
        {"memory-mb", required_argument, NULL, 'm'}, {"threads", required_argument, NULL, 't'},
        {"log-level", required_argument, NULL, 'l'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},         {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            sock_path = optarg;
            break;
        case 'd':
            device = optarg;
            break;
        case 'm': {
            char *end;
            memory_mb = strtol(optarg, &end, 10);
            if (*end != '\0' || memory_mb <= 0 || memory_mb > (1L << 30)) {
                fprintf(stderr, "squish-worker: --memory-mb: expected a positive integer\n");
                return 2;
            }
            break;
        }
        case 't': {
            char *end;
            threads = strtol(optarg, &end, 10);
            if (*end != '\0' || threads < 0 || threads > 1024) {
                fprintf(stderr, "squish-worker: --threads: expected an integer in 0..1024\n");
                return 2;
            }
            break;
        }
        case 'l': {
            sq_log_level_t lvl;
            if (sq_log_level_parse(optarg, &lvl) != 0) {
                fprintf(stderr, "squish-worker: --log-level: unknown level '%s'\n", optarg);
                return 2;
            }
            sq_log_set_level(lvl);
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("squish-worker %s (protocol %d)\n", SQUISH_VERSION, SQ_IPC_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (sock_path == NULL || device == NULL) {
        usage(stderr);
        return 2;
    }
    worker_t w = {0};
    if (wk_device_parse(device, &w.dev) != 0) {
        fprintf(stderr, "squish-worker: --device: expected cpu, cuda:N or emu:N, got '%s'\n",
                device);
        return 2;
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
                          .shm_bytes = w.shm_bytes};
    int status = wk_serve(&so);
    sq_shm_unmap(w.shm, w.shm_bytes);
    sq_conn_dispose(&w.conn);
    return status;
}
