/* args.c - what every kvcache subcommand shares: one-line errors that never
 * echo raw bytes from the input, and number parsers that accept exactly the
 * numbers a user means and nothing else.  No library logic lives here; the
 * tests compile this file on its own (tests/test_cli.c). */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- escaping ------------------------------------------------------------------ */
/* Length of the well-formed UTF-8 sequence at s[0..n) (1..4), or 0 when s[0] does not start
 * one: a stray continuation byte, a truncated sequence, an overlong form, a surrogate or a value
 * past U+10FFFF. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* the range of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0; /* no overlong forms */
        if (c == 0xed) hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f; /* nothing past U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

/* utf8_len, but 0 also for the characters a terminal acts on: C0 controls, DEL and the C1
 * controls (U+0080..U+009F, which some terminals obey as escape sequences). */
static size_t printable_len(const unsigned char *s, size_t n)
{
    if (s[0] < 0x20 || s[0] == 0x7f) return 0;
    if (s[0] == 0xc2 && n > 1 && s[1] < 0xa0) return 0;
    return utf8_len(s, n);
}

bool kvc_cli_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0, len; i < n; i += len)
        if (!(len = utf8_len(u + i, n - i))) return false;
    return true;
}

size_t kvc_cli_escape(char *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = printable_len(u + i, n - i);
        if (len) {
            memcpy(out + o, u + i, len);
            o += len;
            i += len;
            continue;
        }
        out[o++] = '\\';
        switch (u[i]) {
        case '\n':
            out[o++] = 'n';
            break;
        case '\r':
            out[o++] = 'r';
            break;
        case '\t':
            out[o++] = 't';
            break;
        default:
            out[o++] = 'x';
            out[o++] = hex[u[i] >> 4];
            out[o++] = hex[u[i] & 15];
        }
        i++;
    }
    out[o] = '\0';
    return o;
}

char *kvc_cli_escape_dup(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(KVC_CLI_ESCAPED_MAX(n));
    if (out) kvc_cli_escape(out, s, n);
    return out;
}

int kvc_cli_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = NULL;
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    char *esc = n >= 0 ? malloc(KVC_CLI_ESCAPED_MAX((size_t)n)) : NULL;
    if (esc) kvc_cli_escape(esc, msg, (size_t)n);
    /* One call, so that the line is written whole. */
    fprintf(stderr, "kvcache%s%s: %s\n", cmd ? " " : "", cmd ? cmd : "",
            esc ? esc : "out of memory (while formatting an error)");
    free(esc);
    if (n >= 0) free(msg);
    return 1;
}

/* ---- numbers -------------------------------------------------------------------- */
static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

bool kvc_cli_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    if (!s || !*s) return false;
    uint64_t v = 0;
    for (const char *p = s; *p; p++) {
        if (!is_digit(*p)) return false;
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    if (v < min || v > max) return false;
    *out = v;
    return true;
}

/* The length of the decimal number at the start of s: [-]digits[.[digits]] or [-].digits, then
 * an optional [eE][+-]digits; 0 if there is none.  Never hex, inf or nan. */
static size_t decimal_len(const char *s)
{
    size_t i = s[0] == '-', n_digits = 0;
    while (is_digit(s[i])) i++, n_digits++;
    if (s[i] == '.') {
        i++;
        while (is_digit(s[i])) i++, n_digits++;
    }
    if (!n_digits) return 0;
    if (s[i] == 'e' || s[i] == 'E') {
        size_t j = i + 1;
        if (s[j] == '+' || s[j] == '-') j++;
        if (!is_digit(s[j])) return 0;
        while (is_digit(s[j])) j++;
        i = j;
    }
    return i;
}

bool kvc_cli_parse_double(const char *s, double min, double max, double *out)
{
    if (!s || !*s) return false;
    size_t len = decimal_len(s);
    if (!len || s[len]) return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    /* ERANGE: past DBL_MAX, or so small that it is not the number written */
    if (errno || end != s + len || !isfinite(v)) return false;
    if (v == 0) v = 0; /* "-0" is 0 */
    if (v < min || v > max) return false;
    *out = v;
    return true;
}

