/* Supervision of the workers squishd spawns. A supervised worker lives in a
 * slot (its device spec). When it dies (EOF, a protocol error, missed
 * heartbeats or an exit), the slot kills what is left of it and respawns
 * it after a backoff that doubles per consecutive failure and resets once
 * a worker stayed up for a while. A worker that exits with
 * SQ_EXIT_DEVICE_UNAVAILABLE (a cuda worker on a machine without a GPU) is
 * not retried: its slot becomes the cpu worker when no slot is one yet, and
 * is disabled otherwise (one cpu worker uses every core). */
#include "workers_int.h"

static void schedule_restart(gw_workers_t *ws, slot_t *s);

int gw__workers_find_worker_bin(gw_workers_t *ws, char *err, size_t errlen)
{
    const gw_workers_config_t *cfg = &ws->cfg;
    if (cfg->worker_bin[0] != '\0') {
        if (access(cfg->worker_bin, X_OK) != 0) {
            snprintf(err, errlen, "--worker-bin %s: %s", cfg->worker_bin, strerror(errno));
            return SQ_BAD_CONFIG;
        }
        snprintf(ws->worker_bin, sizeof(ws->worker_bin), "%s", cfg->worker_bin);
        return 0;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash != NULL) {
            *slash = '\0';
            const char *candidates[] = {"%s/squish-worker", "%s/../worker/squish-worker"};
            for (size_t i = 0; i < 2; i++) {
                char path[PATH_MAX + 32];
                snprintf(path, sizeof(path), candidates[i], self);
                if (access(path, X_OK) == 0 && strlen(path) < sizeof(ws->worker_bin)) {
                    snprintf(ws->worker_bin, sizeof(ws->worker_bin), "%s", path);
                    return 0;
                }
            }
        }
    }
    snprintf(err, errlen, "--worker-bin: squish-worker not found beside squishd; give its path");
    return SQ_BAD_CONFIG;
}

void gw__workers_spawn(gw_workers_t *ws, slot_t *s)
{
    const gw_workers_config_t *cfg = &ws->cfg;
    char mem[32];
    snprintf(mem, sizeof(mem), "%d", cfg->emu_memory_mb);
    /* One list in order: --memory-mb is for emulated devices only, and
     * the log level follows whatever came before it (a cpu worker once lost
     * it with --memory-mb, and logged at info under squishd at debug). */
    char *args[24];
    int n = 0;
    args[n++] = ws->worker_bin;
    args[n++] = "--connect";
    args[n++] = ws->cfg.socket_path;
    args[n++] = "--device";
    args[n++] = s->device;
    if (strncmp(s->device, "emu:", 4) == 0) {
        args[n++] = "--memory-mb";
        args[n++] = mem;
    }
    args[n++] = "--log-level";
    args[n++] = (char *)sq_log_level_name(cfg->log_level);
    /* Frontends may join (--cluster-listen): the worker takes their rows on
     * a data listener of its own, proving the cluster token as they do. */
    char data[160];
    if (cfg->worker_data_listen[0] != '\0' && cfg->cluster_token_file[0] != '\0') {
        snprintf(data, sizeof(data),
                 strchr(cfg->worker_data_listen, ':') != NULL ? "[%s]:0" : "%s:0",
                 cfg->worker_data_listen);
        args[n++] = "--data-listen";
        args[n++] = data;
        args[n++] = "--cluster-token-file";
        args[n++] = (char *)cfg->cluster_token_file;
        if (cfg->cluster_tls_cert[0] != '\0') { /* frontends speak TLS to it too */
            args[n++] = "--cluster-tls-cert";
            args[n++] = (char *)cfg->cluster_tls_cert;
            args[n++] = "--cluster-tls-key";
            args[n++] = (char *)cfg->cluster_tls_key;
            args[n++] = "--cluster-tls-ca";
            args[n++] = (char *)cfg->cluster_tls_ca;
        }
    }
    args[n] = NULL;
    pid_t pid;
    int rc = posix_spawn(&pid, ws->worker_bin, NULL, NULL, args, environ);
    if (rc != 0) {
        SQ_ERROR("cannot spawn worker device=%s error=\"%s\"", s->device, strerror(rc));
        schedule_restart(ws, s);
        return;
    }
    s->pid = pid;
    s->state = SLOT_SPAWNED;
    s->spawned_ns = sq_now_ns();
    gw__workers_publish(ws);
    SQ_INFO("worker spawned id=%d device=%s pid=%d", s->id, s->device, (int)pid);
}

