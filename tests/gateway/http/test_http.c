/* gateway/http/http.c and token.c: the plumbing every route relies on,
 * on requests built by hand (no connection, no loop): query parameters,
 * {version} segments, request headers, the request body, response headers,
 * the route table's lookup (patterns, trailing slashes, 405's Allow), the
 * admin token's comparison, and the room's context as filled from the
 * server. */
#include <criterion/criterion.h>
#include <http_int.h>
#include <sq.h>

#include <stdint.h>
#include <string.h>

/* A request as h2o hands it over, as far as the code under test reads it:
 * a pool, the path (query included) and its query_at, the headers. */
typedef struct {
    h2o_req_t req;
} fake_t;

static void fake_init(fake_t *f, const char *path)
{
    memset(f, 0, sizeof(*f));
    h2o_mem_init_pool(&f->req.pool);
    f->req.path = h2o_strdup(&f->req.pool, path, strlen(path));
    const char *q = strchr(path, '?');
    f->req.query_at = q != NULL ? (size_t)(q - path) : SIZE_MAX;
    f->req.path_normalized =
        h2o_iovec_init(f->req.path.base, q ? (size_t)(q - path) : strlen(path));
    f->req.version = 0x101;
}

static void fake_header(fake_t *f, const char *name, const char *value)
{
    h2o_add_header_by_str(&f->req.pool, &f->req.headers, name, strlen(name), 1, NULL, value,
                          strlen(value));
}

static void fake_dispose(fake_t *f)
{
    h2o_mem_clear_pool(&f->req.pool);
}

/* ?name in path, or NULL when absent. */
static const char *param(const char *path, const char *name, char *out, size_t outlen)
{
    fake_t f;
    fake_init(&f, path);
    int found = gw_query_param(&f.req, name, out, outlen);
    fake_dispose(&f);
    return found ? out : NULL;
}

/* ---- query parameters -------------------------------------------------- */

Test(http, a_query_parameter_is_found_by_its_whole_name)
{
    char v[64];
    cr_assert_str_eq(param("/v1/models?a=1&slo_ms=250&b=2", "slo_ms", v, sizeof(v)), "250");
    cr_assert_str_eq(param("/x?slo_ms=5", "slo_ms", v, sizeof(v)), "5", "the first parameter");
    cr_assert_str_eq(param("/x?a=1&slo_ms=7", "slo_ms", v, sizeof(v)), "7", "the last");
    cr_assert_null(param("/x?slo_ms_max=5&xslo_ms=6", "slo_ms", v, sizeof(v)),
                   "a longer name, or one ending in it, is another parameter");
    cr_assert_null(param("/x?slo=5", "slo_ms", v, sizeof(v)), "a prefix of the name neither");
    cr_assert_str_eq(param("/x?a=1&a=2", "a", v, sizeof(v)), "1", "the first of repeated ones");
}

Test(http, a_request_without_a_query_has_no_parameters)
{
    char v[8] = "keep";
    cr_assert_null(param("/v1/models", "pretty", v, sizeof(v)));
    cr_assert_str_eq(v, "keep", "out is left alone");
    cr_assert_null(param("/v1/models?", "pretty", v, sizeof(v)), "an empty query");
    cr_assert_null(param("/v1/models?&&", "pretty", v, sizeof(v)));
}

Test(http, a_parameter_without_a_value_is_present_and_empty)
{
    char v[8] = "junk";
    cr_assert_str_eq(param("/x?pretty", "pretty", v, sizeof(v)), "");
    strcpy(v, "junk");
    cr_assert_str_eq(param("/x?pretty=&a=1", "pretty", v, sizeof(v)), "");
    strcpy(v, "junk");
    cr_assert_str_eq(param("/x?a=1&pretty", "pretty", v, sizeof(v)), "");
    cr_assert_str_eq(param("/x?a=1&&pretty=1", "pretty", v, sizeof(v)), "1",
                     "an empty pair in between is skipped");
}

