/* The admin token: loaded or created at start, compared in constant time,
 * and required of the admin routes (gw_require_admin). */
#include "http_int.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* The token with its NUL: 64 hex digits when made here. */
#define TOKEN_CAP ((size_t)65)

static int read_token(const char *path, char token[TOKEN_CAP], int fd, char *err, size_t errlen)
{
    char buf[128];
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return SQ_IO;
    }
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    if (n < 16 || (size_t)n >= TOKEN_CAP) {
        snprintf(err, errlen, "%s: the token must be 16 to %zu characters", path, TOKEN_CAP - 1);
        return SQ_BAD_CONFIG;
    }
    memcpy(token, buf, (size_t)n + 1);
    return 0;
}

int gw_token_load(const char *path, char token[TOKEN_CAP], char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
            close(fd);
            snprintf(err, errlen,
                     "%s: the admin token file must be a regular file readable only by its "
                     "owner (chmod 600)",
                     path);
            return SQ_BAD_CONFIG;
        }
        int rc = read_token(path, token, fd, err, errlen);
        close(fd);
        return rc;
    }
    if (errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return SQ_IO;
    }
    uint8_t raw[32];
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return SQ_IO;
    }
    sq_hex_encode(raw, sizeof(raw), token);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return SQ_IO;
    }
    size_t len = strlen(token);
    int ok = write(fd, token, len) == (ssize_t)len && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    close(fd);
    if (!ok) {
        unlink(path);
        snprintf(err, errlen, "%s: cannot write", path);
        return SQ_IO;
    }
    SQ_INFO("created the admin token file=%s (send it as 'Authorization: Bearer <token>')", path);
    return 0;
}

int gw_token_matches(const char *admin_token, const char *presented, size_t len)
{
    size_t want = strlen(admin_token);
    unsigned diff = (unsigned)(len ^ want);
    for (size_t i = 0; i < want; i++)
        diff |= (unsigned char)admin_token[i] ^ (unsigned char)(i < len ? presented[i] : 0);
    return diff == 0;
}

int gw_require_admin(gw_call_t *call)
{
    h2o_iovec_t v = gw_header(call->req, "authorization");
    static const char bearer[] = "Bearer ";
    if (v.len > sizeof(bearer) - 1 && strncasecmp(v.base, bearer, sizeof(bearer) - 1) == 0 &&
        gw_token_matches(call->http->cfg.admin_token, v.base + sizeof(bearer) - 1,
                         v.len - (sizeof(bearer) - 1)))
        return 1;
    gw_add_header(call->req, "www-authenticate", "Bearer realm=\"squish\"");
    gw_send_error(call->req, SQ_UNAUTHORIZED,
                  v.len == 0 ? "this route needs 'Authorization: Bearer <admin token>'"
                             : "invalid bearer token");
    return 0;
}
