/* The models a worker holds (worker/serve_state.c): a batch over the
 * plan's max batch runs in pieces of that size, each row what the row
 * alone gives; a model file's bytes leave the worker's resident memory
 * once loaded, and come back intact when read again. */
#include "serve_int.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* An emulated plan of 3x4x4 images and 10 classes: each row's outputs
 * are a hash of its own input. */
static wk_plan_t *emu_plan(int max_batch)
{
    wk_plan_opts_t o = wk_plan_opts_default();
    o.backend = SQ_DEV_EMU;
    o.max_batch = max_batch;
    int64_t lat[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    o.emu_latency_us = lat;
    o.emu_n_latency = 8;
    int64_t chw[3] = {3, 4, 4};
    wk_plan_t *p = NULL;
    char why[256];
    cr_assert_eq(wk_plan_create_emulated(chw, 10, &o, &p, why, sizeof(why)), 0, "%s", why);
    return p;
}

Test(serve_state, a_batch_over_the_plans_max_runs_in_pieces_each_row_its_own)
{
    model_t m = {0};
    m.plan = emu_plan(2);
    m.pixel_h = m.pixel_w = 4;
    m.in_elems = 48;
    m.out_elems = 10;
    m.max_batch = 5;
    cr_assert_eq(wk__model_max_batch(&m), 5);
    uint8_t px[5 * 48];
    float rows[5 * 48];
    for (int i = 0; i < 5 * 48; i++) {
        px[i] = (uint8_t)(i * 37);
        rows[i] = (float)(i % 97) / 97.0f;
    }
    float whole[50], alone[10];
    /* pixels: 5 rows run as 2 + 2 + 1 */
    cr_assert_eq(wk__model_run(&m, 5, 1, px, NULL, whole, 10), 0);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(wk__model_run(&m, 1, 1, px + i * 48, NULL, alone, 10), 0);
        cr_assert_arr_eq(alone, whole + i * 10, sizeof(alone), "pixels, row %d", i);
    }
    /* FP32 rows */
    cr_assert_eq(wk__model_run(&m, 5, 0, (const uint8_t *)rows, NULL, whole, 10), 0);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(wk__model_run(&m, 1, 0, (const uint8_t *)(rows + i * 48), NULL, alone, 10), 0);
        cr_assert_arr_eq(alone, whole + i * 10, sizeof(alone), "FP32 rows, row %d", i);
    }
    /* UINT8 rows (in_elems bytes each) */
    cr_assert_eq(wk__model_run_u8(&m, 5, px, whole, 10), 0);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(wk__model_run_u8(&m, 1, px + i * 48, alone, 10), 0);
        cr_assert_arr_eq(alone, whole + i * 10, sizeof(alone), "UINT8 rows, row %d", i);
    }
    wk_plan_free(m.plan);
}

Test(serve_state, a_model_planned_for_its_whole_batch_serves_the_plans_max)
{
    model_t m = {0};
    m.plan = emu_plan(3);
    cr_assert_eq(wk__model_max_batch(&m), 3);
    wk_plan_free(m.plan);
}

/* The resident kB of the mapping that starts at p (/proc/self/smaps). */
static long mapping_rss_kb(const void *p)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert_not_null(f);
    char line[512];
    char start[32];
    snprintf(start, sizeof(start), "%lx-", (unsigned long)(uintptr_t)p);
    int in = 0;
    long kb = -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strchr(line, '-') != NULL && strncmp(line, start, strlen(start)) == 0)
            in = 1;
        else if (in && strncmp(line, "Rss:", 4) == 0) {
            kb = strtol(line + 4, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb;
}

static void fill(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + (i >> 12));
}

static int intact(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(i * 31 + (i >> 12)))
            return 0;
    return 1;
}

Test(serve_state, a_loaded_files_bytes_leave_resident_memory_and_read_back_intact)
{
    const size_t n = 8u << 20;
    char dir[] = "/var/tmp/squish-file-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    setenv("TMPDIR", dir, 1);
    bool file = false;
    uint8_t *p = wk__file_alloc(n, &file);
    cr_assert_not_null(p);
    cr_assert(file, "a disk directory takes the file: %s", dir);
    fill(p, n);
    cr_assert_geq(mapping_rss_kb(p), 8000, "the bytes as received are resident");
    wk__file_idle(p, n, file);
    cr_assert_lt(mapping_rss_kb(p), 100, "once loaded they are not: %ld kB", mapping_rss_kb(p));
    cr_assert(intact(p, n), "and read back as they were");
    wk__file_free(p, n);
    rmdir(dir);
}

Test(serve_state, without_a_file_the_bytes_stay_in_memory_intact)
{
    const size_t n = 1u << 20;
    setenv("TMPDIR", "/nonexistent/squish", 1);
    bool file = true;
    uint8_t *p = wk__file_alloc(n, &file);
    cr_assert_not_null(p);
    cr_assert_not(file);
    fill(p, n);
    wk__file_idle(p, n, file);
    cr_assert(intact(p, n), "anonymous memory is never dropped");
    wk__file_free(p, n);
}
