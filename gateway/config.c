/* squishd configuration: one table (name, type, bounds, default, target
 * field, help) read by common's option parser (sq_opts.h) from four
 * sources, errors that name the field. */
#include "gw.h"

#include <pl_dispatch.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define STR(f) SQ_OPT_STR, offsetof(gw_config_t, f), sizeof(((gw_config_t *)0)->f)
#define INT(f) SQ_OPT_INT, offsetof(gw_config_t, f), sizeof(int)
#define DBL(f) SQ_OPT_DOUBLE, offsetof(gw_config_t, f), sizeof(double)
/* A setting whose text a function of this file parses. */
#define CUSTOM SQ_OPT_CUSTOM, 0, 0, 0, 0

static int parse_listen(void *base, const sq_opt_t *o, const char *v, char *why, size_t len);
static int parse_workers_opt(void *base, const sq_opt_t *o, const char *v, char *why, size_t len);
static int parse_mb(void *base, const sq_opt_t *o, const char *v, char *why, size_t len);
static int parse_policy(void *base, const sq_opt_t *o, const char *v, char *why, size_t len);
static int parse_role(void *base, const sq_opt_t *o, const char *v, char *why, size_t len);

/* An option without a parser of its own leaves .parse out (NULL). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const sq_opt_t options[] = {
    {"listen", CUSTOM, "127.0.0.1:8000",
     "ADDR:PORT (or [IPV6]:PORT) to serve HTTP on; port 0 picks a free port", parse_listen},
    {"port_file", STR(port_file), 0, 0, "", "write the chosen port to this file"},
    {"grpc_listen", STR(grpc_listen), 0, 0, "",
     "ADDR:PORT (or [IPV6]:PORT) to serve KServe v2 over gRPC on (Triton's is 8001); port 0 "
     "picks a free one (logged); none when empty"},
    {"db", STR(db_path), 0, 0, "var/squish.db",
     "model database: a sqlite file (created if missing) or PostgreSQL "
     "(postgresql://... or a 'host=... dbname=...' conninfo)"},
    {"config", STR(config_path), 0, 0, "", "JSON config file (keys as the flags, with '_')"},
    {"admin_token_file", STR(admin_token_file), 0, 0, "",
     "admin bearer token file (default: admin.token next to the DB)"},
    {"socket", STR(socket_path), 0, 0, "",
     "worker UNIX socket (default: squishd.sock next to the DB)"},
    {"cluster_listen", STR(cluster_listen), 0, 0, "",
     "ADDR:PORT where workers on other hosts connect over TCP (squish-worker --connect "
     "tcp://HOST:PORT); port 0 picks one; needs --cluster-token-file"},
    {"cluster_token_file", STR(cluster_token_file), 0, 0, "",
     "file holding the token remote workers prove they know (it never crosses the network)"},
    {"cluster_tls_cert", STR(cluster_tls_cert), 0, 0, "",
     "PEM certificate for TLS on the cluster listener (with --cluster-tls-key and -ca)"},
    {"cluster_tls_key", STR(cluster_tls_key), 0, 0, "", "PEM private key of --cluster-tls-cert"},
    {"cluster_tls_ca", STR(cluster_tls_ca), 0, 0, "",
     "PEM CA that remote workers' certificates must chain to"},
    {"role", CUSTOM, "all",
     "all (one process does everything), dispatcher (planner, dispatcher, model DB; frontends "
     "and workers join its --cluster-listen) or frontend (HTTP and decode; joins --dispatcher)",
     parse_role},
    {"dispatcher", STR(dispatcher), 0, 0, "",
     "frontend: HOST:PORT[,HOST:PORT...] of the dispatcher's --cluster-listen (its standbys "
     "too: tried in turn)"},
    {"worker_data_listen", STR(worker_data_listen), 0, 0, "",
     "HOST the workers squishd spawns listen on for frontends' rows (default: the host of "
     "--cluster-listen when frontends may join)"},
    {"worker_bin", STR(worker_bin), 0, 0, "", "squish-worker executable (default: beside squishd)"},
    {"log_level", SQ_OPT_LOGLEVEL, offsetof(gw_config_t, log_level), 0, 0, 0, "info",
     "debug|info|warn|error|off"},
    {"http_threads", INT(http_threads), 1, 64, "1", "HTTP event-loop threads"},
    {"workers", CUSTOM, "cpu:1",
     "workers to spawn, KIND:COUNT[,...] with KIND cpu|cuda|emu; \"none\" for none",
     parse_workers_opt},
    {"heartbeat_ms", INT(heartbeat_ms), 10, 60000, "200", "worker heartbeat interval"},
    {"heartbeat_timeout_ms", INT(heartbeat_timeout_ms), 50, 600000, "1000",
     "a worker silent this long is declared dead and replaced"},
    {"restart_backoff_ms", INT(restart_backoff_ms), 0, 60000, "100",
     "first delay before restarting a dead worker (doubles per failure)"},
    {"restart_backoff_max_ms", INT(restart_backoff_max_ms), 0, 600000, "5000",
     "longest delay between restarts"},
    {"model_retries", INT(model_retries), 0, 100, "2",
     "a model whose worker crashes while loading, measuring or running it is retried this "
     "many times on a fresh worker, then marked failed"},
    {"shm_mb", INT(shm_mb), 1, 65536, "256", "shared-memory arena for batches, MiB"},
    {"emu_memory_mb", INT(emu_memory_mb), 1, 1 << 24, "16384", "memory of an emulated device"},
    {"advertise", STR(advertise), 0, 0, "",
     "the URL standbys give clients for this squishd when it leads (default: http://HOST:PORT of "
     "--listen, the host name for a wildcard address)"},
    {"leader_timeout_ms", INT(leader_timeout_ms), 500, 600000, "5000",
     "with a PostgreSQL --db, a standby takes over this soon after the leader dies (it tries the "
     "leader's lock every tenth of it)"},
    {"drain_timeout_ms", INT(drain_timeout_ms), 0, 600000, "10000",
     "on SIGTERM, how long in-flight requests may take to finish"},
    {"max_body_mb", SQ_OPT_CUSTOM, offsetof(gw_config_t, max_body_bytes), 0, 1, 1 << 20, "512",
     "largest request body (uploads included), MiB", parse_mb},
    {"policy", CUSTOM, "adaptive",
     "batch dispatch: adaptive (deferred under load, at once while arrivals are sparse), "
     "deferred (Symphony) or early-drop (Nexus)",
     parse_policy},
    {"k_std", DBL(k_std), 0, 10, "1", "latency margin: profile mean + k_std * std"},
    {"eager_load", DBL(eager_load), 0, 1, "0.9",
     "adaptive policy: a model's batches go at once while its arrivals stay below this share of "
     "what its workers serve batching greedily under the SLO"},
    {"dispatch_margin_us", INT(dispatch_margin_us), 0, 1000000, "2000",
     "added to every batch's latency: the IPC round trip and the reply's way back"},
    {"epoch_ms", INT(epoch_ms), 100, 86400000, "30000", "the planner re-plans at least this often"},
    {"epoch_min_interval_ms", INT(epoch_min_interval_ms), 0, 86400000, "10000",
     "and never sooner than this after the last epoch for a rate change"},
    {"plan_thread", INT(plan_thread), 0, 1, "1",
     "1: an epoch's plan is computed on a planner thread of its own, so the dispatch thread "
     "never waits for one (it applies the plan in 2 ms slices from its next tick); 0: computed "
     "and applied at once on the dispatch thread"},
    {"epoch_scale_up_ms", INT(epoch_scale_up_ms), 0, 86400000, "1000",
     "but a session whose rate rose above what its plan serves re-plans after only this"},
    {"plan_headroom", DBL(plan_headroom), 1, 10, "1",
     "the planner provisions rates times this (a margin on top of plan_burst_quantile)"},
    {"plan_burst_quantile", DBL(plan_burst_quantile), 0, 1, "0.99",
     "each planned batch covers this quantile of the Poisson count arriving in its duty cycle "
     "(headroom for bursts from the arrival variance; 0: plan mean rates)"},
    {"timer_slack_us", INT(timer_slack_us), 0, 1000000, "3000",
     "deferred dispatch sends a batch at least this long before its last safe moment, so that "
     "a dispatch thread waking late still makes it"},
    {"prep_threads", INT(prep_threads), 1, 256, "2", "JPEG decode threads"},
    {"prep_queue", INT(prep_queue), 1, 1 << 20, "4096",
     "images waiting for a decode thread, at most (then 503 overloaded)"},
    {"max_images", INT(max_images), 1, 1024, "64", "images or tensor rows per request"},
    {"max_request_ms", INT(max_request_ms), 1, 3600000, "60000",
     "hard upper bound on a request's life in squishd (caps every SLO)"},
    {"default_slo_ms", DBL(default_slo_ms), 0, 3600000, "0",
     "SLO of a request that names none, for a model uploaded without default_slo_ms; 0: none, "
     "such requests are best effort (sent as soon as a worker is free, below SLO traffic, never "
     "refused for a deadline; only --max-request-ms bounds them)"},
    {"prefix_batching", INT(prefix_batching), 0, 1, "1",
     "1: models that share all but their last layers (found on upload) run as one group, "
     "their common layers batched across their requests"},
    {"strict_readiness", INT(strict_readiness), 0, 1, "1",
     "1: GET /v2/health/ready is 200 only when every ready model can be served now (a model no "
     "worker up can run makes the server not ready, as Triton's --strict-readiness); 0: ready "
     "once the model DB is open and a worker is connected, each model's readiness its own"},
    {"access_log", INT(access_log), 0, 1, "0",
     "1: one info log line per HTTP request (method, path, route, status, bytes, duration)"},
    {"trace_file", STR(trace_file), 0, 0, "",
     "file the request traces of Triton's trace extension go to, as JSON lines (appended; "
     "POST /v2/trace/setting turns tracing on); \"\": none, tracing cannot be turned on"},
    {"max_inflight", INT(max_inflight), 1, 1 << 20, "4096",
     "inference requests inside squishd at most, from arrival to answer; past it new ones are "
     "answered 503 overloaded at once"},
    {"max_connections", INT(max_connections), 1, 1 << 20, "4096",
     "open client connections at most; past it new ones wait in the kernel's accept backlog"},
    {"http_request_timeout_ms", INT(http_request_timeout_ms), 100, 3600000, "10000",
     "a request's headers and body must arrive within this (also the keep-alive idle timeout): "
     "slow clients are disconnected; raise it for large uploads over slow links"},
    /* h2o 2.2 itself refuses a request head past 408 KiB (400, or a closed
     * connection), whatever this says. */
    {"max_header_kb", INT(max_header_kb), 1, 400, "32",
     "request line and header fields at most, in KiB; a larger request is answered 431"},
};
#pragma GCC diagnostic pop
#define NOPTIONS (sizeof(options) / sizeof(options[0]))