Test(http, a_value_is_url_decoded)
{
    char v[64];
    cr_assert_str_eq(param("/x?q=a%20b%2Fc", "q", v, sizeof(v)), "a b/c");
    cr_assert_str_eq(param("/x?q=a+b+c", "q", v, sizeof(v)), "a b c", "+ is a space");
    cr_assert_str_eq(param("/x?q=%2b%2B", "q", v, sizeof(v)), "++", "either hex case; %2B is +");
    cr_assert_str_eq(param("/x?q=1%3D2%26b", "q", v, sizeof(v)), "1=2&b",
                     "an encoded = or & is the value's");
    cr_assert_str_eq(param("/x?q=a=b", "q", v, sizeof(v)), "a=b", "the first = splits");
}

Test(http, a_broken_escape_is_kept_as_it_is)
{
    char v[64];
    cr_assert_str_eq(param("/x?q=100%", "q", v, sizeof(v)), "100%");
    cr_assert_str_eq(param("/x?q=%4", "q", v, sizeof(v)), "%4");
    cr_assert_str_eq(param("/x?q=%4&b=1", "q", v, sizeof(v)), "%4",
                     "an escape is not completed from the next parameter");
    cr_assert_str_eq(param("/x?q=%zz1", "q", v, sizeof(v)), "%zz1");
    cr_assert_str_eq(param("/x?q=%g1", "q", v, sizeof(v)), "%g1");
}

Test(http, a_long_value_is_cut_to_fit_and_terminated)
{
    char v[5];
    memset(v, 'X', sizeof(v));
    cr_assert_str_eq(param("/x?q=abcdefgh", "q", v, sizeof(v)), "abcd");
    memset(v, 'X', sizeof(v));
    cr_assert_str_eq(param("/x?q=%41%42%43%44%45", "q", v, sizeof(v)), "ABCD",
                     "cut after decoding: an escape is one byte");
    char one[1] = {'X'};
    cr_assert_str_eq(param("/x?q=abc", "q", one, sizeof(one)), "", "room for the NUL only");
    /* Nothing is written past outlen. */
    char guard[8] = "GGGGGGG";
    cr_assert_str_eq(param("/x?q=abcdefgh", "q", guard, 3), "ab");
    cr_assert_eq(guard[3], 'G');
}

Test(http, a_value_ends_where_the_path_does)
{
    /* h2o's path is a length, not a terminated string: what lies past it
     * is not the query's. */
    fake_t f;
    fake_init(&f, "/x?q=%41%42&r=12");
    f.req.path.len -= 6; /* "/x?q=%41%4" */
    char v[16];
    cr_assert(gw_query_param(&f.req, "q", v, sizeof(v)));
    cr_assert_str_eq(v, "A%4");
    cr_assert_not(gw_query_param(&f.req, "r", v, sizeof(v)));
    fake_dispose(&f);
}

/* ---- {version} segments ------------------------------------------------ */

static int version(const char *s)
{
    return gw_parse_version(h2o_iovec_init(s, strlen(s)));
}

Test(http, a_version_is_a_number_from_1_to_a_billion)
{
    cr_assert_eq(version("1"), 1);
    cr_assert_eq(version("42"), 42);
    cr_assert_eq(version("007"), 7, "leading zeros are digits");
    cr_assert_eq(version("1000000000"), 1000000000);
    cr_assert_eq(version("1000000001"), -1);
    cr_assert_eq(version("9999999999"), -1, "ten digits, past the range");
    cr_assert_eq(version("10000000000"), -1, "eleven digits");
    cr_assert_eq(version("18446744073709551617"), -1, "2^64 + 1 does not wrap around to 1");
    cr_assert_eq(version("0"), -1);
    cr_assert_eq(version("0000000000"), -1);
    cr_assert_eq(version(""), -1);
    cr_assert_eq(version("-1"), -1);
    cr_assert_eq(version("+1"), -1);
    cr_assert_eq(version("1a"), -1);
    cr_assert_eq(version(" 1"), -1);
    cr_assert_eq(version("v1"), -1);
    /* A segment is a length: what follows it is not read. */
    cr_assert_eq(gw_parse_version(h2o_iovec_init("12/ready", 2)), 12);
}

/* ---- headers and the body ---------------------------------------------- */