bool kvc_cli_parse_tokens(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    if (!s || !*s) return false;
    size_t n = strlen(s);
    const char last = s[n - 1];
    static const char suffixes[] = "kmgtKMGT";
    const char *sfx = strchr(suffixes, last);
    if (!sfx || last == '\0') return kvc_cli_parse_u64(s, min, max, out);
    /* vLLM's human_readable_int: k, m, g, t are powers of 1000 and take a decimal (25.6k);
     * K, M, G, T are powers of 1024 and take whole numbers only. */
    const int power = (int)((sfx - suffixes) % 4) + 1;
    const bool binary = sfx - suffixes >= 4;
    char num[64];
    if (n - 1 == 0 || n - 1 >= sizeof num) return false;
    memcpy(num, s, n - 1);
    num[n - 1] = '\0';
    uint64_t v;
    if (binary) {
        if (!kvc_cli_parse_u64(num, 0, UINT64_MAX, &v)) return false;
        for (int i = 0; i < power; i++) {
            if (v > UINT64_MAX / 1024) return false;
            v *= 1024;
        }
    } else {
        /* digits[.digits], no sign, no exponent */
        size_t i = 0, digits = 0;
        while (is_digit(num[i])) i++, digits++;
        if (num[i] == '.') {
            i++;
            while (is_digit(num[i])) i++, digits++;
        }
        if (!digits || num[i] || num[0] == '.') return false;
        double d = strtod(num, NULL) * pow(1000, power);
        if (!(d < 0x1p64)) return false;
        v = (uint64_t)d; /* vLLM truncates: int(float(number) * mult) */
    }
    if (v < min || v > max) return false;
    *out = v;
    return true;
}

kvc_cli_num_t kvc_cli_parse_json_uint(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    /* The value is 0.D * 10^point, where D is the significant digits: exact whatever the
     * exponent, so 18446744073709551615, 1.5e3 and 1e400 are each judged as written. */
    size_t i = 0;
    bool negative = n > 0 && s[0] == '-';
    i += negative;
    const char *digits[2] = {s + i, NULL}; /* integer part, fraction */
    size_t n_digits[2] = {0, 0};
    while (i < n && is_digit(s[i])) i++, n_digits[0]++;
    if (i < n && s[i] == '.') {
        digits[1] = s + ++i;
        while (i < n && is_digit(s[i])) i++, n_digits[1]++;
    }
    if (n_digits[0] + n_digits[1] == 0) return KVC_CLI_NUM_MALFORMED;
    int64_t exp = 0;
    const int64_t exp_cap = INT64_C(1) << 40; /* far past any digit count a line can hold */
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        bool exp_neg = i < n && s[i] == '-';
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i == n || !is_digit(s[i])) return KVC_CLI_NUM_MALFORMED;
        for (; i < n && is_digit(s[i]); i++)
            if (exp < exp_cap) exp = exp * 10 + (s[i] - '0');
        if (exp_neg) exp = -exp;
    }
    if (i != n) return KVC_CLI_NUM_MALFORMED;

    /* The significant digits, as one sequence over both parts: [first, last). */
    size_t total = n_digits[0] + n_digits[1], first = 0, last = total;
#define DIGIT(k) ((k) < n_digits[0] ? digits[0][k] : digits[1][(k)-n_digits[0]])
    while (first < total && DIGIT(first) == '0') first++;
    while (last > first && DIGIT(last - 1) == '0') last--;
    if (first == last) { /* zero, however written ("-0", "0.0e9") */
        *out = 0;
        return KVC_CLI_NUM_OK;
    }
    /* Digits before the decimal point, counted from the first significant one. */
    int64_t point = (int64_t)n_digits[0] - (int64_t)first + exp;
    if (point < (int64_t)(last - first)) return KVC_CLI_NUM_NOT_INTEGER;
    if (negative) return KVC_CLI_NUM_NEGATIVE;
    if (point > 20) return KVC_CLI_NUM_TOO_LARGE; /* UINT64_MAX has 20 digits */
    uint64_t v = 0;
    for (int64_t k = 0; k < point; k++) {
        size_t at = first + (size_t)k;
        unsigned d = at < last ? (unsigned)(DIGIT(at) - '0') : 0;
        if (v > (UINT64_MAX - d) / 10) return KVC_CLI_NUM_TOO_LARGE;
        v = v * 10 + d;
    }
#undef DIGIT
    if (v > max) return KVC_CLI_NUM_TOO_LARGE;
    *out = v;
    return KVC_CLI_NUM_OK;
}