int gw_parse_workers(gw_config_t *cfg, const char *spec, char *err, size_t errlen)
{
    cfg->ngroups = 0;
    if (strcmp(spec, "none") == 0 || *spec == '\0')
        return 0;
    char buf[512];
    if (strlen(spec) >= sizeof(buf)) {
        snprintf(err, errlen, "spec too long");
        return SQ_BAD_CONFIG;
    }
    strcpy(buf, spec);
    int total = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        long long count = 1;
        if (colon != NULL) {
            *colon = '\0';
            if (sq_parse_ll(colon + 1, &count) != 0 || count < 1 || count > GW_MAX_WORKERS) {
                snprintf(err, errlen, "'%s': count must be an integer in 1..%d", colon + 1,
                         GW_MAX_WORKERS);
                return SQ_BAD_CONFIG;
            }
        }
        if (sq_dev_kind_parse(tok) < 0) {
            snprintf(err, errlen, "unknown worker kind '%s' (expected cpu, cuda or emu)", tok);
            return SQ_BAD_CONFIG;
        }
        for (int i = 0; i < cfg->ngroups; i++) {
            if (strcmp(cfg->groups[i].kind, tok) == 0) {
                snprintf(err, errlen, "worker kind '%s' given twice", tok);
                return SQ_BAD_CONFIG;
            }
        }
        if (cfg->ngroups == GW_MAX_WORKER_GROUPS) {
            snprintf(err, errlen, "too many worker groups");
            return SQ_BAD_CONFIG;
        }
        total += (int)count;
        if (total > GW_MAX_WORKERS) {
            snprintf(err, errlen, "more than %d workers in all", GW_MAX_WORKERS);
            return SQ_BAD_CONFIG;
        }
        gw_worker_group_t *g = &cfg->groups[cfg->ngroups++];
        snprintf(g->kind, sizeof(g->kind), "%s", tok);
        g->count = (int)count;
    }
    return 0;
}