Test(http, a_header_is_found_by_its_lower_case_name)
{
    fake_t f;
    fake_init(&f, "/x");
    fake_header(&f, "content-type", "image/jpeg");
    fake_header(&f, "x-slo-ms", "250");
    fake_header(&f, "x-request-id", "first");
    fake_header(&f, "x-request-id", "second");
    h2o_iovec_t v = gw_header(&f.req, "x-slo-ms");
    cr_assert(h2o_memis(v.base, v.len, H2O_STRLIT("250")));
    v = gw_header(&f.req, "content-type");
    cr_assert(h2o_memis(v.base, v.len, H2O_STRLIT("image/jpeg")), "a token header too");
    v = gw_header(&f.req, "x-request-id");
    cr_assert(h2o_memis(v.base, v.len, H2O_STRLIT("first")), "the first of repeated ones");
    v = gw_header(&f.req, "x-slo");
    cr_assert_null(v.base, "a prefix of a name is not the name");
    cr_assert_eq(v.len, 0);
    v = gw_header(&f.req, "authorization");
    cr_assert_null(v.base);
    cr_assert_eq(v.len, 0);
    fake_dispose(&f);
}

Test(http, an_http1_body_is_read_in_place_and_an_http2_one_copied)
{
    fake_t f;
    fake_init(&f, "/x");
    static const char body[] = "\xff\xd8 jpeg bytes";
    f.req.entity = h2o_iovec_init(body, sizeof(body) - 1);
    const uint8_t *data;
    size_t len;
    uint8_t *owned = (uint8_t *)1;
    cr_assert_eq(gw_request_body(&f.req, &data, &len, &owned), 0);
    cr_assert_null(owned);
    cr_assert_eq((const char *)data, body, "HTTP/1.1: h2o's buffer");
    cr_assert_eq(len, sizeof(body) - 1);

    f.req.version = 0x200;
    cr_assert_eq(gw_request_body(&f.req, &data, &len, &owned), 0);
    cr_assert_not_null(owned, "HTTP/2: a copy (a stream reset frees h2o's)");
    cr_assert_eq(data, owned);
    cr_assert_neq((const char *)data, body);
    cr_assert_eq(len, sizeof(body) - 1);
    cr_assert_eq(memcmp(data, body, len), 0);
    free(owned);

    f.req.entity = h2o_iovec_init(NULL, 0);
    cr_assert_eq(gw_request_body(&f.req, &data, &len, &owned), 0);
    cr_assert_null(owned, "an empty HTTP/2 body: nothing to copy");
    cr_assert_eq(len, 0);
    fake_dispose(&f);
}

Test(http, a_response_header_keeps_a_copy_of_its_value)
{
    fake_t f;
    fake_init(&f, "/x");
    char value[16] = "abc-123";
    gw_add_header(&f.req, "x-request-id", value);
    strcpy(value, "overwritten");
    cr_assert_eq(f.req.res.headers.size, 1);
    ssize_t i = h2o_find_header_by_str(&f.req.res.headers, H2O_STRLIT("x-request-id"), -1);
    cr_assert_geq(i, 0);
    h2o_iovec_t v = f.req.res.headers.entries[i].value;
    cr_assert(h2o_memis(v.base, v.len, H2O_STRLIT("abc-123")), "got %.*s", (int)v.len, v.base);
    fake_dispose(&f);
}

/* ---- the route table --------------------------------------------------- */

static void route_fn(gw_call_t *call)
{
    (void)call;
}

static const gw_route_t routes[] = {
    {"GET", "/v2/health/live", "live", route_fn, GW_ON_FRONTEND},
    {"GET", "/v2/models/*", "model", route_fn, GW_ON_FRONTEND},
    {"DELETE", "/v2/models/*", "model_delete", route_fn, GW_ON_FRONTEND},
    {"GET", "/v2/models/*/ready", "model_ready", route_fn, GW_ON_FRONTEND},
    {"POST", "/v2/models/*/versions/*/infer", "infer_version", route_fn, GW_ON_FRONTEND},
    {"POST", "/v2/models/*/infer", "infer", route_fn, GW_ON_FRONTEND},
    {"GET", "/v2/models/stats", "never_reached", route_fn,
     GW_ON_FRONTEND}, /* after "/v2/models/ *" */
    {"GET", "/v2", "server", route_fn, GW_ON_FRONTEND},
    {"GET", "/", "root", route_fn, GW_ON_FRONTEND},
};

static const gw_http_app_t app = {.routes = routes, .nroutes = sizeof(routes) / sizeof(routes[0])};

typedef struct {
    const gw_route_t *route;
    gw_call_t call;
    char allow[64];
} found_t;

