/* gateway/api/trace.c: Triton's trace settings without a server: which
 * requests are traced (every trace_rate-th, at most trace_count), a
 * model's settings over the global ones and cleared back to them, every
 * setting squish refuses (and that a refused update changes nothing), the
 * line's JSON, and the writer's file (log_frequency's indexed files). */
#include <criterion/criterion.h>
#include <trace_int.h>
#include <sq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Applies txt (a JSON object) to model's settings (NULL: global). */
static int update(gw_trace_t *t, const char *model, const char *txt, char *why, size_t len)
{
    json_error_t je;
    json_t *j = json_loads(txt, 0, &je);
    cr_assert_not_null(j, "%s: %s", txt, je.text);
    int rc = gw_trace_update(t, model, j, why, len);
    json_decref(j);
    return rc;
}

static void update_ok(gw_trace_t *t, const char *model, const char *txt)
{
    char why[512] = "";
    cr_assert_eq(update(t, model, txt, why, sizeof(why)), 0, "%s: %s", txt, why);
}

/* Refused with SQ_BAD_REQUEST and a reason that names what. */
static void refused(gw_trace_t *t, const char *model, const char *txt, const char *names)
{
    char why[512] = "";
    cr_assert_eq(update(t, model, txt, why, sizeof(why)), SQ_BAD_REQUEST, "%s accepted", txt);
    cr_assert(strstr(why, names) != NULL, "%s: '%s' does not name %s", txt, why, names);
}

/* A setting of model's (NULL: global) as GET gives it. */
static const char *setting(gw_trace_t *t, const char *model, const char *key)
{
    static char out[4][64];
    static int next;
    json_t *j = gw_trace_settings_json(t, model);
    json_t *v = json_object_get(j, key);
    if (json_is_array(v))
        v = json_array_get(v, 0);
    char *o = out[next++ % 4];
    snprintf(o, sizeof(out[0]), "%s", json_string_value(v));
    json_decref(j);
    return o;
}

/* Which of n requests for model are traced: a string of 'x' (traced) and
 * '.' (not). */
static const char *pattern(gw_trace_t *t, const char *model, int n)
{
    static char out[64];
    for (int i = 0; i < n; i++)
        out[i] = gw_trace_sample(t, model) != 0 ? 'x' : '.';
    out[n] = '\0';
    return out;
}

Test(trace, the_defaults_are_tritons_and_trace_nothing)
{
    gw_trace_t *t = gw_trace_new("/nonexistent/trace.jsonl");
    cr_assert_str_eq(setting(t, NULL, "trace_level"), "OFF");
    cr_assert_str_eq(setting(t, NULL, "trace_rate"), "1000");
    cr_assert_str_eq(setting(t, NULL, "trace_count"), "-1");
    cr_assert_str_eq(setting(t, NULL, "log_frequency"), "0");
    cr_assert_str_eq(setting(t, NULL, "trace_file"), "/nonexistent/trace.jsonl");
    cr_assert_str_eq(setting(t, NULL, "trace_mode"), "triton");
    cr_assert_str_eq(pattern(t, "m", 10), "..........");
    gw_trace_free(t);
    gw_trace_free(NULL);
}

Test(trace, every_rate_th_request_is_traced)
{
    gw_trace_t *t = gw_trace_new("/tmp/x");
    update_ok(t, NULL, "{\"trace_level\": [\"TIMESTAMPS\"], \"trace_rate\": \"2\"}");
    cr_assert_str_eq(pattern(t, "m", 10), ".x.x.x.x.x", "rate 2 over 10: 5, as Triton's");
    update_ok(t, NULL, "{\"trace_rate\": 3}"); /* an update starts the count afresh */
    cr_assert_str_eq(pattern(t, "m", 9), "..x..x..x");
    update_ok(t, NULL, "{\"trace_rate\": \"1\"}");
    cr_assert_str_eq(pattern(t, "m", 4), "xxxx");
    gw_trace_free(t);
}