static int parse_listen(void *base, const sq_opt_t *o, const char *v, char *why, size_t len)
{
    gw_config_t *cfg = base;
    if (sq_hostport_split(v, cfg->listen_host, sizeof(cfg->listen_host), &cfg->listen_port) != 0) {
        snprintf(why, len,
                 "expected ADDR:PORT or [IPV6]:PORT with PORT in 0..65535 (at most %zu "
                 "characters of address), got '%s'",
                 sizeof(cfg->listen_host) - 1, v);
        return SQ_BAD_CONFIG;
    }
    return 0;
}

static int parse_workers_opt(void *base, const sq_opt_t *o, const char *v, char *why, size_t len)
{
    return gw_parse_workers(base, v, why, len);
}

/* MiB in the text, bytes (int64_t) in the configuration. */
static int parse_mb(void *base, const sq_opt_t *o, const char *v, char *why, size_t len)
{
    long long n;
    if (sq_parse_ll(v, &n) != 0 || n < o->min || n > o->max) {
        snprintf(why, len, "expected an integer in %lld..%lld, got '%s'", o->min, o->max, v);
        return SQ_BAD_CONFIG;
    }
    *(int64_t *)((char *)base + o->offset) = (int64_t)n << 20;
    return 0;
}

static int parse_policy(void *base, const sq_opt_t *o, const char *v, char *why, size_t len)
{
    pl_policy_t policy;
    if (pl_policy_parse(v, &policy) != 0) {
        snprintf(why, len, "expected adaptive, deferred or early-drop, got '%s'", v);
        return SQ_BAD_CONFIG;
    }
    ((gw_config_t *)base)->policy = (int)policy;
    return 0;
}