static found_t find(const char *method, const char *path)
{
    found_t f;
    memset(&f, 0, sizeof(f));
    strcpy(f.allow, "stale");
    f.route = gw__route_find(&app, h2o_iovec_init(method, strlen(method)),
                             h2o_iovec_init(path, strlen(path)), &f.call, f.allow, sizeof(f.allow));
    return f;
}

static void assert_arg(const found_t *f, int i, const char *want)
{
    cr_assert_lt(i, f->call.nargs);
    h2o_iovec_t a = f->call.args[i];
    cr_assert(h2o_memis(a.base, a.len, want, strlen(want)), "arg %d: got %.*s, want %s", i,
              (int)a.len, a.base, want);
}

Test(http, a_literal_pattern_matches_only_its_path)
{
    found_t f = find("GET", "/v2/health/live");
    cr_assert_not_null(f.route);
    cr_assert_str_eq(f.route->name, "live");
    cr_assert_eq(f.call.nargs, 0);
    cr_assert_null(find("GET", "/v2/health").route);
    cr_assert_null(find("GET", "/v2/health/live/x").route);
    cr_assert_null(find("GET", "/v2/health/lives").route);
    cr_assert_null(find("GET", "/v2/health/liv").route);
    cr_assert_null(find("GET", "/V2/health/live").route, "paths are case-sensitive");
    cr_assert_str_eq(find("GET", "/v2").route->name, "server");
    cr_assert_str_eq(find("GET", "/").route->name, "root");
}

Test(http, a_star_matches_one_non_empty_segment)
{
    found_t f = find("GET", "/v2/models/resnet");
    cr_assert_str_eq(f.route->name, "model");
    cr_assert_eq(f.call.nargs, 1);
    assert_arg(&f, 0, "resnet");

    f = find("GET", "/v2/models/resnet/ready");
    cr_assert_str_eq(f.route->name, "model_ready");
    assert_arg(&f, 0, "resnet");

    f = find("POST", "/v2/models/resnet/versions/3/infer");
    cr_assert_str_eq(f.route->name, "infer_version");
    cr_assert_eq(f.call.nargs, 2);
    assert_arg(&f, 0, "resnet");
    assert_arg(&f, 1, "3");

    cr_assert_null(find("GET", "/v2/models//ready").route, "an empty segment is not one");
    cr_assert_null(find("POST", "/v2/models/a/b/infer").route, "two segments are not one");
    cr_assert_null(find("POST", "/v2/models/a/versions//infer").route);
}

Test(http, trailing_slashes_are_not_significant)
{
    found_t f = find("GET", "/v2/models/resnet/");
    cr_assert_not_null(f.route);
    cr_assert_str_eq(f.route->name, "model");
    assert_arg(&f, 0, "resnet");
    cr_assert_str_eq(find("GET", "/v2/health/live///").route->name, "live");
    cr_assert_str_eq(find("GET", "/v2/").route->name, "server");
    cr_assert_str_eq(find("GET", "/").route->name, "root", "the root stays the root");
}

Test(http, the_first_matching_route_wins)
{
    found_t f = find("GET", "/v2/models/stats");
    cr_assert_str_eq(f.route->name, "model", "the '*' route is listed first");
    assert_arg(&f, 0, "stats");
}

Test(http, only_the_method_differing_names_the_allowed_methods)
{
    found_t f = find("PUT", "/v2/models/resnet");
    cr_assert_null(f.route);
    cr_assert_str_eq(f.allow, "GET, DELETE");
    f = find("POST", "/v2/models/resnet/ready");
    cr_assert_null(f.route);
    cr_assert_str_eq(f.allow, "GET");
    f = find("get", "/v2/health/live");
    cr_assert_null(f.route, "methods are case-sensitive");
    cr_assert_str_eq(f.allow, "GET");
    f = find("DELETE", "/v2/models/stats");
    cr_assert_str_eq(f.route->name, "model_delete");
    f = find("POST", "/v2/models/stats");
    cr_assert_null(f.route);
    cr_assert_str_eq(f.allow, "GET, DELETE", "GET once, though two GET routes match");
}