Test(trace, count_stops_tracing_and_says_how_many_are_left)
{
    gw_trace_t *t = gw_trace_new("/tmp/x");
    update_ok(t, NULL,
              "{\"trace_level\": [\"TIMESTAMPS\"], \"trace_rate\": \"1\", "
              "\"trace_count\": \"3\"}");
    cr_assert_str_eq(pattern(t, "m", 6), "xxx...");
    cr_assert_str_eq(setting(t, NULL, "trace_count"), "0");
    update_ok(t, NULL, "{\"trace_count\": \"2\", \"trace_rate\": \"2\"}");
    cr_assert_str_eq(pattern(t, "m", 8), ".x.x....");
    update_ok(t, NULL, "{\"trace_count\": \"-1\"}"); /* no limit */
    cr_assert_str_eq(pattern(t, "m", 6), ".x.x.x");
    cr_assert_str_eq(setting(t, NULL, "trace_count"), "-1");
    /* The trace ids go on across settings. */
    update_ok(t, NULL, "{\"trace_rate\": \"1\"}");
    cr_assert_eq(gw_trace_sample(t, "m"), 9);
    gw_trace_free(t);
}

Test(trace, a_models_settings_override_the_global_ones_and_clear_back_to_them)
{
    gw_trace_t *t = gw_trace_new("/tmp/x");
    update_ok(t, "a", "{\"trace_level\": [\"TIMESTAMPS\"], \"trace_rate\": \"1\"}");
    cr_assert_str_eq(setting(t, "a", "trace_level"), "TIMESTAMPS");
    cr_assert_str_eq(setting(t, NULL, "trace_level"), "OFF");
    cr_assert_str_eq(setting(t, "b", "trace_level"), "OFF", "b has none: the global ones");
    cr_assert_str_eq(pattern(t, "a", 3), "xxx");
    cr_assert_str_eq(pattern(t, "b", 3), "...");
    /* The fields a's own are kept; the others follow the global ones. */
    update_ok(t, NULL, "{\"trace_rate\": \"5\", \"trace_count\": \"9\"}");
    cr_assert_str_eq(setting(t, "a", "trace_rate"), "1");
    cr_assert_str_eq(setting(t, "a", "trace_count"), "9");
    cr_assert_str_eq(setting(t, "a", "trace_level"), "TIMESTAMPS");
    /* null: back to the global value. */
    update_ok(t, "a", "{\"trace_rate\": null}");
    cr_assert_str_eq(setting(t, "a", "trace_rate"), "5");
    cr_assert_str_eq(pattern(t, "a", 5), "....x");
    cr_assert_str_eq(setting(t, "a", "trace_count"), "8", "a counts its own traces");
    cr_assert_str_eq(setting(t, NULL, "trace_count"), "9");
    /* Nothing of its own left: a is the global setting again. */
    update_ok(t, "a", "{\"trace_level\": null}");
    cr_assert_str_eq(setting(t, "a", "trace_level"), "OFF");
    cr_assert_str_eq(pattern(t, "a", 5), ".....");
    update_ok(t, NULL, "{\"trace_level\": [\"TIMESTAMPS\"], \"trace_rate\": \"2\"}");
    cr_assert_str_eq(pattern(t, "a", 2), ".x");
    cr_assert_str_eq(pattern(t, "b", 2), ".x", "a and b count together under the global one");
    cr_assert_str_eq(setting(t, NULL, "trace_count"), "7");
    /* The global setting cleared: Triton's defaults. */
    update_ok(t, NULL, "{\"trace_level\": null, \"trace_rate\": null, \"trace_count\": null}");
    cr_assert_str_eq(setting(t, NULL, "trace_rate"), "1000");
    cr_assert_str_eq(setting(t, NULL, "trace_count"), "-1");
    cr_assert_str_eq(setting(t, NULL, "trace_level"), "OFF");
    gw_trace_free(t);
}

