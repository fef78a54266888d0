/* gateway/link/cluster.c: the cluster listener accepts with the peer's
 * address, a bad --cluster-listen names the flag, and a remote peer is
 * refused anything but AUTH_CHALLENGE before it authenticates (a HELLO or
 * a frontend's FE_HELLO without the token). */
#include "gw_link.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

Test(cluster, accept_gives_the_peers_address)
{
    int lfd = -1;
    char bound[128], err[256];
    cr_assert_eq(gw_cluster_listen("127.0.0.1:0", &lfd, bound, sizeof(bound), err, sizeof(err)), 0,
                 "%s", err);
    int port = 0;
    cr_assert_eq(sscanf(bound, "127.0.0.1:%d", &port), 1, "bound %s", bound);
    cr_assert_gt(port, 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(c, (struct sockaddr *)&sa, sizeof(sa)), 0);
    struct sockaddr_in me;
    socklen_t ml = sizeof(me);
    getsockname(c, (struct sockaddr *)&me, &ml);
    char addr[64], want[64];
    int fd = -1;
    for (int i = 0; i < 100 && fd < 0; i++) {
        fd = gw_cluster_accept(lfd, addr, sizeof(addr));
        if (fd < 0)
            usleep(10000);
    }
    cr_assert_geq(fd, 0);
    snprintf(want, sizeof(want), "127.0.0.1:%d", ntohs(me.sin_port));
    cr_assert_str_eq(addr, want);
    close(fd);
    close(c);
    close(lfd);
}

Test(cluster, a_bad_listen_address_names_the_flag)
{
    int lfd = -1;
    char bound[128], err[256] = "";
    cr_assert_eq(gw_cluster_listen("not an address", &lfd, bound, sizeof(bound), err, sizeof(err)),
                 SQ_BAD_CONFIG);
    cr_assert(strncmp(err, "--cluster-listen", 16) == 0, "%s", err);
}

static int before_hello(gw_remote_t *r, uint16_t type, char *why, size_t len)
{
    sq_frame_t f = {.type = type, .payload = (const uint8_t *)"", .len = 0};
    return gw_remote_before_hello(r, NULL, &f, why, len);
}

Test(cluster, nothing_but_the_challenge_before_authentication)
{
    const uint8_t token[] = "0123456789abcdef0123456789abcdef";
    const uint16_t types[] = {SQ_MSG_HELLO, SQ_MSG_FE_HELLO, SQ_MSG_MODELS_HELD, SQ_MSG_AUTH_PROOF};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        gw_remote_t *r = gw_remote_new(token, sizeof(token) - 1, "10.0.0.9:4000");
        cr_assert_str_eq(gw_remote_addr(r), "10.0.0.9:4000");
        char why[200] = "";
        cr_assert_eq(before_hello(r, types[i], why, sizeof(why)), SQ_UNAUTHORIZED, "type %u",
                     types[i]);
        cr_assert_neq(why[0], '\0');
        int n = -1;
        gw_remote_held(r, &n);
        cr_assert_eq(n, 0);
        gw_remote_free(r);
    }
}