Test(http, no_matching_pattern_leaves_allow_empty)
{
    found_t f = find("GET", "/v3/models");
    cr_assert_null(f.route);
    cr_assert_str_eq(f.allow, "", "a 404, not a 405");
    f = find("GET", "");
    cr_assert_null(f.route);
    cr_assert_str_eq(f.allow, "");
}

Test(http, allow_never_overflows_its_buffer)
{
    static const gw_route_t many[] = {
        {"GET", "/a", "1", route_fn, GW_ON_FRONTEND},
        {"POST", "/a", "2", route_fn, GW_ON_FRONTEND},
        {"DELETE", "/a", "3", route_fn, GW_ON_FRONTEND},
        {"PUT", "/a", "4", route_fn, GW_ON_FRONTEND},
        {"PATCH", "/a", "5", route_fn, GW_ON_FRONTEND},
        {"OPTIONS", "/a", "6", route_fn, GW_ON_FRONTEND},
        {"TRACE", "/a", "7", route_fn, GW_ON_FRONTEND},
        {"CONNECT", "/a", "8", route_fn, GW_ON_FRONTEND},
        {"PROPFIND", "/a", "9", route_fn, GW_ON_FRONTEND},
    };
    gw_http_app_t a = {.routes = many, .nroutes = sizeof(many) / sizeof(many[0])};
    gw_call_t call;
    char allow[24];
    memset(allow, 'Z', sizeof(allow));
    cr_assert_null(gw__route_find(&a, h2o_iovec_init(H2O_STRLIT("HEAD")),
                                  h2o_iovec_init(H2O_STRLIT("/a")), &call, allow, sizeof(allow)));
    cr_assert_lt(strlen(allow), sizeof(allow));
    cr_assert_eq(strncmp(allow, "GET, POST", 9), 0, "got %s", allow);
}

/* allow's room is counted for the method at hand: "GET, PATCH, PUT" (15)
 * and ", OPTIONS" (9) fill 24 bytes, and the NUL would be the 25th. */
Test(http, a_long_method_is_left_out_of_allow_rather_than_overflow_it)
{
    static const gw_route_t r[] = {
        {"GET", "/a", "1", route_fn, GW_ON_FRONTEND},
        {"PATCH", "/a", "2", route_fn, GW_ON_FRONTEND},
        {"PUT", "/a", "3", route_fn, GW_ON_FRONTEND},
        {"OPTIONS", "/a", "4", route_fn, GW_ON_FRONTEND},
    };
    gw_http_app_t a = {.routes = r, .nroutes = 4};
    gw_call_t call;
    char buf[32];
    memset(buf, 'Z', sizeof(buf));
    cr_assert_null(gw__route_find(&a, h2o_iovec_init(H2O_STRLIT("HEAD")),
                                  h2o_iovec_init(H2O_STRLIT("/a")), &call, buf, 24));
    cr_assert_eq(buf[24], 'Z', "nothing written past allowlen");
    cr_assert_str_eq(buf, "GET, PATCH, PUT");
}

Test(http, a_pattern_has_at_most_the_args_a_call_holds)
{
    char pattern[64] = "", path[64] = "";
    for (int i = 0; i <= GW_MAX_ROUTE_ARGS; i++) {
        strcat(pattern, "/*");
        strcat(path, "/s");
    }
    gw_route_t r[] = {{"GET", pattern, "deep", route_fn, GW_ON_FRONTEND}};
    gw_http_app_t a = {.routes = r, .nroutes = 1};
    gw_call_t call;
    char allow[64];
    cr_assert_null(gw__route_find(&a, h2o_iovec_init(H2O_STRLIT("GET")),
                                  h2o_iovec_init(path, strlen(path)), &call, allow, sizeof(allow)),
                   "one '*' more than GW_MAX_ROUTE_ARGS never matches");
    cr_assert_leq(call.nargs, GW_MAX_ROUTE_ARGS);
}

/* ---- the admin token ---------------------------------------------------- */

static gw_http_ctx_t *http_with_token(const char *token)
{
    static gw_http_ctx_t ctx;
    memset(&ctx, 0, sizeof(ctx));
    snprintf(ctx.cfg.admin_token, sizeof(ctx.cfg.admin_token), "%s", token);
    return &ctx;
}

static int matches(const gw_http_ctx_t *ctx, const char *presented)
{
    return gw_token_matches(ctx->cfg.admin_token, presented, strlen(presented));
}