Test(trace, what_squish_cannot_do_is_refused_and_changes_nothing)
{
    gw_trace_t *t = gw_trace_new("/tmp/x");
    refused(t, NULL, "{\"trace_level\": [\"TENSORS\"]}", "TENSORS");
    refused(t, NULL, "{\"trace_level\": [\"TIMESTAMPS\", \"TENSORS\"]}", "TENSORS");
    refused(t, NULL, "{\"trace_level\": [\"OFF\", \"TIMESTAMPS\"]}", "OFF");
    refused(t, NULL, "{\"trace_level\": []}", "trace_level");
    refused(t, NULL, "{\"trace_level\": [\"LOUD\"]}", "LOUD");
    refused(t, NULL, "{\"trace_rate\": \"abc\"}", "trace_rate");
    refused(t, NULL, "{\"trace_rate\": \"-1\"}", "trace_rate");
    refused(t, NULL, "{\"trace_rate\": 1.5}", "trace_rate");
    refused(t, NULL, "{\"trace_rate\": \"4294967296\"}", "trace_rate");
    refused(t, NULL, "{\"trace_count\": \"-2\"}", "trace_count");
    refused(t, NULL, "{\"trace_count\": true}", "trace_count");
    refused(t, NULL, "{\"log_frequency\": \" 1\"}", "log_frequency");
    refused(t, "m", "{\"log_frequency\": \"1\"}", "server-wide");
    refused(t, NULL, "{\"trace_file\": \"/etc/passwd\"}", "--trace-file");
    refused(t, "m", "{\"trace_file\": \"/tmp/y\"}", "--trace-file");
    refused(t, NULL, "{\"trace_mode\": \"opentelemetry\"}", "trace_mode");
    refused(t, NULL, "{\"trace_sampler\": 1}", "trace_sampler");
    refused(t, NULL, "{\"trace_level\": [\"TIMESTAMPS\"], \"trace_rate\": \"0\"}", "trace_rate");
    /* Half good, half refused: nothing applied. */
    refused(t, NULL, "{\"trace_level\": [\"TIMESTAMPS\"], \"trace_mode\": \"x\"}", "trace_mode");
    cr_assert_str_eq(setting(t, NULL, "trace_level"), "OFF");
    refused(t, "m", "{\"trace_rate\": \"3\", \"trace_count\": \"x\"}", "trace_count");
    cr_assert_str_eq(setting(t, "m", "trace_rate"), "1000");
    /* What GET gives may be sent back; rate 0 is fine while off. */
    update_ok(t, NULL,
              "{\"trace_file\": \"/tmp/x\", \"trace_mode\": \"triton\", \"trace_rate\": \"0\", "
              "\"log_frequency\": null, \"trace_count\": 0}");
    update_ok(t, "m", "{\"log_frequency\": null, \"trace_file\": null}");
    gw_trace_free(t);
}

Test(trace, without_a_trace_file_tracing_cannot_be_turned_on)
{
    gw_trace_t *t = gw_trace_new("");
    refused(t, NULL, "{\"trace_level\": [\"TIMESTAMPS\"]}", "--trace-file");
    refused(t, "m", "{\"trace_level\": [\"TIMESTAMPS\"]}", "--trace-file");
    update_ok(t, NULL, "{\"trace_rate\": \"5\", \"trace_level\": [\"OFF\"]}");
    char why[64];
    cr_assert_eq(gw_trace_open(t, why, sizeof(why)), 0, "nothing to open");
    gw_trace_free(t);
}

