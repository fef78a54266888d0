#include <criterion/criterion.h>
#include <gw.h>

#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

static int parse(gw_config_t *cfg, char **argv, char **envp, char *err)
{
    int argc = 0;
    while (argv[argc] != NULL)
        argc++;
    gw_config_action_t action;
    return gw_config_parse(cfg, argc, argv, envp, &action, err, 512);
}

Test(config, defaults_are_the_embedded_setup)
{
    gw_config_t cfg;
    char err[512];
    char *argv[] = {"squishd", NULL};
    cr_assert_eq(parse(&cfg, argv, NULL, err), 0, "%s", err);
    cr_assert_str_eq(cfg.listen_host, "127.0.0.1");
    cr_assert_eq(cfg.listen_port, 8000);
    cr_assert_str_eq(cfg.db_path, "var/squish.db");
    cr_assert_eq(cfg.ngroups, 1);
    cr_assert_str_eq(cfg.groups[0].kind, "cpu");
    cr_assert_eq(cfg.groups[0].count, 1);
    cr_assert_eq(cfg.max_body_bytes, 512ll << 20);
    cr_assert_eq(cfg.log_level, SQ_LOG_INFO);
    cr_assert_eq(cfg.max_inflight, 4096);
    cr_assert_eq(cfg.max_connections, 4096);
    cr_assert_eq(cfg.http_request_timeout_ms, 10000);
    cr_assert_eq(cfg.max_header_kb, 32);
}

Test(config, admission_limits_are_settings)
{
    gw_config_t cfg;
    char err[512];
    char *argv[] = {"squishd", "--max-inflight",  "8",  "--http-request-timeout-ms",
                    "2500",    "--max-header-kb", "16", NULL};
    char *envp[] = {"SQUISH_MAX_CONNECTIONS=64", NULL};
    cr_assert_eq(parse(&cfg, argv, envp, err), 0, "%s", err);
    cr_assert_eq(cfg.max_inflight, 8);
    cr_assert_eq(cfg.max_connections, 64);
    cr_assert_eq(cfg.http_request_timeout_ms, 2500);
    cr_assert_eq(cfg.max_header_kb, 16);
    char *too_big[] = {"squishd", "--max-header-kb", "500", NULL};
    cr_assert_neq(parse(&cfg, too_big, envp, err), 0);
    cr_assert_not_null(strstr(err, "--max-header-kb"), "%s", err);
}

Test(config, flags_override_environment_which_overrides_the_file)
{
    char path[] = "/tmp/squish-config-XXXXXX";
    int fd = mkstemp(path);
    const char *json = "{\"listen\": \"0.0.0.0:9000\", \"http_threads\": 3, \"db\": \"/tmp/f.db\"}";
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    gw_config_t cfg;
    char err[512];
    char cfgflag[64];
    snprintf(cfgflag, sizeof(cfgflag), "--config=%s", path);
    char *argv[] = {"squishd", cfgflag, "--db", "/tmp/flag.db", "--workers", "cpu:1,emu:4", NULL};
    char *envp[] = {"SQUISH_HTTP_THREADS=5", "SQUISH_DB=/tmp/env.db", NULL};
    cr_assert_eq(parse(&cfg, argv, envp, err), 0, "%s", err);
    cr_assert_str_eq(cfg.listen_host, "0.0.0.0");
    cr_assert_eq(cfg.listen_port, 9000);
    cr_assert_eq(cfg.http_threads, 5, "env beats file");
    cr_assert_str_eq(cfg.db_path, "/tmp/flag.db", "flag beats env");
    cr_assert_eq(cfg.ngroups, 2);
    cr_assert_str_eq(cfg.groups[1].kind, "emu");
    cr_assert_eq(cfg.groups[1].count, 4);
    unlink(path);
}

#define EXPECT_ERROR(argv_, envp_, needle)                                                         \
    do {                                                                                           \
        gw_config_t cfg_;                                                                          \
        char err_[512] = "";                                                                       \
        cr_assert_eq(parse(&cfg_, argv_, envp_, err_), SQ_BAD_CONFIG);                             \
        cr_assert(strstr(err_, needle) != NULL, "'%s' does not name '%s'", err_, needle);          \
    } while (0)

Test(config, an_ipv6_listen_address_is_bracketed_and_stored_bare)
{
    gw_config_t cfg;
    char err[512] = "";
    char *argv[] = {"squishd", "--listen", "[::1]:8001", NULL};
    cr_assert_eq(parse(&cfg, argv, NULL, err), 0, "%s", err);
    cr_assert_str_eq(cfg.listen_host, "::1");
    cr_assert_eq(cfg.listen_port, 8001);
    char *bare[] = {"squishd", "--listen", "::1:8001", NULL};
    EXPECT_ERROR(bare, NULL, "[IPV6]:PORT");
}

