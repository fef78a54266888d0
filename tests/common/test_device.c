#include <criterion/criterion.h>
#include <sq.h>

Test(device, kinds_and_names_round_trip)
{
    for (int k = 0; k < SQ_DEV_KIND_COUNT; k++)
        cr_assert_eq(sq_dev_kind_parse(sq_dev_kind_name((sq_dev_kind_t)k)), k);
    cr_assert_str_eq(sq_dev_kind_name(SQ_DEV_CPU), "cpu");
    cr_assert_str_eq(sq_dev_kind_name(SQ_DEV_CUDA), "cuda");
    cr_assert_str_eq(sq_dev_kind_name(SQ_DEV_EMU), "emu");
    cr_assert_str_eq(sq_dev_kind_name(SQ_DEV_KIND_COUNT), "?");
    cr_assert_eq(sq_dev_kind_parse("gpu"), -1);
    cr_assert_eq(sq_dev_kind_parse("cuda:0"), -1);
    cr_assert_eq(sq_dev_kind_parse(""), -1);
}

Test(device, specs_parse_to_canonical_names)
{
    sq_device_t d;
    cr_assert_eq(sq_device_parse("cpu", &d), 0);
    cr_assert_eq(d.kind, SQ_DEV_CPU);
    cr_assert_str_eq(d.name, "cpu");
    cr_assert_eq(sq_device_parse("cpu:0", &d), 0);
    cr_assert_str_eq(d.name, "cpu");
    cr_assert_eq(sq_device_parse("emu:12", &d), 0);
    cr_assert_eq(d.kind, SQ_DEV_EMU);
    cr_assert_eq(d.index, 12);
    cr_assert_str_eq(d.name, "emu:12");
    cr_assert_eq(sq_device_parse("cuda:0", &d), 0);
    cr_assert_eq(d.kind, SQ_DEV_CUDA);
    cr_assert_str_eq(d.name, "cuda:0");
}

Test(device, host_qualified_specs_keep_the_host)
{
    sq_device_t d;
    cr_assert_eq(sq_device_parse("cpu@host-2.lan", &d), 0);
    cr_assert_eq(d.kind, SQ_DEV_CPU);
    cr_assert_str_eq(d.name, "cpu@host-2.lan");
    cr_assert_eq(sq_device_parse("cuda:3@gpu_box", &d), 0);
    cr_assert_eq(d.index, 3);
    cr_assert_str_eq(d.name, "cuda:3@gpu_box");
    cr_assert_eq(sq_device_parse("cpu@", &d), SQ_INVAL);
    cr_assert_eq(sq_device_parse("cpu@a b", &d), SQ_INVAL);
    char spec[SQ_DEVICE_MAX_HOST + 8] = "emu:0@";
    memset(spec + 6, 'h', SQ_DEVICE_MAX_HOST);
    cr_assert_eq(sq_device_parse(spec, &d), 0);
    spec[6 + SQ_DEVICE_MAX_HOST] = 'h';
    cr_assert_eq(sq_device_parse(spec, &d), SQ_INVAL);
}

Test(device, bad_specs_are_rejected)
{
    sq_device_t d;
    const char *bad[] = {"",       "gpu:0",      "emu",    "emu:",  "emu:-1", "emu:x",
                         "emu:1x", "cuda:99999", "emu: 1", "cpu:1", "cudax:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(sq_device_parse(bad[i], &d), SQ_INVAL, "'%s'", bad[i]);
}

Test(device, format_names_a_local_device)
{
    char buf[SQ_DEVICE_NAME_MAX];
    sq_device_format(buf, sizeof(buf), SQ_DEV_CPU, 0);
    cr_assert_str_eq(buf, "cpu");
    sq_device_format(buf, sizeof(buf), SQ_DEV_EMU, 4);
    cr_assert_str_eq(buf, "emu:4");
    sq_device_format(buf, sizeof(buf), SQ_DEV_CUDA, 1);
    cr_assert_str_eq(buf, "cuda:1");
}

Test(device, precisions_and_names_round_trip)
{
    const char *names[] = {"fp32", "tf32", "fp16", "bf16"};
    cr_assert_eq(SQ_PRECISION_COUNT, 4);
    for (int p = 0; p < SQ_PRECISION_COUNT; p++) {
        cr_assert_str_eq(sq_precision_name(p), names[p]);
        cr_assert_eq(sq_precision_parse(names[p]), p);
    }
    cr_assert_null(sq_precision_name(-1));
    cr_assert_null(sq_precision_name(SQ_PRECISION_COUNT));
    cr_assert_eq(sq_precision_parse("FP16"), -1, "names are lowercase");
    cr_assert_eq(sq_precision_parse("int8"), -1);
    cr_assert_eq(sq_precision_parse(""), -1);
    cr_assert_eq(sq_precision_parse(NULL), -1);
}
