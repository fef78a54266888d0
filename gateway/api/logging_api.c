/* Triton's logging and trace extensions, both admin operations:
 *
 *   GET|POST /v2/logging: which levels squishd writes and the line format,
 *     changed at run time (sq_log.h: atomics every SQ_LOG reads)
 *   GET|POST /v2/trace/setting, /v2/models/{m}/trace/setting: request
 *     traces (trace.c)
 *
 * A setting squish cannot honour is refused with 400 naming it and why, and
 * a refused request changes nothing. */
#include "api_int.h"
#include "trace_int.h"
#include "gw_catalog.h"
#include "gw_http.h"

#include <jansson.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The log_verbose_level last set (-1: none yet; then 1 while debug lines
 * are on, else 0). squish has one verbose level, its debug lines: any
 * level >= 1 turns them on, and GET gives back the number set. */
static atomic_int verbose_level = -1;

/* ---- /v2/logging ----------------------------------------------------------- */

static json_t *log_settings_json(void)
{
    int verbose = atomic_load(&verbose_level);
    int debug = sq_log_enabled(SQ_LOG_DEBUG);
    if (verbose < 0 || (verbose > 0) != debug)
        verbose = debug;
    return json_pack("{s:s, s:b, s:b, s:b, s:i, s:s}", "log_file", "", "log_info",
                     sq_log_enabled(SQ_LOG_INFO), "log_warning", sq_log_enabled(SQ_LOG_WARN),
                     "log_error", sq_log_enabled(SQ_LOG_ERROR), "log_verbose_level", verbose,
                     "log_format",
                     sq_log_get_format() == SQ_LOG_FORMAT_ISO8601 ? "ISO8601" : "default");
}

/* A change of the log settings, read whole before any is applied. */
typedef struct {
    int info, warning, error; /* -1: unchanged */
    long long verbose;        /* -1: unchanged */
    int format;               /* -1: unchanged, else sq_log_format_t */
} log_change_t;

static int parse_log_change(json_t *body, log_change_t *c, char *why, size_t len)
{
    *c = (log_change_t){-1, -1, -1, -1, -1};
    const char *key;
    json_t *v;
    json_object_foreach(body, key, v)
    {
        /* null leaves a setting as it is, as in Triton. */
        if (json_is_null(v))
            continue;
        int *flag = strcmp(key, "log_info") == 0      ? &c->info
                    : strcmp(key, "log_warning") == 0 ? &c->warning
                    : strcmp(key, "log_error") == 0   ? &c->error
                                                      : NULL;
        if (flag != NULL) {
            if (!json_is_boolean(v)) {
                snprintf(why, len, "%s: expected true or false", key);
                return SQ_BAD_REQUEST;
            }
            *flag = json_is_true(v);
        } else if (strcmp(key, "log_verbose_level") == 0) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT_MAX) {
                snprintf(why, len,
                         "log_verbose_level: expected an integer >= 0 (0: no verbose lines; "
                         "squish has one verbose level, its debug lines, which any level >= 1 "
                         "turns on)");
                return SQ_BAD_REQUEST;
            }
            c->verbose = json_integer_value(v);
        } else if (strcmp(key, "log_format") == 0) {
            const char *f = json_string_value(v);
            if (f != NULL && strcmp(f, "default") == 0) {
                c->format = SQ_LOG_FORMAT_SQUISH;
            } else if (f != NULL && strcmp(f, "ISO8601") == 0) {
                c->format = SQ_LOG_FORMAT_ISO8601;
            } else {
                snprintf(why, len, "log_format: expected \"default\" or \"ISO8601\"");
                return SQ_BAD_REQUEST;
            }
        } else if (strcmp(key, "log_file") == 0) {
            /* What GET gives ("": standard error) may be sent back. */
            if (!json_is_string(v) || json_string_value(v)[0] != '\0') {
                snprintf(why, len,
                         "log_file: squishd logs to its standard error (redirect it, or let "
                         "systemd or Kubernetes collect it); a request over HTTP does not choose "
                         "files on the server, as in Triton");
                return SQ_BAD_REQUEST;
            }
        } else {
            snprintf(why, len,
                     "unknown log setting \"%.64s\": expected log_file, log_info, log_warning, "
                     "log_error, log_verbose_level or log_format",
                     key);
            return SQ_BAD_REQUEST;
        }
    }
    return 0;
}