Test(http, only_the_exact_admin_token_matches)
{
    const char *tok = "0123456789abcdef0123456789abcdef";
    gw_http_ctx_t *http = http_with_token(tok);
    cr_assert(matches(http, tok));
    cr_assert_not(matches(http, "0123456789abcdef0123456789abcdeX"), "the last byte differs");
    cr_assert_not(matches(http, "X123456789abcdef0123456789abcdef"), "the first byte differs");
    cr_assert_not(matches(http, "0123456789abcdef"), "a prefix");
    cr_assert_not(matches(http, "0123456789abcdef0123456789abcdef0"), "one byte more");
    cr_assert_not(matches(http, ""), "empty");
    cr_assert_not(matches(http, "0123456789ABCDEF0123456789ABCDEF"), "case matters");
    /* The length is the caller's: a header value is not terminated. */
    char header[64];
    snprintf(header, sizeof(header), "%s, more", tok);
    cr_assert(gw_token_matches(http->cfg.admin_token, header, strlen(tok)));
    cr_assert_not(gw_token_matches(http->cfg.admin_token, header, strlen(tok) + 1));
    /* A presented token with a NUL inside is not the token cut there. */
    char nul[40];
    memcpy(nul, tok, 16);
    nul[16] = '\0';
    memcpy(nul + 17, tok + 17, 15);
    cr_assert_not(gw_token_matches(http->cfg.admin_token, nul, 32));
}

Test(http, the_admin_check_takes_a_bearer_token_in_any_case)
{
    const char *tok = "0123456789abcdef0123456789abcdef";
    gw_http_ctx_t *http = http_with_token(tok);
    const char *ok[] = {"Bearer ", "bearer ", "BEARER "};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        fake_t f;
        fake_init(&f, "/models");
        char v[96];
        snprintf(v, sizeof(v), "%s%s", ok[i], tok);
        fake_header(&f, "authorization", v);
        gw_call_t call = {.req = &f.req, .http = http};
        cr_assert(gw_require_admin(&call), "%s", v);
        cr_assert_eq(f.req.res.headers.size, 0, "nothing sent");
        fake_dispose(&f);
    }
}

Test(http, every_status_has_its_standard_reason_phrase)
{
    cr_assert_str_eq(gw_http_reason(200), "OK");
    cr_assert_str_eq(gw_http_reason(201), "Created");
    cr_assert_str_eq(gw_http_reason(202), "Accepted");
    cr_assert_str_eq(gw_http_reason(400), "Bad Request");
    cr_assert_str_eq(gw_http_reason(401), "Unauthorized");
    cr_assert_str_eq(gw_http_reason(404), "Not Found");
    cr_assert_str_eq(gw_http_reason(405), "Method Not Allowed");
    cr_assert_str_eq(gw_http_reason(409), "Conflict");
    cr_assert_str_eq(gw_http_reason(413), "Request Entity Too Large"); /* as h2o says it */
    cr_assert_str_eq(gw_http_reason(415), "Unsupported Media Type");
    cr_assert_str_eq(gw_http_reason(422), "Unprocessable Entity");
    cr_assert_str_eq(gw_http_reason(431), "Request Header Fields Too Large");
    cr_assert_str_eq(gw_http_reason(500), "Internal Server Error");
    cr_assert_str_eq(gw_http_reason(503), "Service Unavailable");
    /* A status outside the table gets its class's name, never "OK". */
    cr_assert_str_eq(gw_http_reason(299), "Success");
    cr_assert_str_eq(gw_http_reason(499), "Client Error");
    cr_assert_str_eq(gw_http_reason(42), "Unknown");
    /* Every status an error maps to is in the table. */
    static const char *const classes[] = {"Success", "Client Error", "Server Error"};
    for (int e = 0; e < SQ_ERR_COUNT_; e++) {
        const char *reason = gw_http_reason(sq_err_http_status(-e));
        for (size_t k = 0; k < sizeof(classes) / sizeof(classes[0]); k++)
            cr_assert_str_neq(reason, classes[k], "%s: status %d has no phrase", sq_err_name(-e),
                              sq_err_http_status(-e));
    }
}

/* ---- the room's context ------------------------------------------------- */