static int parse_role(void *base, const sq_opt_t *o, const char *v, char *why, size_t len)
{
    (void)o;
    gw_config_t *cfg = base;
    if (strcmp(v, "all") == 0)
        cfg->role = GW_ROLE_ALL;
    else if (strcmp(v, "dispatcher") == 0)
        cfg->role = GW_ROLE_DISPATCHER;
    else if (strcmp(v, "frontend") == 0)
        cfg->role = GW_ROLE_FRONTEND;
    else {
        snprintf(why, len, "expected all, dispatcher or frontend, got '%s'", v);
        return SQ_BAD_CONFIG;
    }
    return 0;
}

static const sq_opts_spec_t spec = {
    .opts = options,
    .nopts = NOPTIONS,
    .env_prefix = "SQUISH_",
    .config_opt = "config",
};

void gw_config_usage(FILE *f)
{
    fprintf(f, "usage: squishd [options]\n\n"
               "Options (also as SQUISH_NAME environment variables or keys of the --config "
               "file):\n");
    sq_opts_usage(&spec, f);
}

int gw_config_parse(gw_config_t *cfg, int argc, char **argv, char **envp,
                    gw_config_action_t *action, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    sq_opts_action_t act;
    int rc = sq_opts_parse(&spec, cfg, argc, argv, envp, &act, err, errlen);
    *action = act == SQ_OPTS_HELP      ? GW_CONFIG_HELP
              : act == SQ_OPTS_VERSION ? GW_CONFIG_VERSION
                                       : GW_CONFIG_RUN;
    if (rc != 0 || act != SQ_OPTS_RUN)
        return rc;
    if (cfg->restart_backoff_max_ms < cfg->restart_backoff_ms) {
        snprintf(err, errlen, "restart_backoff_max_ms: must be >= restart_backoff_ms");
        return SQ_BAD_CONFIG;
    }
    if (cfg->cluster_listen[0] != '\0' && cfg->cluster_token_file[0] == '\0') {
        snprintf(err, errlen,
                 "cluster_listen: needs cluster_token_file (remote workers must "
                 "authenticate)");
        return SQ_BAD_CONFIG;
    }
    if (cfg->role == GW_ROLE_FRONTEND) {
        if (cfg->dispatcher[0] == '\0') {
            snprintf(err, errlen,
                     "role: frontend needs dispatcher (HOST:PORT of the "
                     "dispatcher's cluster_listen)");
            return SQ_BAD_CONFIG;
        }
        if (cfg->cluster_token_file[0] == '\0') {
            snprintf(err, errlen, "role: frontend needs cluster_token_file (the dispatcher's)");
            return SQ_BAD_CONFIG;
        }
        if (cfg->cluster_listen[0] != '\0') {
            snprintf(err, errlen,
                     "cluster_listen: a frontend listens for no one (workers and "
                     "frontends join the dispatcher)");
            return SQ_BAD_CONFIG;
        }
        cfg->ngroups = 0; /* a frontend spawns no workers */
    } else if (cfg->dispatcher[0] != '\0') {
        snprintf(err, errlen, "dispatcher: only with role frontend");
        return SQ_BAD_CONFIG;
    }
    if (cfg->role == GW_ROLE_DISPATCHER && cfg->cluster_listen[0] == '\0') {
        snprintf(err, errlen,
                 "role: dispatcher needs cluster_listen (where frontends and workers join)");
        return SQ_BAD_CONFIG;
    }
    if (cfg->worker_data_listen[0] == '\0' && cfg->cluster_listen[0] != '\0') {
        char host[128];
        int port;
        if (sq_hostport_split(cfg->cluster_listen, host, sizeof(host), &port) == 0)
            snprintf(cfg->worker_data_listen, sizeof(cfg->worker_data_listen), "%s", host);
    }
    int tls = (cfg->cluster_tls_cert[0] != '\0') + (cfg->cluster_tls_key[0] != '\0') +
              (cfg->cluster_tls_ca[0] != '\0');
    if (tls != 0 && tls != 3) {
        snprintf(err, errlen,
                 "cluster_tls_cert, cluster_tls_key, cluster_tls_ca: give all three "
                 "or none");
        return SQ_BAD_CONFIG;
    }
    if (tls != 0 && cfg->cluster_listen[0] == '\0' && cfg->role != GW_ROLE_FRONTEND) {
        snprintf(err, errlen, "cluster_tls_*: only with cluster_listen");
        return SQ_BAD_CONFIG;
    }
    if (cfg->grpc_listen[0] != '\0') {
        char host[128];
        int port;
        if (sq_hostport_split(cfg->grpc_listen, host, sizeof(host), &port) != 0) {
            snprintf(err, errlen,
                     "grpc_listen: expected ADDR:PORT or [IPV6]:PORT with PORT in 0..65535, "
                     "got '%s'",
                     cfg->grpc_listen);
            return SQ_BAD_CONFIG;
        }
    }
    if (cfg->heartbeat_timeout_ms <= cfg->heartbeat_ms) {
        snprintf(err, errlen, "heartbeat_timeout_ms: must be larger than heartbeat_ms");
        return SQ_BAD_CONFIG;
    }
    return 0;
}
