/* svg.c - the report's charts, written as SVG by hand (no plotting
 * dependency): KV usage and the running batch over time, and the latency
 * CDFs.  Each chart has a title, axes with "nice" ticks and labels, and a
 * legend; series are thinned to at most MAX_POINTS points (the maximum of
 * each run of rows, so peaks survive), which keeps files small.  Output is
 * deterministic: fixed formats, nothing from the clock. */
#include "report_int.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_POINTS 2000
#define CDF_POINTS 1000
#define W          900
#define PANEL_H    300
#define LEFT       80
#define RIGHT      30
#define TOP        60
#define GAP        70
#define BOTTOM     60

typedef struct {
    const char *name;
    const char *color;
    const double *x, *y;
    size_t n;
    bool dashed;
} series_t;

typedef struct {
    const char *xlabel, *ylabel;
    bool xlog;
    double x0, x1, y0, y1;
    series_t s[4];
    int ns;
} panel_t;

static void text_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        default:
            fputc(*s, f);
        }
    }
}

/* A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double nice_step(double range, int want)
{
    if (!(range > 0)) return 1;
    double raw = range / want, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

/* Tick labels: integers plainly, others with up to 6 significant digits. */
static void tick_label(char *buf, size_t cap, double v)
{
    if (fabs(v) < 1e-12) v = 0;
    if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.6g", v);
}

static double xpos(const panel_t *p, double x)
{
    double w = W - LEFT - RIGHT;
    if (p->xlog) {
        double lx = log10(KVC_MAX(x, p->x0));
        return LEFT + w * (lx - log10(p->x0)) / (log10(p->x1) - log10(p->x0));
    }
    return LEFT + w * (x - p->x0) / (p->x1 - p->x0);
}

static double ypos(const panel_t *p, double top, double y)
{
    return top + PANEL_H - PANEL_H * (y - p->y0) / (p->y1 - p->y0);
}

static void panel(FILE *f, const panel_t *p, double top)
{
    double bottom = top + PANEL_H, right = W - RIGHT;
    fprintf(f,
            "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"#ffffff\" "
            "stroke=\"#444444\"/>\n",
            LEFT, top, W - LEFT - RIGHT, PANEL_H);
    char buf[64];
    /* y ticks and grid */
    double ys = nice_step(p->y1 - p->y0, 5);
    for (double y = ceil(p->y0 / ys) * ys; y <= p->y1 + ys * 1e-9; y += ys) {
        double py = ypos(p, top, y);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n",
                LEFT, py, right, py);
        tick_label(buf, sizeof buf, y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", LEFT - 6, py + 4,
                buf);
    }
    /* x ticks */
    if (p->xlog) {
        int d0 = (int)floor(log10(p->x0) + 1e-9), d1 = (int)ceil(log10(p->x1) - 1e-9);
        int every = d1 - d0 > 8 ? 2 : 1;
        for (int d = d0; d <= d1; d++) {
            double x = pow(10, d);
            if (x < p->x0 * (1 - 1e-9) || x > p->x1 * (1 + 1e-9)) continue;
            double px = xpos(p, x);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                    "stroke=\"#e0e0e0\"/>\n",
                    px, top, px, bottom);
            if ((d - d0) % every) continue;
            tick_label(buf, sizeof buf, x);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px,
                    bottom + 18, buf);
        }
    } else {
        double xs = nice_step(p->x1 - p->x0, 8);
        for (double x = ceil(p->x0 / xs) * xs; x <= p->x1 + xs * 1e-9; x += xs) {
            double px = xpos(p, x);
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                    "stroke=\"#e0e0e0\"/>\n",
                    px, top, px, bottom);
            tick_label(buf, sizeof buf, x);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", px,
                    bottom + 18, buf);
        }
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (LEFT + right) / 2,
            bottom + 40);
    text_escaped(f, p->xlabel);
    fputs("</text>\n", f);
    fprintf(f,
            "<text x=\"20\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 20 %.1f)\">",
            top + PANEL_H / 2.0, top + PANEL_H / 2.0);
    text_escaped(f, p->ylabel);
    fputs("</text>\n", f);
    size_t total = 0;
    for (int i = 0; i < p->ns; i++) total += p->s[i].n;
    if (total == 0)
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888888\">no "
                "data</text>\n",
                (LEFT + right) / 2, top + PANEL_H / 2.0);
    /* series, then the legend */
    for (int i = 0; i < p->ns; i++) {
        const series_t *s = &p->s[i];
        if (s->n == 0) continue;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"",
                s->color, s->dashed ? " stroke-dasharray=\"6 4\"" : "");
        for (size_t k = 0; k < s->n; k++)
            fprintf(f, "%s%.1f,%.1f", k ? " " : "", xpos(p, s->x[k]), ypos(p, top, s->y[k]));
        fputs("\"/>\n", f);
    }
    if (p->ns)
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"176\" height=\"%d\" fill=\"#ffffff\" "
                "fill-opacity=\"0.85\" stroke=\"#cccccc\"/>\n",
                right - 178, top + 4, 18 * p->ns + 6);
    for (int i = 0; i < p->ns; i++) {
        double ly = top + 16 + 18 * i;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"2\"%s/>\n",
                right - 170, ly - 4, right - 140, ly - 4, p->s[i].color,
                p->s[i].dashed ? " stroke-dasharray=\"6 4\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", right - 134, ly);
        text_escaped(f, p->s[i].name);
        fputs("</text>\n", f);
    }
}