Test(http, the_context_copies_the_settings_and_the_token_once)
{
    gw_config_t cfg = {.listen_port = 8123,
                       .http_threads = 3,
                       .max_connections = 77,
                       .max_header_kb = 9,
                       .http_request_timeout_ms = 4500,
                       .max_body_bytes = 12345,
                       .role = GW_ROLE_ALL};
    snprintf(cfg.listen_host, sizeof(cfg.listen_host), "::1");
    snprintf(cfg.port_file, sizeof(cfg.port_file), "/tmp/port");
    static gw_server_t srv;
    memset(&srv, 0, sizeof(srv));
    srv.cfg = &cfg;
    snprintf(srv.admin_token, sizeof(srv.admin_token), "0123456789abcdef");
    gw_http_deps_t deps = gw_http_deps(&srv);
    gw_http_ctx_t ctx;
    gw__http_ctx_fill(&ctx, &deps);
    cr_assert_str_eq(ctx.cfg.listen_host, "::1");
    cr_assert_eq(ctx.cfg.listen_port, 8123);
    cr_assert_str_eq(ctx.cfg.port_file, "/tmp/port");
    cr_assert_eq(ctx.cfg.http_threads, 3);
    cr_assert_eq(ctx.cfg.max_connections, 77);
    cr_assert_eq(ctx.cfg.max_header_kb, 9);
    cr_assert_eq(ctx.cfg.http_request_timeout_ms, 4500);
    cr_assert_eq(ctx.cfg.max_body_bytes, 12345);
    cr_assert_str_eq(ctx.cfg.admin_token, "0123456789abcdef");
    srv.admin_token[0] = 'X';
    cfg.max_connections = 1;
    cr_assert_str_eq(ctx.cfg.admin_token, "0123456789abcdef", "a copy, made once");
    cr_assert_eq(ctx.cfg.max_connections, 77, "a copy, made once");
}

Test(http, only_a_frontend_forwards_and_stopping_is_the_servers_flag)
{
    static gw_config_t cfg;
    static gw_server_t srv;
    memset(&srv, 0, sizeof(srv));
    srv.cfg = &cfg;
    gw_http_ctx_t ctx;
    const int roles[] = {GW_ROLE_ALL, GW_ROLE_DISPATCHER, GW_ROLE_FRONTEND};
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        cfg.role = roles[i];
        gw_http_deps_t deps = gw_http_deps(&srv);
        gw__http_ctx_fill(&ctx, &deps);
        cr_assert_eq(ctx.cfg.frontend, roles[i] == GW_ROLE_FRONTEND, "role %d", roles[i]);
    }
    cr_assert_not(atomic_load(ctx.stopping));
    atomic_store(&srv.stopping, 1); /* SIGTERM, after the room was made */
    cr_assert(atomic_load(ctx.stopping), "read live, not copied");
    atomic_store(ctx.http_port, 8000);
    cr_assert_eq(atomic_load(&srv.http_port), 8000, "the bound port is published to the server");
}

static void forward_fn(gw_call_t *call)
{
    (void)call;
}

Test(http, a_frontend_forwards_what_its_route_table_sends_to_the_dispatcher)
{
    static const gw_route_t table[] = {
        {"GET", "/v2/models/*/ready", "ready", route_fn, GW_ON_FRONTEND},
        {"GET", "/v2/models/*", "model", route_fn, GW_TO_DISPATCHER},
        {"POST", "/v2/repository/models/*/load", "load", route_fn, GW_TO_DISPATCHER},
    };
    gw_http_app_t a = {.routes = table, .nroutes = 3, .forward = forward_fn};
    cr_assert(gw_http_forwarded(&a, "GET", "/v2/models/m"));
    cr_assert(gw_http_forwarded(&a, "GET", "/v2/models/m/"), "a trailing slash is no matter");
    cr_assert(gw_http_forwarded(&a, "POST", "/v2/repository/models/m/load"));
    cr_assert_not(gw_http_forwarded(&a, "GET", "/v2/models/m/ready"), "served by the frontend");
    cr_assert_not(gw_http_forwarded(&a, "POST", "/v2/models/m"), "no route for that method");
    cr_assert_not(gw_http_forwarded(&a, "GET", "/v3"), "no route at all");
    a.forward = NULL; /* not a frontend's app */
    cr_assert_not(gw_http_forwarded(&a, "GET", "/v2/models/m"));
}
