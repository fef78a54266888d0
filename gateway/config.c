/* squishd configuration: one table (name, type, bounds, default, target
 * field, help), four sources, errors that name the field. */
#include "gw.h"

#include <errno.h>
#include <jansson.h>
#include <pl_dispatch.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    OPT_STR,
    OPT_INT,
    OPT_DOUBLE,
    OPT_LOGLEVEL,
    OPT_LISTEN,
    OPT_WORKERS,
    OPT_MB,
    OPT_POLICY
} opt_type_t;

typedef struct {
    const char *name; /* JSON key; the flag is --name with '-' for '_'; env SQUISH_NAME */
    opt_type_t type;
    size_t offset;
    size_t size; /* for strings: the buffer size */
    long long min, max;
    const char *def;
    const char *help;
} opt_t;

#define STR(f) OPT_STR, offsetof(gw_config_t, f), sizeof(((gw_config_t *)0)->f)
#define INT(f) OPT_INT, offsetof(gw_config_t, f), sizeof(int)
#define DBL(f) OPT_DOUBLE, offsetof(gw_config_t, f), sizeof(double)

static const opt_t options[] = {
    {"listen", OPT_LISTEN, 0, 0, 0, 0, "127.0.0.1:8000",
     "ADDR:PORT to serve HTTP on; port 0 picks a free port"},
    {"port_file", STR(port_file), 0, 0, "", "write the chosen port to this file"},
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
    {"worker_bin", STR(worker_bin), 0, 0, "", "squish-worker executable (default: beside squishd)"},
    {"log_level", OPT_LOGLEVEL, 0, 0, 0, 0, "info", "debug|info|warn|error|off"},
    {"http_threads", INT(http_threads), 1, 64, "1", "HTTP event-loop threads"},
    {"workers", OPT_WORKERS, 0, 0, 0, 0, "cpu:1",
     "workers to spawn, KIND:COUNT[,...] with KIND cpu|cuda|emu; \"none\" for none"},
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
    {"max_body_mb", OPT_MB, offsetof(gw_config_t, max_body_bytes), 0, 1, 1 << 20, "512",
     "largest request body (uploads included), MiB"},
    {"policy", OPT_POLICY, 0, 0, 0, 0, "adaptive",
     "batch dispatch: adaptive (deferred under load, at once while arrivals are sparse), "
     "deferred (Symphony) or early-drop (Nexus)"},
    {"k_std", DBL(k_std), 0, 10, "1", "latency margin: profile mean + k_std * std"},
    {"eager_load", DBL(eager_load), 0, 1, "0.5",
     "adaptive policy: a model's batches go at once while its arrivals stay below this share of "
     "what its workers serve batching greedily under the SLO"},
    {"dispatch_margin_us", INT(dispatch_margin_us), 0, 1000000, "2000",
     "added to every batch's latency: the IPC round trip and the reply's way back"},
    {"epoch_ms", INT(epoch_ms), 100, 86400000, "30000", "the planner re-plans at least this often"},
    {"epoch_min_interval_ms", INT(epoch_min_interval_ms), 0, 86400000, "10000",
     "and never sooner than this after the last epoch for a rate change"},
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
    {"default_slo_ms", DBL(default_slo_ms), 1, 3600000, "1000",
     "SLO of a request for a model that has no default_slo_ms"},
    {"prefix_batching", INT(prefix_batching), 0, 1, "1",
     "1: models that share all but their last layers (found on upload) run as one group, "
     "their common layers batched across their requests"},
    {"access_log", INT(access_log), 0, 1, "0",
     "1: one info log line per HTTP request (method, path, route, status, bytes, duration)"},
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
#define NOPTIONS (sizeof(options) / sizeof(options[0]))

static void flag_name(const opt_t *o, char *out, size_t n)
{
    snprintf(out, n, "--%s", o->name);
    for (char *p = out; *p; p++)
        if (*p == '_')
            *p = '-';
}

static void env_name(const opt_t *o, char *out, size_t n)
{
    snprintf(out, n, "SQUISH_%s", o->name);
    for (char *p = out; *p; p++)
        if (*p >= 'a' && *p <= 'z')
            *p = (char)(*p - 'a' + 'A');
}

static int parse_ll(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

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
            if (parse_ll(colon + 1, &count) != 0 || count < 1 || count > GW_MAX_WORKERS) {
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

static int parse_listen(gw_config_t *cfg, const char *v, char *err, size_t errlen)
{
    if (sq_hostport_split(v, cfg->listen_host, sizeof(cfg->listen_host), &cfg->listen_port) != 0) {
        snprintf(err, errlen,
                 "expected ADDR:PORT or [IPV6]:PORT with PORT in 0..65535 (at most %zu "
                 "characters of address), got '%s'",
                 sizeof(cfg->listen_host) - 1, v);
        return SQ_BAD_CONFIG;
    }
    return 0;
}

/* Sets one option from its text form; on error writes "what: why". */
static int set_option(gw_config_t *cfg, const opt_t *o, const char *v, const char *what, char *err,
                      size_t errlen)
{
    char why[256] = "";
    int rc = 0;
    switch (o->type) {
    case OPT_STR: {
        if (strlen(v) >= o->size) {
            snprintf(why, sizeof(why), "longer than %zu characters", o->size - 1);
            rc = SQ_BAD_CONFIG;
            break;
        }
        strcpy((char *)cfg + o->offset, v);
        break;
    }
    case OPT_INT:
    case OPT_MB: {
        long long n;
        if (parse_ll(v, &n) != 0 || n < o->min || n > o->max) {
            snprintf(why, sizeof(why), "expected an integer in %lld..%lld, got '%s'", o->min,
                     o->max, v);
            rc = SQ_BAD_CONFIG;
            break;
        }
        if (o->type == OPT_MB)
            *(int64_t *)((char *)cfg + o->offset) = (int64_t)n << 20;
        else
            *(int *)((char *)cfg + o->offset) = (int)n;
        break;
    }
    case OPT_DOUBLE: {
        char *end;
        double d = strtod(v, &end);
        if (end == v || *end != '\0' || !(d >= (double)o->min && d <= (double)o->max)) {
            snprintf(why, sizeof(why), "expected a number in %lld..%lld, got '%s'", o->min, o->max,
                     v);
            rc = SQ_BAD_CONFIG;
            break;
        }
        *(double *)((char *)cfg + o->offset) = d;
        break;
    }
    case OPT_POLICY: {
        pl_policy_t policy;
        if (pl_policy_parse(v, &policy) != 0) {
            snprintf(why, sizeof(why), "expected adaptive, deferred or early-drop, got '%s'", v);
            rc = SQ_BAD_CONFIG;
            break;
        }
        cfg->policy = (int)policy;
        break;
    }
    case OPT_LOGLEVEL:
        if (sq_log_level_parse(v, &cfg->log_level) != 0) {
            snprintf(why, sizeof(why), "expected debug, info, warn, error or off, got '%s'", v);
            rc = SQ_BAD_CONFIG;
        }
        break;
    case OPT_LISTEN:
        rc = parse_listen(cfg, v, why, sizeof(why));
        break;
    case OPT_WORKERS:
        rc = gw_parse_workers(cfg, v, why, sizeof(why));
        break;
    }
    if (rc != 0)
        snprintf(err, errlen, "%s: %s", what, why);
    return rc;
}

static const opt_t *find_option(const char *name)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strcmp(options[i].name, name) == 0)
            return &options[i];
    return NULL;
}

static int load_file(gw_config_t *cfg, const char *path, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        snprintf(err, errlen, "%s: line %d: %s", path, jerr.line, jerr.text);
        return SQ_BAD_CONFIG;
    }
    int rc = 0;
    if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: expected a JSON object", path);
        rc = SQ_BAD_CONFIG;
        goto out;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        char what[300];
        snprintf(what, sizeof(what), "%s: %s", path, key);
        const opt_t *o = find_option(key);
        if (o == NULL || strcmp(key, "config") == 0) {
            snprintf(err, errlen, "%s: unknown setting", what);
            rc = SQ_BAD_CONFIG;
            goto out;
        }
        char text[512];
        if (json_is_string(val))
            snprintf(text, sizeof(text), "%s", json_string_value(val));
        else if (json_is_integer(val))
            snprintf(text, sizeof(text), "%lld", (long long)json_integer_value(val));
        else if (json_is_real(val))
            snprintf(text, sizeof(text), "%.17g", json_real_value(val));
        else {
            snprintf(err, errlen, "%s: expected a string or an integer", what);
            rc = SQ_BAD_CONFIG;
            goto out;
        }
        if ((rc = set_option(cfg, o, text, what, err, errlen)) != 0)
            goto out;
    }