Test(config, bad_values_are_rejected_with_the_field_name)
{
    char *a1[] = {"squishd", "--http-threads", "0", NULL};
    EXPECT_ERROR(a1, NULL, "--http-threads");
    char *a2[] = {"squishd", "--listen", "localhost", NULL};
    EXPECT_ERROR(a2, NULL, "--listen");
    char *a3[] = {"squishd", "--listen", "127.0.0.1:70000", NULL};
    EXPECT_ERROR(a3, NULL, "--listen");
    char *a4[] = {"squishd", "--workers", "tpu:2", NULL};
    EXPECT_ERROR(a4, NULL, "--workers");
    char *a5[] = {"squishd", "--workers", "emu:0", NULL};
    EXPECT_ERROR(a5, NULL, "--workers");
    char *a6[] = {"squishd", "--log-level", "loud", NULL};
    EXPECT_ERROR(a6, NULL, "--log-level");
    char *a7[] = {"squishd", "--no-such-flag", "1", NULL};
    EXPECT_ERROR(a7, NULL, "--no-such-flag");
    char *a8[] = {"squishd", "--db", NULL};
    EXPECT_ERROR(a8, NULL, "--db");
    char *a9[] = {"squishd", "--heartbeat-ms", "abc", NULL};
    EXPECT_ERROR(a9, NULL, "--heartbeat-ms");
    char *a10[] = {"squishd", NULL};
    char *e10[] = {"SQUISH_SHM_MB=-4", NULL};
    EXPECT_ERROR(a10, e10, "SQUISH_SHM_MB");
    char *a11[] = {"squishd", "--heartbeat-ms", "500", "--heartbeat-timeout-ms", "400", NULL};
    EXPECT_ERROR(a11, NULL, "heartbeat_timeout_ms");
    char *a12[] = {"squishd", "--workers", "emu:2,emu:1", NULL};
    EXPECT_ERROR(a12, NULL, "given twice");
    char *a13[] = {"squishd", "--max-inflight", "0", NULL};
    EXPECT_ERROR(a13, NULL, "--max-inflight");
    char *a14[] = {"squishd", "--http-request-timeout-ms", "10", NULL};
    EXPECT_ERROR(a14, NULL, "--http-request-timeout-ms");
}

Test(config, config_file_errors_name_the_file_and_the_key)
{
    char path[] = "/tmp/squish-config-XXXXXX";
    int fd = mkstemp(path);
    const char *json = "{\"workers\": \"emu:2\", \"http_threads\": \"many\"}";
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    char flag[64];
    snprintf(flag, sizeof(flag), "--config=%s", path);
    char *a1[] = {"squishd", flag, NULL};
    EXPECT_ERROR(a1, NULL, "http_threads");

    fd = open(path, O_WRONLY | O_TRUNC);
    const char *unknown = "{\"colour\": \"blue\"}";
    cr_assert_eq(write(fd, unknown, strlen(unknown)), (ssize_t)strlen(unknown));
    close(fd);
    EXPECT_ERROR(a1, NULL, "colour");

    fd = open(path, O_WRONLY | O_TRUNC);
    const char *broken = "{\"workers\": ";
    cr_assert_eq(write(fd, broken, strlen(broken)), (ssize_t)strlen(broken));
    close(fd);
    EXPECT_ERROR(a1, NULL, path);
    unlink(path);

    char *a2[] = {"squishd", "--config", "/nonexistent/squish.json", NULL};
    EXPECT_ERROR(a2, NULL, "/nonexistent/squish.json");
}

Test(config, help_and_version_are_actions)
{
    gw_config_t cfg;
    gw_config_action_t action;
    char err[512];
    char *a[] = {"squishd", "--help", NULL};
    cr_assert_eq(gw_config_parse(&cfg, 2, a, NULL, &action, err, sizeof(err)), 0);
    cr_assert_eq(action, GW_CONFIG_HELP);
    char *b[] = {"squishd", "--version", NULL};
    cr_assert_eq(gw_config_parse(&cfg, 2, b, NULL, &action, err, sizeof(err)), 0);
    cr_assert_eq(action, GW_CONFIG_VERSION);
}

Test(config, workers_none_means_no_workers)
{
    gw_config_t cfg;
    char err[512];
    char *argv[] = {"squishd", "--workers", "none", NULL};
    cr_assert_eq(parse(&cfg, argv, NULL, err), 0, "%s", err);
    cr_assert_eq(cfg.ngroups, 0);
}