Test(trace, a_line_is_json_with_its_moments_in_order)
{
    gw_trace_record_t r = {.id = 7,
                           .request_id = "id-\"1\"\\\n\xc3\xa9",
                           .model = "r50",
                           .version = 2,
                           .status = 200,
                           .items = 3,
                           .batch_size = 4};
    for (int i = 0; i < GW_TRACE_NSTAMPS; i++)
        r.at_us[i] = 1000 + 10 * i;
    r.at_us[GW_TRACE_DECODE_START] = r.at_us[GW_TRACE_DECODE_END] = 0; /* no JPEG */
    char line[1024];
    size_t n = gw_trace_format(&r, line, sizeof(line));
    cr_assert_eq(n, strlen(line));
    cr_assert_str_eq(
        line, "{\"id\":7,\"request_id\":\"id-\\\"1\\\"\\\\\\u000a\\u00c3\\u00a9\","
              "\"model_name\":\"r50\",\"model_version\":2,\"status\":200,\"items\":3,"
              "\"batch_size\":4,\"timestamps\":[{\"name\":\"receive\",\"us\":1000},"
              "{\"name\":\"queue\",\"us\":1030},{\"name\":\"batch\",\"us\":1040},"
              "{\"name\":\"execute_start\",\"us\":1050},{\"name\":\"execute_end\",\"us\":1060},"
              "{\"name\":\"reply\",\"us\":1070}]}\n");
    json_error_t je;
    json_t *j = json_loads(line, 0, &je);
    cr_assert_not_null(j, "valid JSON: %s", je.text);
    json_decref(j);
    /* Truncated: terminated, and the length it needs. */
    char small[16];
    cr_assert_eq(gw_trace_format(&r, small, sizeof(small)), n);
    cr_assert_eq(strlen(small), sizeof(small) - 1);
    cr_assert_str_eq(gw_trace_stamp_name(GW_TRACE_EXECUTE_END), "execute_end");
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int lines_in(const char *path)
{
    const char *s = slurp(path);
    int n = 0;
    for (; s != NULL && *s; s++)
        n += *s == '\n';
    return s == NULL ? -1 : n;
}

Test(trace, the_writer_appends_lines_and_splits_them_by_log_frequency)
{
    char dir[] = "/tmp/squish-trace-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[128], p0[160], p1[160], p2[160];
    snprintf(path, sizeof(path), "%s/trace.jsonl", dir);
    snprintf(p0, sizeof(p0), "%s.0", path);
    snprintf(p1, sizeof(p1), "%s.1", path);
    snprintf(p2, sizeof(p2), "%s.2", path);
    gw_trace_t *t = gw_trace_new(path);
    char why[256];
    cr_assert_eq(gw_trace_open(t, why, sizeof(why)), 0, "%s", why);
    gw_trace_record_t r = {.request_id = "a", .model = "m", .version = 1, .status = 200};
    r.at_us[GW_TRACE_RECEIVE] = 5;
    for (r.id = 1; r.id <= 2; r.id++)
        gw_trace_emit(t, &r);
    gw_trace_free(t); /* writes what is queued */
    cr_assert_eq(lines_in(path), 2);
    cr_assert(strstr(slurp(path), "{\"id\":2,") != NULL);
    /* Appended, never truncated; with log_frequency 2, indexed files of 2. */
    t = gw_trace_new(path);
    cr_assert_eq(gw_trace_open(t, why, sizeof(why)), 0, "%s", why);
    update_ok(t, NULL, "{\"log_frequency\": \"2\"}");
    for (r.id = 3; r.id <= 7; r.id++)
        gw_trace_emit(t, &r);
    gw_trace_free(t);
    cr_assert_eq(lines_in(path), 2);
    cr_assert_eq(lines_in(p0), 2);
    cr_assert_eq(lines_in(p1), 2);
    cr_assert_eq(lines_in(p2), 1);
    cr_assert(strstr(slurp(p2), "{\"id\":7,") != NULL);
    unlink(path);
    unlink(p0);
    unlink(p1);
    unlink(p2);
    rmdir(dir);
    /* A file that cannot be opened is a start-up error naming the flag. */
    t = gw_trace_new("/nonexistent-dir/trace.jsonl");
    cr_assert_eq(gw_trace_open(t, why, sizeof(why)), SQ_IO);
    cr_assert(strstr(why, "--trace-file") != NULL, "%s", why);
    gw_trace_free(t);
}
