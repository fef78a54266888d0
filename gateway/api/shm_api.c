/* Triton's shared-memory extension, its routes (the regions: shm_regions.c):
 *
 *   GET  /v2/systemsharedmemory[/region/{r}]/status
 *   POST /v2/systemsharedmemory/region/{r}/register   {"key", "offset"?, "byte_size"}
 *   POST /v2/systemsharedmemory[/region/{r}]/unregister
 *
 * and the same under /v2/cudasharedmemory, answered as a server without
 * CUDA IPC: no region is ever registered there, and a register is refused
 * with 400 saying why (Triton's clients call them, e.g. to clear both kinds
 * at start).
 *
 * All of them need the admin token: registering makes squishd map and write
 * any shared-memory object its user can open, and the status names them;
 * Triton's clients send it with headers={"Authorization": "Bearer ..."}.
 * Using a registered region in an inference needs no token. */
#include "api_int.h"
#include "shm_int.h"
#include "gw_http.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gw_shm_name_why(const char *name, size_t len, char *why, size_t whylen)
{
    if (gw_shm_name_ok(name, len))
        return 0;
    snprintf(why, whylen,
             "region name '%.*s': expected 1..%d of the characters A-Z a-z 0-9 . _ ~ -",
             (int)(len < GW_SHM_NAME_MAX ? len : GW_SHM_NAME_MAX), name, GW_SHM_NAME_MAX);
    return SQ_BAD_REQUEST;
}

int gw_shm_status_why(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len)
{
    *out = gw_shm_status(api->shm, name);
    if (*out != NULL)
        return 0;
    snprintf(why, len,
             "Unable to find system shared memory region: '%s' (GET "
             "/v2/systemsharedmemory/status lists those registered)",
             name);
    return SQ_NOT_FOUND;
}

/* The region name of the path (args[0]) into out; replies 400 and returns
 * -1 when it is not a valid name. */
static int region_arg(gw_call_t *call, char *out)
{
    h2o_iovec_t a = call->args[0];
    char why[GW_SHM_NAME_MAX + 160];
    if (gw_shm_name_why(a.base, a.len, why, sizeof(why)) != 0) {
        gw_send_error(call->req, SQ_BAD_REQUEST, why);
        return -1;
    }
    memcpy(out, a.base, a.len);
    out[a.len] = '\0';
    return 0;
}

/* A register body's unsigned integer member: 0 with *out (def when absent
 * and not required), or -1 with why. */
