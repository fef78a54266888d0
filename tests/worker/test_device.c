#include <criterion/criterion.h>
#include <sq.h>
#include <wk.h>

Test(device, specs_parse_to_canonical_names)
{
    wk_device_t d;
    cr_assert_eq(wk_device_parse("cpu", &d), 0);
    cr_assert_eq(d.kind, SQ_DEV_CPU);
    cr_assert_str_eq(d.name, "cpu");
    cr_assert_eq(wk_device_parse("emu:12", &d), 0);
    cr_assert_eq(d.kind, SQ_DEV_EMU);
    cr_assert_eq(d.index, 12);
    cr_assert_str_eq(d.name, "emu:12");
    cr_assert_eq(wk_device_parse("cuda:0", &d), 0);
    cr_assert_eq(d.kind, SQ_DEV_CUDA);
}

Test(device, bad_specs_are_rejected)
{
    wk_device_t d;
    const char *bad[] = {"",      "gpu:0",  "emu",        "emu:",  "emu:-1",
                         "emu:x", "emu:1x", "cuda:99999", "emu: 1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(wk_device_parse(bad[i], &d), SQ_INVAL, "'%s'", bad[i]);
}

Test(device, emulated_devices_report_their_configured_memory)
{
    wk_device_t d;
    char why[128];
    cr_assert_eq(wk_device_parse("emu:0", &d), 0);
    cr_assert_eq(wk_device_probe(&d, why, sizeof(why)), 0);
    cr_assert_eq(d.memory_bytes, 16ull << 30);
    d.memory_bytes = 1 << 20;
    cr_assert_eq(wk_device_probe(&d, why, sizeof(why)), 0);
    cr_assert_eq(d.memory_bytes, 1 << 20);
    cr_assert_eq(wk_device_parse("cpu", &d), 0);
    cr_assert_eq(wk_device_probe(&d, why, sizeof(why)), 0);
    cr_assert_gt(d.memory_bytes, 0);
}