static int chart(const kvc_report_t *r, const char *dir, const char *file, const char *title,
                 const panel_t *panels, int np)
{
    size_t len = strlen(dir) + strlen(file) + 2;
    char *path = kvc_alloc(&r->p.allocator, len, 0);
    if (!path) return KVC_ENOMEM;
    snprintf(path, len, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    kvc_free(&r->p.allocator, path);
    if (!f) return KVC_EIO;
    int h = TOP + np * PANEL_H + (np - 1) * GAP + BOTTOM;
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<rect width=\"%d\" height=\"%d\" fill=\"#fafafa\"/>\n"
            "<text x=\"%d\" y=\"32\" text-anchor=\"middle\" font-size=\"18\">",
            W, h, W, h, W, h, W / 2);
    text_escaped(f, title);
    fputs("</text>\n", f);
    for (int i = 0; i < np; i++) panel(f, &panels[i], TOP + i * (PANEL_H + GAP));
    fputs("</svg>\n", f);
    int bad = ferror(f);
    if (fclose(f) != 0) bad = 1;
    return bad ? KVC_EIO : 0;
}

/* The rows thinned to at most MAX_POINTS: runs of `per` rows, each becoming
 * one point at the run's start with the maximum (or the step-weighted mean)
 * of a field. */
typedef enum { F_USED, F_TOTAL, F_RUNNING, F_WAITING, F_BATCH_MEAN, F_BATCH_MAX, F_COUNT } field_t;

static double row_field(const kvc__row_t *x, field_t fl)
{
    switch (fl) {
    case F_USED:
        return x->used_max;
    case F_TOTAL:
        return x->total_last;
    case F_RUNNING:
        return x->running_max;
    case F_WAITING:
        return x->waiting_max;
    case F_BATCH_MEAN:
        return (double)x->batch_sum / x->steps;
    default:
        return x->batch_max;
    }
}

static size_t thin(const kvc_report_t *r, double *xs, double *ys[F_COUNT])
{
    size_t n = r->n_rows, per = (n + MAX_POINTS - 1) / MAX_POINTS, out = 0;
    if (per == 0) per = 1;
    for (size_t i = 0; i < n; i += per, out++) {
        size_t end = KVC_MIN(i + per, n);
        xs[out] = (double)r->rows[i].idx * r->interval;
        uint64_t steps = 0, bsum = 0;
        for (int fl = 0; fl < F_COUNT; fl++) ys[fl][out] = 0;
        for (size_t k = i; k < end; k++) {
            for (int fl = 0; fl < F_COUNT; fl++)
                if (fl != F_BATCH_MEAN)
                    ys[fl][out] = KVC_MAX(ys[fl][out], row_field(&r->rows[k], (field_t)fl));
            steps += r->rows[k].steps;
            bsum += r->rows[k].batch_sum;
        }
        ys[F_BATCH_MEAN][out] = steps ? (double)bsum / (double)steps : 0;
    }
    return out;
}

static double max_of(const double *v, size_t n, double floor_)
{
    double m = floor_;
    for (size_t i = 0; i < n; i++) m = KVC_MAX(m, v[i]);
    return m;
}

/* An upper axis bound a little above m, on a tick. */
static double headroom(double m)
{
    if (!(m > 0)) return 1;
    double s = nice_step(m * 1.05, 5);
    return ceil(m * 1.05 / s) * s;
}