static int body_uint(json_t *body, const char *key, int required, uint64_t def, uint64_t *out,
                     char *why, size_t len)
{
    json_t *v = json_object_get(body, key);
    if (v == NULL) {
        if (required) {
            snprintf(why, len, "shared memory register request has no '%s' field", key);
            return -1;
        }
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        snprintf(why, len, "%s: expected an integer >= 0", key);
        return -1;
    }
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

void gw_route_shm_status(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    char name[GW_SHM_NAME_MAX + 1];
    if (call->nargs > 0 && region_arg(call, name) != 0)
        return;
    json_t *status;
    char why[GW_SHM_NAME_MAX + 128];
    if (gw_shm_status_why(api, call->nargs > 0 ? name : NULL, &status, why, sizeof(why)) != 0) {
        gw_send_error(call->req, SQ_NOT_FOUND, why);
        return;
    }
    gw_send_json(call->req, 200, status);
}

void gw_route_shm_register(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    char name[GW_SHM_NAME_MAX + 1];
    if (region_arg(call, name) != 0)
        return;
    const uint8_t *data;
    size_t len;
    uint8_t *owned = NULL;
    if (gw_request_body(call->req, &data, &len, &owned) != 0) {
        gw_send_error(call->req, SQ_OVERLOAD, "no memory for the request body");
        return;
    }
    json_error_t jerr;
    json_t *body = json_loadb((const char *)data, len, 0, &jerr);
    free(owned);
    char why[512];
    if (body == NULL || !json_is_object(body)) {
        if (body == NULL)
            snprintf(why, sizeof(why), "invalid JSON at byte %d: %s", jerr.position, jerr.text);
        else
            snprintf(why, sizeof(why),
                     "expected a JSON object {\"key\", \"offset\", \"byte_size\"}");
        json_decref(body);
        gw_send_error(call->req, SQ_BAD_JSON, why);
        return;
    }
    json_t *key = json_object_get(body, "key");
    uint64_t offset = 0, byte_size = 0;
    int rc = 0;
    if (key == NULL) {
        snprintf(why, sizeof(why), "shared memory register request has no 'key' field");
        rc = SQ_BAD_REQUEST;
    } else if (!json_is_string(key) || strlen(json_string_value(key)) != json_string_length(key)) {
        snprintf(why, sizeof(why), "key: expected the name of a shared-memory object (a string)");
        rc = SQ_BAD_REQUEST;
    } else if (body_uint(body, "offset", 0, 0, &offset, why, sizeof(why)) != 0 ||
               body_uint(body, "byte_size", 1, 0, &byte_size, why, sizeof(why)) != 0) {
        rc = SQ_BAD_REQUEST;
    } else {
        rc = gw_shm_register(api->shm, name, json_string_value(key), offset, byte_size, why,
                             sizeof(why));
    }
    json_decref(body);
    if (rc != 0) {
        gw_send_error(call->req, rc, why);
        return;
    }
    json_t *status = gw_shm_status(api->shm, name);
    /* Unregistered again at once by another request: still registered here. */
    gw_send_json(call->req, 200,
                 status != NULL && json_array_size(status) == 1
                     ? json_incref(json_array_get(status, 0))
                     : json_object());
    json_decref(status);
}

void gw_route_shm_unregister(gw_call_t *call)
{
    gw_api_ctx_t *api = call->app;
    if (!gw_require_admin(call))
        return;
    char name[GW_SHM_NAME_MAX + 1];
    if (call->nargs > 0 && region_arg(call, name) != 0)
        return;
    json_t *gone = gw_shm_unregister(api->shm, call->nargs > 0 ? name : NULL);
    gw_send_json(call->req, 200, json_pack("{s:o}", "unregistered", gone));
}

/* ---- CUDA shared memory: none, ever --------------------------------------- */

#define NO_CUDA_IPC                                                                                \
    "squish does not support CUDA shared memory (CUDA IPC handles): register the tensor in "       \
    "host memory with POST /v2/systemsharedmemory/region/{name}/register instead"

int gw_cudashm_status_why(gw_api_ctx_t *api, const char *name, json_t **out, char *why, size_t len)
{
    *out = NULL;
    if (name == NULL) {
        *out = json_array();
        return 0;
    }
    int rc = gw_shm_name_why(name, strlen(name), why, len);
    if (rc != 0)
        return rc;
    json_t *system = gw_shm_status(api->shm, name);
    if (system != NULL)
        snprintf(why, len,
                 "The region named '%s' is registered as system shared memory, not CUDA shared "
                 "memory",
                 name);
    else
        snprintf(why, len, "Unable to find cuda shared memory region: '%s' (%s)", name,
                 NO_CUDA_IPC);
    json_decref(system);
    return SQ_NOT_FOUND;
}

int gw_cudashm_register_why(const char *name, char *why, size_t len)
{
    int rc = gw_shm_name_why(name, strlen(name), why, len);
    if (rc != 0)
        return rc;
    snprintf(why, len, "failed to register CUDA shared memory region '%s': %s", name, NO_CUDA_IPC);
    return SQ_BAD_REQUEST;
}

int gw_cudashm_unregister_why(const char *name, char *why, size_t len)
{
    return name != NULL ? gw_shm_name_why(name, strlen(name), why, len) : 0;
}

void gw_route_cudashm_status(gw_call_t *call)
{
    if (!gw_require_admin(call))
        return;
    char name[GW_SHM_NAME_MAX + 1];
    if (call->nargs > 0 && region_arg(call, name) != 0)
        return;
    char why[GW_SHM_NAME_MAX + 320];
    json_t *status;
    int rc =
        gw_cudashm_status_why(call->app, call->nargs > 0 ? name : NULL, &status, why, sizeof(why));
    if (rc != 0)
        gw_send_error(call->req, rc, why);
    else
        gw_send_json(call->req, 200, status);
}

void gw_route_cudashm_register(gw_call_t *call)
{
    if (!gw_require_admin(call))
        return;
    char name[GW_SHM_NAME_MAX + 1];
    if (region_arg(call, name) != 0)
        return;
    char why[GW_SHM_NAME_MAX + 320];
    gw_send_error(call->req, gw_cudashm_register_why(name, why, sizeof(why)), why);
}

/* Nothing to unregister, which is no error (as Triton's unregister of a
 * name it does not hold). */
void gw_route_cudashm_unregister(gw_call_t *call)
{
    if (!gw_require_admin(call))
        return;
    char name[GW_SHM_NAME_MAX + 1];
    if (call->nargs > 0 && region_arg(call, name) != 0)
        return;
    gw_send_json(call->req, 200, json_pack("{s:[]}", "unregistered"));
}