out:
    json_decref(root);
    return rc;
}

static const char *env_get(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e != NULL && *e != NULL; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=')
            return *e + n + 1;
    return NULL;
}

void gw_config_usage(FILE *f)
{
    fprintf(f, "usage: squishd [options]\n\n"
               "Options (also as SQUISH_NAME environment variables or keys of the --config "
               "file):\n");
    for (size_t i = 0; i < NOPTIONS; i++) {
        char flag[64];
        flag_name(&options[i], flag, sizeof(flag));
        fprintf(f, "  %-26s %s", flag, options[i].help);
        if (options[i].def[0] != '\0')
            fprintf(f, " [%s]", options[i].def);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-26s %s\n  %-26s %s\n", "--help", "print this and exit", "--version",
            "print the version and exit");
}

int gw_config_parse(gw_config_t *cfg, int argc, char **argv, char **envp,
                    gw_config_action_t *action, char *err, size_t errlen)
{
    memset(cfg, 0, sizeof(*cfg));
    *action = GW_CONFIG_RUN;
    for (size_t i = 0; i < NOPTIONS; i++) {
        int rc = set_option(cfg, &options[i], options[i].def, options[i].name, err, errlen);
        if (rc != 0)
            return rc; /* a bad default is a bug, but say so */
    }

    /* Flags are collected first so that --config can be read before the
     * environment and the flags override it. */
    const opt_t *flag_opt[256];
    const char *flag_val[256];
    char flag_what[256][72];
    int nflags = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *action = GW_CONFIG_HELP;
            return 0;
        }
        if (strcmp(a, "--version") == 0) {
            *action = GW_CONFIG_VERSION;
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, errlen, "%s: unexpected argument", a);
            return SQ_BAD_CONFIG;
        }
        char name[64];
        const char *eq = strchr(a, '=');
        size_t nlen = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (nlen >= sizeof(name)) {
            snprintf(err, errlen, "%.64s: unknown flag", a);
            return SQ_BAD_CONFIG;
        }
        memcpy(name, a + 2, nlen);
        name[nlen] = '\0';
        for (char *p = name; *p; p++)
            if (*p == '-')
                *p = '_';
        const opt_t *o = find_option(name);
        if (o == NULL) {
            snprintf(err, errlen, "--%.*s: unknown flag (see --help)", (int)nlen, a + 2);
            return SQ_BAD_CONFIG;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (v == NULL) {
            if (i + 1 >= argc) {
                flag_name(o, name, sizeof(name));
                snprintf(err, errlen, "%s: missing value", name);
                return SQ_BAD_CONFIG;
            }
            v = argv[++i];
        }
        if (nflags == 256) {
            snprintf(err, errlen, "too many flags");
            return SQ_BAD_CONFIG;
        }
        flag_opt[nflags] = o;
        flag_val[nflags] = v;
        flag_name(o, flag_what[nflags], sizeof(flag_what[nflags]));
        nflags++;
    }

    const char *config_file = env_get(envp, "SQUISH_CONFIG");
    for (int i = 0; i < nflags; i++)
        if (strcmp(flag_opt[i]->name, "config") == 0)
            config_file = flag_val[i];
    if (config_file != NULL && *config_file != '\0') {
        int rc = set_option(cfg, find_option("config"), config_file, "--config", err, errlen);
        if (rc != 0 || (rc = load_file(cfg, config_file, err, errlen)) != 0)
            return rc;
    }
    for (size_t i = 0; i < NOPTIONS; i++) {
        char ename[64];
        env_name(&options[i], ename, sizeof(ename));
        const char *v = env_get(envp, ename);
        if (v == NULL || strcmp(options[i].name, "config") == 0)
            continue;
        int rc = set_option(cfg, &options[i], v, ename, err, errlen);
        if (rc != 0)
            return rc;
    }
    for (int i = 0; i < nflags; i++) {
        int rc = set_option(cfg, flag_opt[i], flag_val[i], flag_what[i], err, errlen);
        if (rc != 0)
            return rc;
    }
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
    int tls = (cfg->cluster_tls_cert[0] != '\0') + (cfg->cluster_tls_key[0] != '\0') +
              (cfg->cluster_tls_ca[0] != '\0');
    if (tls != 0 && tls != 3) {
        snprintf(err, errlen,
                 "cluster_tls_cert, cluster_tls_key, cluster_tls_ca: give all three "
                 "or none");
        return SQ_BAD_CONFIG;
    }
    if (tls != 0 && cfg->cluster_listen[0] == '\0') {
        snprintf(err, errlen, "cluster_tls_*: only with cluster_listen");
        return SQ_BAD_CONFIG;
    }
    if (cfg->heartbeat_timeout_ms <= cfg->heartbeat_ms) {
        snprintf(err, errlen, "heartbeat_timeout_ms: must be larger than heartbeat_ms");
        return SQ_BAD_CONFIG;
    }
    return 0;
}
