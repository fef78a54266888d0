/* gateway/: squishd. This header is the module's public face: the typed,
 * validated configuration and the server's entry point. */
#ifndef GW_H
#define GW_H

#include <sq.h>

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#define GW_MAX_WORKER_GROUPS 16
#define GW_MAX_WORKERS 1024

/* What one squishd process does (--role): everything (the embedded
 * default), or one side of a cluster that grows by frontends (issue 25):
 * the dispatcher (planner, dispatcher core, model DB, leadership, the
 * workers' link) or a frontend (HTTP, decode, its own input arena; it
 * joins a dispatcher and sends the rows of its requests to the workers). */
typedef enum { GW_ROLE_ALL = 0, GW_ROLE_DISPATCHER, GW_ROLE_FRONTEND } gw_role_t;

typedef struct {
    char kind[8]; /* "cpu", "cuda", "emu" */
    int count;
} gw_worker_group_t;

/* squishd's configuration: parsed once, validated, then read-only. Sources,
 * lowest to highest precedence: built-in defaults, the JSON config file
 * (--config or SQUISH_CONFIG), SQUISH_* environment variables, flags. */
typedef struct {
    char listen_host[64];
    int listen_port;
    char port_file[256];
    char grpc_listen[128]; /* KServe v2 over gRPC: ADDR:PORT ("" = none) */
    char db_path[256];
    char config_path[256];
    char admin_token_file[256]; /* "" = next to the DB */
    char socket_path[108];      /* "" = next to the DB */
    char worker_bin[256];       /* "" = beside squishd, then the build tree */
    /* workers on other hosts: TCP listener ("" = none), their shared token,
     * optional TLS (all three or none) */
    char cluster_listen[128];
    char cluster_token_file[256];
    char cluster_tls_cert[256];
    char cluster_tls_key[256];
    char cluster_tls_ca[256];
    int role;             /* gw_role_t */
    char dispatcher[512]; /* frontend: the dispatchers' cluster addresses, comma-separated */
    char worker_data_listen[128]; /* HOST the workers squishd spawns take frontends' rows on */
    sq_log_level_t log_level;
    int http_threads;
    int ngroups;
    gw_worker_group_t groups[GW_MAX_WORKER_GROUPS];
    int heartbeat_ms;
    int heartbeat_timeout_ms;
    int restart_backoff_ms;
    int model_retries;    /* crashes a model may cause before it is marked failed, less one */
    int strict_readiness; /* 1: the server is ready when every ready model can be served */
    int restart_backoff_max_ms;
    int shm_mb;
    int emu_memory_mb;
    int drain_timeout_ms;
    char advertise[128];   /* the leader's address given by standbys ("" = from --listen) */
    int leader_timeout_ms; /* PostgreSQL DB: a standby takes over within this */
    int64_t max_body_bytes;
    /* data plane */
    int policy;             /* pl_policy_t: deferred | early-drop */
    double k_std;           /* profile margin: mean + k_std * std */
    double eager_load;      /* adaptive policy: pl_dispatch_opts_t.eager_load */
    int dispatch_margin_us; /* added to every batch's latency: IPC round trip, reply */
    int timer_slack_us;     /* deferred: send at least this long before the last moment */
    int epoch_ms;           /* planner epoch period */
    int epoch_min_interval_ms;
    int epoch_scale_up_ms;
    int plan_thread; /* 1: plans are computed on the planner thread */
    double plan_headroom;
    /* pl_options_t.burst_quantile: bursts from the arrival variance */
    double plan_burst_quantile;
    int prep_threads;      /* JPEG decode threads */
    int prep_queue;        /* images waiting for a decode thread, at most */
    int max_images;        /* images (or tensor rows) per request */
    int max_request_ms;    /* hard upper bound on any request's life (caps the SLO) */
    double default_slo_ms; /* when neither the request nor the model gives one */
    int access_log;        /* one info line per HTTP request */
    char trace_file[256];  /* request traces as JSON lines ("" = none) */
    int prefix_batching;   /* run shared-prefix groups as one (worker/group.c) */
    /* admission and connection limits */
    int max_inflight;            /* inference requests inside squishd at most (then 503) */
    int max_connections;         /* open client connections at most (then the backlog) */
    int http_request_timeout_ms; /* a request's headers and body arrive within this */
    int max_header_kb;           /* request line and headers at most (then 431) */
} gw_config_t;

/* What gw_config_parse did: run the server, or print and exit. */
typedef enum { GW_CONFIG_RUN, GW_CONFIG_HELP, GW_CONFIG_VERSION } gw_config_action_t;

/* Fills cfg from defaults, the config file, the environment (envp, NULL
 * terminated; NULL means none) and argv. On error returns SQ_BAD_CONFIG and
 * writes a message naming the offending field ("--http-threads: ...",
 * "config.json: workers: ...", "SQUISH_DB: ...") into err. */
int gw_config_parse(gw_config_t *cfg, int argc, char **argv, char **envp,
                    gw_config_action_t *action, char *err, size_t errlen);
/* Parses a worker spec "cpu:1,emu:4" into cfg->groups. */
int gw_parse_workers(gw_config_t *cfg, const char *spec, char *err, size_t errlen);
/* Writes the --help text. */
void gw_config_usage(FILE *f);

/* Runs squishd until SIGTERM/SIGINT; returns the process exit status. */
int gw_main(const gw_config_t *cfg);

#endif
