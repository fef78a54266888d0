#include <sq.h>

#include <criterion/criterion.h>
#include <string.h>

/* Lines a test's sink received. */
static char seen[8][256];
static int nseen;

static void capture(void *ctx, sq_log_level_t level, const char *line)
{
    (void)ctx;
    if (nseen < 8)
        snprintf(seen[nseen++], sizeof(seen[0]), "%s:%s", sq_log_level_name(level), line);
}

static int formatted;

static int count_format(void)
{
    return ++formatted;
}

static void setup(void)
{
    nseen = 0;
    formatted = 0;
    sq_log_set_sink(capture, NULL);
    sq_log_set_level(SQ_LOG_INFO);
    sq_log_set_format(SQ_LOG_FORMAT_SQUISH);
}

static void teardown(void)
{
    sq_log_set_sink(NULL, NULL);
}

TestSuite(log, .init = setup, .fini = teardown);

Test(log, a_level_writes_itself_and_the_levels_above)
{
    sq_log_set_level(SQ_LOG_WARN);
    cr_assert(!sq_log_enabled(SQ_LOG_DEBUG));
    cr_assert(!sq_log_enabled(SQ_LOG_INFO));
    cr_assert(sq_log_enabled(SQ_LOG_WARN));
    cr_assert(sq_log_enabled(SQ_LOG_ERROR));
    sq_log_set_level(SQ_LOG_OFF);
    for (int l = SQ_LOG_DEBUG; l < SQ_LOG_OFF; l++)
        cr_assert(!sq_log_enabled((sq_log_level_t)l), "level %d", l);
    sq_log_set_level(SQ_LOG_DEBUG);
    for (int l = SQ_LOG_DEBUG; l < SQ_LOG_OFF; l++)
        cr_assert(sq_log_enabled((sq_log_level_t)l), "level %d", l);
}

Test(log, levels_turn_on_and_off_one_by_one_as_tritons_flags_do)
{
    /* Triton's log_info: false with log_warning: true... and the reverse,
     * which no threshold can say. */
    sq_log_enable(SQ_LOG_WARN, 0);
    cr_assert(sq_log_enabled(SQ_LOG_INFO));
    cr_assert(!sq_log_enabled(SQ_LOG_WARN));
    cr_assert(sq_log_enabled(SQ_LOG_ERROR));
    sq_log_enable(SQ_LOG_DEBUG, 1);
    cr_assert(sq_log_enabled(SQ_LOG_DEBUG));
    cr_assert(!sq_log_enabled(SQ_LOG_WARN));
    sq_log_enable(SQ_LOG_WARN, 1);
    sq_log_enable(SQ_LOG_INFO, 0);
    cr_assert(sq_log_enabled(SQ_LOG_DEBUG) && !sq_log_enabled(SQ_LOG_INFO));
    cr_assert(sq_log_enabled(SQ_LOG_WARN) && sq_log_enabled(SQ_LOG_ERROR));
    sq_log_enable(SQ_LOG_OFF, 1); /* not a level: nothing changes */
    cr_assert(!sq_log_enabled(SQ_LOG_OFF));
}

Test(log, a_level_that_is_off_is_neither_written_nor_formatted)
{
    sq_log_enable(SQ_LOG_INFO, 0);
    SQ_INFO("hidden n=%d", count_format());
    SQ_WARN("shown n=%d", count_format());
    SQ_DEBUG("hidden too n=%d", count_format());
    cr_assert_eq(formatted, 1, "only the shown line's arguments are evaluated");
    cr_assert_eq(nseen, 1);
    cr_assert_str_eq(seen[0], "warn:shown n=1");
    sq_log_enable(SQ_LOG_INFO, 1);
    SQ_INFO("back n=%d", count_format());
    cr_assert_eq(nseen, 2);
    cr_assert_str_eq(seen[1], "info:back n=2");
}

Test(log, lines_in_squishs_format_and_in_tritons_iso8601)
{
    struct timespec ts = {.tv_sec = 1795651872, .tv_nsec = 345678901}; /* 2026-11-26T00:11:12 */
    char line[256];
    size_t n = sq_log_format_line(line, sizeof(line), SQ_LOG_FORMAT_SQUISH, &ts, 4242, "squishd",
                                  SQ_LOG_INFO, "worker lost id=3");
    cr_assert_str_eq(line, "2026-11-26T00:11:12.345Z squishd level=info worker lost id=3");
    cr_assert_eq(n, strlen(line));
    sq_log_format_line(line, sizeof(line), SQ_LOG_FORMAT_ISO8601, &ts, 4242, "squishd", SQ_LOG_WARN,
                       "worker lost id=3");
    cr_assert_str_eq(line, "2026-11-26T00:11:12Z W 4242 squishd] worker lost id=3");
    sq_log_format_line(line, sizeof(line), SQ_LOG_FORMAT_ISO8601, &ts, 1, "w", SQ_LOG_ERROR, "x");
    cr_assert_str_eq(line, "2026-11-26T00:11:12Z E 1 w] x");
    sq_log_format_line(line, sizeof(line), SQ_LOG_FORMAT_ISO8601, &ts, 1, "w", SQ_LOG_DEBUG, "x");
    cr_assert_str_eq(line, "2026-11-26T00:11:12Z I 1 w] x", "verbose lines are Triton's I");
    /* Truncated to the room given, still terminated; the length it needs. */
    char small[12];
    n = sq_log_format_line(small, sizeof(small), SQ_LOG_FORMAT_ISO8601, &ts, 1, "w", SQ_LOG_INFO,
                           "x");
    cr_assert_str_eq(small, "2026-11-26T");
    cr_assert_eq(n, strlen("2026-11-26T00:11:12Z I 1 w] x"));
}

Test(log, the_format_is_read_back)
{
    cr_assert_eq(sq_log_get_format(), SQ_LOG_FORMAT_SQUISH);
    sq_log_set_format(SQ_LOG_FORMAT_ISO8601);
    cr_assert_eq(sq_log_get_format(), SQ_LOG_FORMAT_ISO8601);
}
