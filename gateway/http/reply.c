/* Answers: the reason phrase of each status, response headers, and the
 * JSON and error bodies every route sends (through gw_send_body). */
#include "http_int.h"

#include <string.h>

/* The reason phrases of RFC 9110, for every status squishd answers with and
 * a few more. 413 and 422 go by their older names: h2o itself answers a
 * Content-Length over --max-body-mb with 413 "Request Entity Too Large"
 * before any route sees the request, and a client must read one phrase for
 * one status. */
static const struct {
    int status;
    const char *reason;
} reasons[] = {
    {100, "Continue"},
    {101, "Switching Protocols"},
    {200, "OK"},
    {201, "Created"},
    {202, "Accepted"},
    {204, "No Content"},
    {206, "Partial Content"},
    {301, "Moved Permanently"},
    {302, "Found"},
    {303, "See Other"},
    {304, "Not Modified"},
    {307, "Temporary Redirect"},
    {308, "Permanent Redirect"},
    {400, "Bad Request"},
    {401, "Unauthorized"},
    {403, "Forbidden"},
    {404, "Not Found"},
    {405, "Method Not Allowed"},
    {406, "Not Acceptable"},
    {408, "Request Timeout"},
    {409, "Conflict"},
    {410, "Gone"},
    {411, "Length Required"},
    {412, "Precondition Failed"},
    {413, "Request Entity Too Large"},
    {414, "URI Too Long"},
    {415, "Unsupported Media Type"},
    {416, "Range Not Satisfiable"},
    {417, "Expectation Failed"},
    {421, "Misdirected Request"},
    {422, "Unprocessable Entity"},
    {425, "Too Early"},
    {426, "Upgrade Required"},
    {428, "Precondition Required"},
    {429, "Too Many Requests"},
    {431, "Request Header Fields Too Large"},
    {451, "Unavailable For Legal Reasons"},
    {500, "Internal Server Error"},
    {501, "Not Implemented"},
    {502, "Bad Gateway"},
    {503, "Service Unavailable"},
    {504, "Gateway Timeout"},
    {505, "HTTP Version Not Supported"},
    {507, "Insufficient Storage"},
};

const char *gw_http_reason(int status)
{
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (reasons[i].status == status)
            return reasons[i].reason;
    /* A status without a phrase here: its class's (RFC 9110 15.1). */
    static const char *const classes[] = {"Informational", "Success", "Redirection", "Client Error",
                                          "Server Error"};
    return status >= 100 && status < 600 ? classes[status / 100 - 1] : "Unknown";
}

void gw_add_header(h2o_req_t *req, const char *name, const char *value)
{
    /* h2o keeps the pointers until the response is sent: the value is often
     * a caller's stack buffer, so it is copied into the request's pool. */
    h2o_iovec_t v = h2o_strdup(&req->pool, value, strlen(value));
    h2o_add_header_by_str(&req->pool, &req->res.headers, name, strlen(name), 1, NULL, v.base,
                          v.len);
}

void gw_send_json(h2o_req_t *req, int status, json_t *obj)
{
    /* Reals as the shortest text that reads back (sq_json.h): 0.025, not
     * 0.025000000000000001. ?pretty (any value but 0 or false) indents for
     * a reader. */
    char pretty[8];
    int indent = gw_query_param(req, "pretty", pretty, sizeof(pretty)) &&
                 strcmp(pretty, "0") != 0 && strcmp(pretty, "false") != 0;
    sq_buf_t text;
    sq_buf_init(&text);
    if (sq_json_dump_buf(obj, indent ? JSON_INDENT(2) : JSON_COMPACT, &text) != 0)
        sq_buf_put(&text, "{}", 2); /* a reply tree nests a few levels: a bug */
    sq_buf_put_u8(&text, '\n');
    json_decref(obj);
    req->res.status = status;
    req->res.reason = gw_http_reason(status);
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL,
                   H2O_STRLIT("application/json"));
    gw_send_body(req, text.data, text.len);
    sq_buf_dispose(&text);
}

void gw_send_error(h2o_req_t *req, int err, const char *detail)
{
    gw_send_error_retry(req, err, detail, 1);
}

void gw_send_error_retry(h2o_req_t *req, int err, const char *detail, int retry)
{
    int status = sq_err_http_status(err);
    if (status == 503 && retry)
        gw_add_header(req, "retry-after", "1");
    gw_send_json(req, status,
                 json_pack("{s:s, s:s}", "error", detail ? detail : sq_err_msg(err), "code",
                           sq_err_name(err)));
}
