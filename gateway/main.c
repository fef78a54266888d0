#include "gw.h"

#include <stdio.h>

extern char **environ;

int main(int argc, char **argv)
{
    gw_config_t cfg;
    gw_config_action_t action;
    char err[512];
    if (gw_config_parse(&cfg, argc, argv, environ, &action, err, sizeof(err)) != 0) {
        fprintf(stderr, "squishd: %s\n", err);
        return 2;
    }
    if (action == GW_CONFIG_HELP) {
        gw_config_usage(stdout);
        return 0;
    }
    if (action == GW_CONFIG_VERSION) {
        printf("squishd %s (protocol %d)\n", SQUISH_VERSION, SQ_IPC_VERSION);
        return 0;
    }
    return gw_main(&cfg);
}
