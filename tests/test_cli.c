/* test_cli.c - the helpers every kvcache subcommand shares (src/cli/args.c,
 * compiled in here on its own): strict number parsing, exact JSON integers,
 * and the escaping that keeps input bytes off the terminal. */
#include "test_helpers.h"

#include "cli/args.c"

#include <float.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static void parse_u64_takes_plain_digits_only(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t v;
    } good[] = {{"0", 0},
                {"7", 7},
                {"007", 7},
                {"16777216", 16777216},
                {"18446744073709551615", UINT64_MAX}};
    for (size_t i = 0; i < KVC_ARRAY_LEN(good); i++) {
        uint64_t v = 12345;
        assert_true(kvc_cli_parse_u64(good[i].s, 0, UINT64_MAX, &v));
        assert_true(v == good[i].v);
    }
    /* strtoull skips spaces and negates: " -18446744073709551615" was 1, " -1" was 2^64-1 */
    static const char *const bad[] = {"",
                                      " 1",
                                      "1 ",
                                      "\t1",
                                      "+1",
                                      "-1",
                                      " -1",
                                      " -18446744073709551615",
                                      "-0",
                                      "18446744073709551616",
                                      "99999999999999999999999",
                                      "0x10",
                                      "1e3",
                                      "1.0",
                                      "1_000",
                                      "\xd9\xa1" /* ARABIC-INDIC DIGIT ONE */};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        uint64_t v = 12345;
        if (kvc_cli_parse_u64(bad[i], 0, UINT64_MAX, &v)) fail_msg("accepted '%s'", bad[i]);
        assert_true(v == 12345); /* untouched */
    }
    uint64_t v = 0;
    assert_false(kvc_cli_parse_u64(NULL, 0, 10, &v));
    assert_false(kvc_cli_parse_u64("0", 1, 10, &v));
    assert_false(kvc_cli_parse_u64("11", 1, 10, &v));
    assert_true(kvc_cli_parse_u64("10", 1, 10, &v) && v == 10);
}

static void parse_double_takes_decimal_numbers_only(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        double v;
    } good[] = {{"1", 1},     {"0.9", 0.9},   {".5", 0.5},     {"5.", 5},      {"-2.5", -2.5},
                {"1e3", 1e3}, {"1E-3", 1e-3}, {"2.5e+2", 250}, {"007.5", 7.5}, {"1e308", 1e308}};
    for (size_t i = 0; i < KVC_ARRAY_LEN(good); i++) {
        double v = 0;
        if (!kvc_cli_parse_double(good[i].s, -DBL_MAX, DBL_MAX, &v))
            fail_msg("refused '%s'", good[i].s);
        assert_true(v == good[i].v);
    }
    double z = 1;
    assert_true(kvc_cli_parse_double("-0", 0, 1, &z));
    assert_true(z == 0 && !signbit(z));
    static const char *const bad[] = {
        "",         " 1",     "1 ",    "\t1",    "+1",     "inf",  "-inf", "nan", "NaN",
        "infinity", "0x1p-1", "0x10",  "1e",     "1e+",    ".",    "-",    "-.",  "e5",
        "1,5",      "1.5.2",  "1e400", "-1e400", "1e-400", "1.5x", "1 2"};
    for (size_t i = 0; i < KVC_ARRAY_LEN(bad); i++) {
        double v = 12345;
        if (kvc_cli_parse_double(bad[i], -DBL_MAX, DBL_MAX, &v)) fail_msg("accepted '%s'", bad[i]);
        assert_true(v == 12345);
    }
    double v;
    assert_false(kvc_cli_parse_double(NULL, 0, 1, &v));
    assert_false(kvc_cli_parse_double("1.0000001", 0, 1, &v));
    assert_false(kvc_cli_parse_double("-0.1", 0, 1, &v));
}