int gw_log_settings(json_t *change, json_t **out, char *why, size_t len)
{
    *out = NULL;
    if (change != NULL) {
        log_change_t c;
        int rc = parse_log_change(change, &c, why, len);
        if (rc != 0)
            return rc;
        if (c.info >= 0)
            sq_log_enable(SQ_LOG_INFO, c.info);
        if (c.warning >= 0)
            sq_log_enable(SQ_LOG_WARN, c.warning);
        if (c.error >= 0)
            sq_log_enable(SQ_LOG_ERROR, c.error);
        if (c.verbose >= 0) {
            atomic_store(&verbose_level, (int)c.verbose);
            sq_log_enable(SQ_LOG_DEBUG, c.verbose > 0);
        }
        if (c.format >= 0)
            sq_log_set_format((sq_log_format_t)c.format);
        SQ_INFO("log settings changed info=%d warning=%d error=%d debug=%d format=%s",
                sq_log_enabled(SQ_LOG_INFO), sq_log_enabled(SQ_LOG_WARN),
                sq_log_enabled(SQ_LOG_ERROR), sq_log_enabled(SQ_LOG_DEBUG),
                sq_log_get_format() == SQ_LOG_FORMAT_ISO8601 ? "ISO8601" : "default");
    }
    *out = log_settings_json();
    return 0;
}

static void route_logging(gw_call_t *call, int post)
{
    if (!gw_require_admin(call))
        return;
    json_t *body = NULL, *now;
    if (post && gw_body_object(call, "settings", &body) != 0)
        return;
    char why[512];
    int rc = gw_log_settings(body, &now, why, sizeof(why));
    json_decref(body);
    if (rc != 0)
        gw_send_error(call->req, rc, why);
    else
        gw_send_json(call->req, 200, now);
}

void gw_route_logging_get(gw_call_t *call)
{
    route_logging(call, 0);
}

void gw_route_logging_post(gw_call_t *call)
{
    route_logging(call, 1);
}

/* ---- /v2[/models/{m}]/trace/setting ------------------------------------------ */

int gw_trace_setting(gw_api_ctx_t *api, const char *model, size_t model_len, json_t *change,
                     json_t **out, char *why, size_t len)
{
    *out = NULL;
    gw_trace_t *t = api->trace;
    char name[MDB_NAME_MAX + 1] = "";
    if (model != NULL) {
        /* A model's settings: a model squishd has (any version). */
        gw_model_t *m = gw_registry_find(api->registry, model, model_len, 0);
        if (m == NULL) {
            snprintf(why, len,
                     "no such model: per-model trace settings are for a model squishd has "
                     "(pipelines are not traced)");
            return SQ_MODEL_NOT_FOUND;
        }
        snprintf(name, sizeof(name), "%s", m->name);
        gw_model_unref(m);
    }
    const char *mname = name[0] ? name : NULL;
    if (change != NULL) {
        int rc = gw_trace_update(t, mname, change, why, len);
        if (rc != 0)
            return rc;
        json_t *now = gw_trace_settings_json(t, mname);
        SQ_INFO("trace settings changed model=%s level=%s rate=%s count=%s log_frequency=%s",
                mname ? mname : "(global)",
                json_string_value(json_array_get(json_object_get(now, "trace_level"), 0)),
                json_string_value(json_object_get(now, "trace_rate")),
                json_string_value(json_object_get(now, "trace_count")),
                json_string_value(json_object_get(now, "log_frequency")));
        *out = now;
        return 0;
    }
    *out = gw_trace_settings_json(t, mname);
    return 0;
}

static void route_trace(gw_call_t *call, int post)
{
    if (!gw_require_admin(call))
        return;
    json_t *body = NULL, *now;
    if (post && gw_body_object(call, "settings", &body) != 0)
        return;
    char why[512];
    int rc =
        gw_trace_setting(call->app, call->nargs > 0 ? call->args[0].base : NULL,
                         call->nargs > 0 ? call->args[0].len : 0, body, &now, why, sizeof(why));
    json_decref(body);
    if (rc != 0)
        gw_send_error(call->req, rc, why);
    else
        gw_send_json(call->req, 200, now);
}

void gw_route_trace_get(gw_call_t *call)
{
    route_trace(call, 0);
}

void gw_route_trace_post(gw_call_t *call)
{
    route_trace(call, 1);
}