static void on_restart_timer(sq_loop_t *loop, uint64_t id, void *data)
{
    slot_t *s = data;
    gw_workers_t *ws = s->ws;
    (void)loop;
    (void)id;
    s->restart_timer = 0;
    if (!ws->stopping && s->state == SLOT_IDLE)
        gw__workers_spawn(ws, s);
}

static void schedule_restart(gw_workers_t *ws, slot_t *s)
{
    if (ws->stopping || s->state == SLOT_DISABLED)
        return;
    s->state = SLOT_IDLE;
    s->pid = 0;
    int delay = sq_backoff_next(&s->backoff);
    int64_t now = sq_now_ns();
    s->restarts++;
    gw_metrics_worker_restart(ws->metrics, s->id, s->device);
    s->restart_at_ns = now + (int64_t)delay * 1000000;
    s->restart_timer = sq_loop_timer_at(ws->loop, s->restart_at_ns, on_restart_timer, s);
    SQ_INFO("worker restart scheduled id=%d device=%s in_ms=%d restarts=%d", s->id, s->device,
            delay, s->restarts);
    gw__workers_publish(ws);
}

static void slot_exited(gw_workers_t *ws, slot_t *s, int status)
{
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    /* While stopping, status 0 (after SHUTDOWN) or SIGTERM (sent to a
     * worker not yet up) is the exit asked for; anything else, a crash on
     * the way out or the SIGKILL at the deadline, is worth a warning. */
    int clean_stop = ws->stopping && (code == 0 || sig == SIGTERM);
    if (s->peer != NULL)
        gw__workers_peer_close(ws, s->peer, clean_stop ? "shutdown" : "exited");
    s->pid = 0;
    ws->ev->exited(ws->ev_ctx, s->id, status);
    if (ws->stopping) {
        if (!clean_stop)
            SQ_WARN("worker exited while stopping id=%d device=%s status=%d signal=%d", s->id,
                    s->device, code, sig);
        s->state = SLOT_IDLE;
        return;
    }
    SQ_INFO("worker exited id=%d device=%s status=%d signal=%d", s->id, s->device, code, sig);
    if (code == SQ_EXIT_DEVICE_UNAVAILABLE) {
        /* The slot becomes the cpu worker, unless one is already there: one
         * cpu worker uses every core, and a second on the same cores would
         * only contend with it (as workers=cpu:N runs one). */
        int cpu_slot = -1;
        for (int i = 0; i < ws->nslots && cpu_slot < 0; i++)
            if (gw__workers_slot_kind(&ws->slots[i]) == SQ_DEV_CPU &&
                ws->slots[i].state != SLOT_DISABLED)
                cpu_slot = i;
        if (gw__workers_slot_kind(s) == SQ_DEV_CPU) {
            SQ_WARN("device unavailable, slot disabled id=%d device=%s", s->id, s->device);
            s->state = SLOT_DISABLED;
            gw__workers_publish(ws);
            return;
        }
        if (cpu_slot >= 0) {
            SQ_WARN("device unavailable, slot disabled (no fallback: the cpu worker of slot %d "
                    "already uses every core) id=%d device=%s",
                    cpu_slot, s->id, s->device);
            s->state = SLOT_DISABLED;
            return;
        }
        SQ_WARN("device unavailable, falling back to cpu id=%d device=%s", s->id, s->device);
        sq_device_format(s->device, sizeof(s->device), SQ_DEV_CPU, 0);
    }
    if (s->up_since_ns > 0 && sq_now_ns() - s->up_since_ns > (int64_t)STABLE_AFTER_MS * 1000000)
        sq_backoff_reset(&s->backoff);
    s->up_since_ns = 0;
    schedule_restart(ws, s);
}

void gw__workers_reap(gw_workers_t *ws)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < ws->nslots; i++) {
            if (ws->slots[i].pid == pid) {
                slot_exited(ws, &ws->slots[i], status);
                break;
            }
        }
    }
}
