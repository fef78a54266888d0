#include <sq.h>

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char name[8];
    int count;
    double ratio;
    long long big;
    sq_log_level_t level;
    char config[256];
    char seen[4][16]; /* --tag, collected */
    int ntags;
} conf_t;

static int parse_tag(void *base, const sq_opt_t *o, const char *v, char *why, size_t len)
{
    conf_t *c = base;
    if (c->ntags == 4 || strlen(v) >= sizeof(c->seen[0])) {
        snprintf(why, len, "at most 4 tags of 15 characters");
        return -1;
    }
    snprintf(c->seen[c->ntags++], sizeof(c->seen[0]), "%s", v);
    return 0;
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const sq_opt_t opts[] = {
    {"name", SQ_OPT_STR, offsetof(conf_t, name), sizeof(((conf_t *)0)->name), 0, 0, "abc", "a"},
    {"count", SQ_OPT_INT, offsetof(conf_t, count), sizeof(int), 1, 100, "7", "b"},
    {"ratio", SQ_OPT_DOUBLE, offsetof(conf_t, ratio), sizeof(double), 0, 1, "0.5", "c"},
    {"big_value", SQ_OPT_LONG, offsetof(conf_t, big), sizeof(long long), 0, 1LL << 40, "0", "d"},
    {"log_level", SQ_OPT_LOGLEVEL, offsetof(conf_t, level), 0, 0, 0, "info", "e"},
    {"config", SQ_OPT_STR, offsetof(conf_t, config), sizeof(((conf_t *)0)->config), 0, 0, "", "f"},
    {"tag", SQ_OPT_CUSTOM, 0, 0, 0, 0, "", "g", parse_tag},
};
#pragma GCC diagnostic pop

static const sq_opts_spec_t spec = {opts, sizeof(opts) / sizeof(opts[0]), "T_", "config"};

static int parse(conf_t *c, char **argv, char **envp, char *err)
{
    int argc = 0;
    while (argv[argc] != NULL)
        argc++;
    memset(c, 0, sizeof(*c));
    sq_opts_action_t action;
    return sq_opts_parse(&spec, c, argc, argv, envp, &action, err, 512);
}

Test(opts, defaults_then_flags_in_both_forms)
{
    conf_t c;
    char err[512] = "";
    char *none[] = {"prog", NULL};
    cr_assert_eq(parse(&c, none, NULL, err), 0, "%s", err);
    cr_assert_str_eq(c.name, "abc");
    cr_assert_eq(c.count, 7);
    cr_assert_float_eq(c.ratio, 0.5, 1e-12);
    cr_assert_eq(c.level, SQ_LOG_INFO);
    char *argv[] = {"prog",          "--count",           "9", "--ratio=0.25", "--big-value",
                    "1099511627776", "--log-level=debug", NULL};
    cr_assert_eq(parse(&c, argv, NULL, err), 0, "%s", err);
    cr_assert_eq(c.count, 9);
    cr_assert_float_eq(c.ratio, 0.25, 1e-12);
    cr_assert_eq(c.big, 1LL << 40);
    cr_assert_eq(c.level, SQ_LOG_DEBUG);
}

Test(opts, flags_override_the_environment_which_overrides_the_file)
{
    char path[] = "/tmp/sq_opts_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *json = "{\"count\": 3, \"ratio\": 0.75, \"name\": \"file\"}";
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    char cfg_env[300];
    snprintf(cfg_env, sizeof(cfg_env), "T_CONFIG=%s", path);
    char *envp[] = {cfg_env, "T_COUNT=4", "OTHER=1", NULL};
    char *argv[] = {"prog", "--count", "5", NULL};
    conf_t c;
    char err[512] = "";
    cr_assert_eq(parse(&c, argv, envp, err), 0, "%s", err);
    cr_assert_eq(c.count, 5, "the flag wins");
    cr_assert_float_eq(c.ratio, 0.75, 1e-12, "the file's, nothing overrides it");
    cr_assert_str_eq(c.name, "file");
    cr_assert_str_eq(c.config, path);
    char *no_flag[] = {"prog", NULL};
    cr_assert_eq(parse(&c, no_flag, envp, err), 0, "%s", err);
    cr_assert_eq(c.count, 4, "the environment over the file");
    unlink(path);
}

Test(opts, a_custom_option_sees_every_occurrence)
{
    conf_t c;
    char err[512] = "";
    char *argv[] = {"prog", "--tag", "a", "--tag=b", "--tag", "c", NULL};
    cr_assert_eq(parse(&c, argv, NULL, err), 0, "%s", err);
    cr_assert_eq(c.ntags, 3);
    cr_assert_str_eq(c.seen[2], "c");
}

#define EXPECT(argv_, envp_, needle)                                                               \
    do {                                                                                           \
        conf_t c_;                                                                                 \
        char err_[512] = "";                                                                       \
        cr_assert_eq(parse(&c_, argv_, envp_, err_), SQ_BAD_CONFIG);                               \
        cr_assert(strstr(err_, needle) != NULL, "'%s' does not say '%s'", err_, needle);           \
    } while (0)

Test(opts, errors_name_the_flag_the_variable_or_the_key)
{
    char *a1[] = {"prog", "--count", "0", NULL};
    EXPECT(a1, NULL, "--count: expected an integer in 1..100");
    char *a2[] = {"prog", "--nope", "1", NULL};
    EXPECT(a2, NULL, "--nope: unknown flag");
    char *a3[] = {"prog", "--count", NULL};
    EXPECT(a3, NULL, "--count: missing value");
    char *a4[] = {"prog", "--name", "toolongname", NULL};
    EXPECT(a4, NULL, "--name: longer than 7 characters");
    char *a5[] = {"prog", "stray", NULL};
    EXPECT(a5, NULL, "stray: unexpected argument");
    char *a6[] = {"prog", "--ratio", "2", NULL};
    EXPECT(a6, NULL, "--ratio: expected a number in 0..1");
    char *a7[] = {"prog", "--log-level", "loud", NULL};
    EXPECT(a7, NULL, "--log-level");
    char *a8[] = {"prog", "--tag", "a", "--tag", "b", "--tag",
                  "c",    "--tag", "d", "--tag", "e", NULL};
    EXPECT(a8, NULL, "--tag: at most 4 tags");
    char *env[] = {"T_COUNT=x", NULL};
    char *none[] = {"prog", NULL};
    EXPECT(none, env, "T_COUNT: expected an integer");
    char *bad_file[] = {"prog", "--config", "/nonexistent/sq_opts.json", NULL};
    EXPECT(bad_file, NULL, "/nonexistent/sq_opts.json");
}

Test(opts, help_and_version_stop_parsing)
{
    conf_t c;
    char err[512] = "";
    sq_opts_action_t action;
    char *h[] = {"prog", "--count", "0", "--help", NULL};
    cr_assert_eq(sq_opts_parse(&spec, &c, 2, h + 2, NULL, &action, err, sizeof(err)), 0);
    cr_assert_eq(action, SQ_OPTS_HELP);
    char *v[] = {"prog", "--version", NULL};
    cr_assert_eq(sq_opts_parse(&spec, &c, 2, v, NULL, &action, err, sizeof(err)), 0);
    cr_assert_eq(action, SQ_OPTS_VERSION);
}
