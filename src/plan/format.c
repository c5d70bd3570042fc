/* format.c - the plan layer's string building and number formatting, shared
 * by the renderers.  Binary units (KiB, MiB, GiB) for capacities, decimal
 * ones (GB/s, TB/s) for rates, as vendors print them. */
#include "plan_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void kvc__sb_vprintf(kvc__sbuf_t *b, const char *fmt, va_list ap)
{
    if (b->failed) return;
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if (b->s && b->len + (size_t)n < b->cap) {
        b->len += (size_t)n;
        return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap <= b->len + (size_t)n) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->failed = true;
        return;
    }
    b->s = s;
    b->cap = cap;
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    b->len += (size_t)n;
}

void kvc__sb_printf(kvc__sbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvc__sb_vprintf(b, fmt, ap);
    va_end(ap);
}

char *kvc__escape(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    if (!cap) return out;
    for (; s && *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        const bool ctl = ch < 0x20 || ch == 0x7f;
        if (o + (ctl ? 4 : 1) >= cap) break;
        if (ctl)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
        else
            out[o++] = (char)ch;
    }
    out[o] = '\0';
    return out;
}

char *kvc__fmt_int(char *buf, size_t len, uint64_t v)
{
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < n && o + 2 < len; i++) {
        if (i && (n - i) % 3 == 0) buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
    return buf;
}

char *kvc__fmt_bytes(char *buf, size_t len, uint64_t v)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)v;
    int u = 0;
    while (x >= 1024 && u < 5) {
        x /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)v);
    else if (x == floor(x))
        snprintf(buf, len, "%.0f %s", x, units[u]);
    else
        snprintf(buf, len, "%.2f %s", x, units[u]);
    return buf;
}

char *kvc__fmt_gib(char *buf, size_t len, double v)
{
    snprintf(buf, len, "%.2f GiB", v / (double)KVC__GIB);
    return buf;
}

char *kvc__fmt_rate(char *buf, size_t len, double r)
{
    if (r >= 1e12)
        snprintf(buf, len, "%.2f TB/s", r / 1e12);
    else if (r >= 1e9)
        snprintf(buf, len, "%.1f GB/s", r / 1e9);
    else if (r >= 1e6)
        snprintf(buf, len, "%.1f MB/s", r / 1e6);
    else
        snprintf(buf, len, "%.0f B/s", r);
    return buf;
}

char *kvc__fmt_flops(char *buf, size_t len, double f)
{
    snprintf(buf, len, "%.3g", f);
    return buf;
}

char *kvc__fmt_num(char *buf, size_t len, double v)
{
    if (v != 0 && (fabs(v) >= 1e6 || fabs(v) < 1e-3))
        snprintf(buf, len, "%.3g", v);
    else if (fabs(v) >= 100)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%.3g", v);
    return buf;
}