static int time_charts(const kvc_report_t *r, const char *dir)
{
    size_t cap = KVC_MIN(r->n_rows, (size_t)MAX_POINTS) + 1;
    double *xs = kvc_alloc(&r->p.allocator, cap * sizeof *xs, 0), *ys[F_COUNT] = {0};
    int rc = KVC_ENOMEM;
    for (int i = 0; i < F_COUNT; i++)
        if (!(ys[i] = kvc_alloc(&r->p.allocator, cap * sizeof(double), 0))) goto out;
    if (!xs) goto out;
    size_t n = thin(r, xs, ys);
    double x1 = n ? KVC_MAX(xs[n - 1] + r->interval, r->simulated_s) : KVC_MAX(r->simulated_s, 1);
    if (!(x1 > 0)) x1 = 1;
    panel_t kv = {
        .xlabel = "simulated time (s)", .ylabel = "KV blocks", .x0 = 0, .x1 = x1, .y0 = 0, .ns = 2};
    kv.y1 = headroom(KVC_MAX(max_of(ys[F_TOTAL], n, 0), max_of(ys[F_USED], n, 0)));
    kv.s[0] = (series_t){"used (max per interval)", "#1f77b4", xs, ys[F_USED], n, false};
    kv.s[1] = (series_t){"total", "#d62728", xs, ys[F_TOTAL], n, true};
    if ((rc = chart(r, dir, "kv_usage.svg", "KV cache usage", &kv, 1))) goto out;

    panel_t b[2] = {
        {.xlabel = "simulated time (s)",
         .ylabel = "sequences",
         .x0 = 0,
         .x1 = x1,
         .y0 = 0,
         .ns = 2},
        {.xlabel = "simulated time (s)",
         .ylabel = "tokens per step",
         .x0 = 0,
         .x1 = x1,
         .y0 = 0,
         .ns = 2},
    };
    b[0].y1 = headroom(KVC_MAX(max_of(ys[F_RUNNING], n, 0), max_of(ys[F_WAITING], n, 0)));
    b[0].s[0] = (series_t){"running (max)", "#2ca02c", xs, ys[F_RUNNING], n, false};
    b[0].s[1] = (series_t){"waiting (max)", "#ff7f0e", xs, ys[F_WAITING], n, false};
    b[1].y1 = headroom(max_of(ys[F_BATCH_MAX], n, 0));
    b[1].s[0] = (series_t){"mean", "#1f77b4", xs, ys[F_BATCH_MEAN], n, false};
    b[1].s[1] = (series_t){"max", "#9467bd", xs, ys[F_BATCH_MAX], n, true};
    rc = chart(r, dir, "batch.svg", "Running batch", b, 2);
out:
    kvc_free(&r->p.allocator, xs);
    for (int i = 0; i < F_COUNT; i++) kvc_free(&r->p.allocator, ys[i]);
    return rc;
}

static int cdf_chart(const kvc_report_t *r, const char *dir)
{
    static const char *const names[3] = {"TTFT", "TPOT", "E2E"};
    static const char *const colors[3] = {"#1f77b4", "#2ca02c", "#d62728"};
    double *buf = kvc_alloc(&r->p.allocator, 3 * 2 * (CDF_POINTS + 1) * sizeof *buf, 0);
    if (!buf) return KVC_ENOMEM;
    panel_t p = {
        .xlabel = "latency (ms)", .ylabel = "fraction of requests", .y0 = 0, .y1 = 1, .ns = 3};
    double lo = INFINITY, hi = 0;
    for (int m = 0; m < 3; m++) {
        const double *v = r->sorted[m];
        size_t n = r->n_sorted[m];
        for (size_t i = 0; i < n; i++)
            if (v[i] > 0) {
                lo = KVC_MIN(lo, v[i]);
                break;
            }
        if (n) hi = KVC_MAX(hi, v[n - 1]);
    }
    if (!(hi > 0)) hi = 1;
    p.xlog = isfinite(lo) && hi / lo >= 20;
    if (p.xlog) {
        p.x0 = pow(10, floor(log10(lo)));
        p.x1 = pow(10, ceil(log10(hi)));
    } else {
        p.x0 = 0;
        p.x1 = headroom(hi);
    }
    for (int m = 0; m < 3; m++) {
        double *xs = buf + (size_t)m * 2 * (CDF_POINTS + 1), *ys = xs + CDF_POINTS + 1;
        const double *v = r->sorted[m];
        size_t n = r->n_sorted[m], k = 0;
        /* quantile points: rank i has cumulative fraction (i + 1) / n */
        size_t pts = KVC_MIN(n, (size_t)CDF_POINTS);
        for (size_t j = 0; j < pts; j++) {
            size_t i = pts == 1 ? n - 1 : (size_t)((double)j * (double)(n - 1) / (double)(pts - 1));
            xs[k] = v[i];
            ys[k++] = (double)(i + 1) / (double)n;
        }
        p.s[m] = (series_t){names[m], colors[m], xs, ys, k, false};
    }
    int rc = chart(r, dir, "latency_cdf.svg", "Latency CDF", &p, 1);
    kvc_free(&r->p.allocator, buf);
    return rc;
}

int kvc_report_write_svg(const kvc_report_t *r, const char *dir)
{
    if (!r->finished || !dir || !*dir) return KVC_EINVAL;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) return KVC_EIO;
    int rc = time_charts(r, dir);
    if (!rc) rc = cdf_chart(r, dir);
    return rc;
}