static void json_integers_are_exact_whatever_their_notation(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        uint64_t max;
        kvc_cli_num_t r;
        uint64_t v;
    } cases[] = {
        {"0", UINT64_MAX, KVC_CLI_NUM_OK, 0},
        {"-0", UINT64_MAX, KVC_CLI_NUM_OK, 0},
        {"0.0e9", UINT64_MAX, KVC_CLI_NUM_OK, 0},
        {"00012", UINT64_MAX, KVC_CLI_NUM_OK, 12},
        {"18446744073709551615", UINT64_MAX, KVC_CLI_NUM_OK, UINT64_MAX},
        {"18446744073709551616", UINT64_MAX, KVC_CLI_NUM_TOO_LARGE, 0},
        {"1e19", UINT64_MAX, KVC_CLI_NUM_OK, UINT64_C(10000000000000000000)},
        {"1e20", UINT64_MAX, KVC_CLI_NUM_TOO_LARGE, 0},
        {"9.2233720368547758e18", UINT64_MAX, KVC_CLI_NUM_OK, UINT64_C(9223372036854775800)},
        {"1.8446744073709551615E19", UINT64_MAX, KVC_CLI_NUM_OK, UINT64_MAX},
        {"1.5e3", UINT64_MAX, KVC_CLI_NUM_OK, 1500},
        {"100e-2", UINT64_MAX, KVC_CLI_NUM_OK, 1},
        {"12300e-2", UINT64_MAX, KVC_CLI_NUM_OK, 123},
        {"1230e-2", UINT64_MAX, KVC_CLI_NUM_NOT_INTEGER, 0},
        {"1.5", UINT64_MAX, KVC_CLI_NUM_NOT_INTEGER, 0},
        {"1.0000000000000001", UINT64_MAX, KVC_CLI_NUM_NOT_INTEGER, 0}, /* 1.0 as a double */
        {"1e-400", UINT64_MAX, KVC_CLI_NUM_NOT_INTEGER, 0},
        {"1e400", UINT64_MAX, KVC_CLI_NUM_TOO_LARGE, 0},
        {"1e99999999999999999999999", UINT64_MAX, KVC_CLI_NUM_TOO_LARGE, 0},
        {"1e-99999999999999999999999", UINT64_MAX, KVC_CLI_NUM_NOT_INTEGER, 0},
        {"-1", UINT64_MAX, KVC_CLI_NUM_NEGATIVE, 0},
        {"-1e30", UINT64_MAX, KVC_CLI_NUM_NEGATIVE, 0},
        {"-1.5", UINT64_MAX, KVC_CLI_NUM_NOT_INTEGER, 0},
        {"2147483647", INT32_MAX, KVC_CLI_NUM_OK, INT32_MAX},
        {"2147483648", INT32_MAX, KVC_CLI_NUM_TOO_LARGE, 0},
        {"2147483647.0000000001", INT32_MAX, KVC_CLI_NUM_NOT_INTEGER, 0},
        {"1e30", INT32_MAX, KVC_CLI_NUM_TOO_LARGE, 0},
        {"", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {"-", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {".", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {"1e", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {"1e+", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {"1x", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {"+1", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {"0x10", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
        {"inf", UINT64_MAX, KVC_CLI_NUM_MALFORMED, 0},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        uint64_t v = 4242;
        kvc_cli_num_t r = kvc_cli_parse_json_uint(cases[i].s, strlen(cases[i].s), cases[i].max, &v);
        if (r != cases[i].r) fail_msg("'%s': %d, want %d", cases[i].s, r, cases[i].r);
        if (r == KVC_CLI_NUM_OK && v != cases[i].v)
            fail_msg("'%s': %llu, want %llu", cases[i].s, (unsigned long long)v,
                     (unsigned long long)cases[i].v);
        if (r != KVC_CLI_NUM_OK) assert_true(v == 4242);
    }
    /* only the n bytes given are read: "12" of "123" */
    uint64_t v;
    assert_int_equal(kvc_cli_parse_json_uint("123", 2, UINT64_MAX, &v), KVC_CLI_NUM_OK);
    assert_true(v == 12);
}

static void escape_keeps_text_and_escapes_everything_else(void **state)
{
    (void)state;
    static const struct {
        const char *in;
        size_t n;
        const char *out;
    } cases[] = {
        {"plain text 'ok'", 15, "plain text 'ok'"},
        {"\x1b[31mred", 8, "\\x1b[31mred"},
        {"a\nb\rc\td", 7, "a\\nb\\rc\\td"},
        {"back\\slash", 10, "back\\slash"}, /* kept: escaping is idempotent, so text the
                                                 library already escaped is not doubled */
        {"a\\x1bb", 6, "a\\x1bb"},
        {"a\0b", 3, "a\\x00b"},
        {"\x7f", 1, "\\x7f"},
        {"\x07\x08", 2, "\\x07\\x08"},
        {"caf\xc3\xa9", 5, "caf\xc3\xa9"},                                     /* é: text */
        {"\xe2\x82\xac \xf0\x9f\x98\x80", 8, "\xe2\x82\xac \xf0\x9f\x98\x80"}, /* € and an emoji */
        {"\xc2\xa0", 2, "\xc2\xa0"},   /* U+00A0: printable */
        {"\xc2\x9b", 2, "\\xc2\\x9b"}, /* U+009B CSI: a C1 control */
        {"\xc3", 1, "\\xc3"},          /* truncated */
        {"\xc3x", 2, "\\xc3x"},
        {"\x80", 1, "\\x80"},                            /* stray continuation byte */
        {"\xc0\xaf", 2, "\\xc0\\xaf"},                   /* overlong '/' */
        {"\xe0\x80\xaf", 3, "\\xe0\\x80\\xaf"},          /* overlong */
        {"\xed\xa0\x80", 3, "\\xed\\xa0\\x80"},          /* a surrogate */
        {"\xf4\x90\x80\x80", 4, "\\xf4\\x90\\x80\\x80"}, /* past U+10FFFF */
        {"\xff\xfe", 2, "\\xff\\xfe"},
    };
    for (size_t i = 0; i < KVC_ARRAY_LEN(cases); i++) {
        char out[128];
        memset(out, '#', sizeof out);
        size_t n = kvc_cli_escape(out, cases[i].in, cases[i].n);
        assert_string_equal(out, cases[i].out);
        assert_int_equal(n, strlen(cases[i].out));
        assert_true(n < KVC_CLI_ESCAPED_MAX(cases[i].n));
    }
    /* the worst case fills exactly KVC_CLI_ESCAPED_MAX */
    char worst[KVC_CLI_ESCAPED_MAX(3)];
    assert_int_equal(kvc_cli_escape(worst, "\x01\x02\xff", 3), 12);
    char *d = kvc_cli_escape_dup("x\x1b");
    assert_non_null(d);
    assert_string_equal(d, "x\\x1b");
    free(d);
    assert_true(kvc_cli_utf8_valid("caf\xc3\xa9 \xf0\x9f\x98\x80\n\x1b", 12));
    assert_false(kvc_cli_utf8_valid("caf\xc3", 4));
    assert_false(kvc_cli_utf8_valid("\xed\xa0\x80", 3));
    assert_false(kvc_cli_utf8_valid("\xc0\xaf", 2));
}

/* What kvc_cli_error wrote to stderr. */
static void capture_error(char *buf, size_t cap, const char *cmd, const char *arg)
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), 2) >= 0);
    assert_int_equal(kvc_cli_error(cmd, "cannot open %s: %s", arg, "No such file"), 1);
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    rewind(tmp);
    size_t n = fread(buf, 1, cap - 1, tmp);
    buf[n] = '\0';
    fclose(tmp);
}

static void errors_are_one_escaped_line(void **state)
{
    (void)state;
    char buf[512];
    capture_error(buf, sizeof buf, "explain", "evil\x1b]0;pwned\x07\nname");
    assert_string_equal(
        buf, "kvcache explain: cannot open evil\\x1b]0;pwned\\x07\\nname: No such file\n");
    capture_error(buf, sizeof buf, NULL, "caf\xc3\xa9");
    assert_string_equal(buf, "kvcache: cannot open caf\xc3\xa9: No such file\n");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_u64_takes_plain_digits_only),
        cmocka_unit_test(parse_double_takes_decimal_numbers_only),
        cmocka_unit_test(json_integers_are_exact_whatever_their_notation),
        cmocka_unit_test(escape_keeps_text_and_escapes_everything_else),
        cmocka_unit_test(errors_are_one_escaped_line),
    };
    return cmocka_run_group_tests_name("cli", tests, NULL, NULL);
}
