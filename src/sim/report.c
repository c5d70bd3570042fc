/* report.c - the simulator's report: finished requests and a time series in,
 * percentiles, goodput and per-tenant and per-class breakdowns out, as text,
 * JSON and CSV (charts are in svg.c), plus the command line's progress bar.
 *
 * Percentiles are nearest-rank over every finished request (no sketches: a
 * million records are 32 MB), computed once by kvc_report_finish with one
 * radix sort per metric, O(n); each tenant's and class's values come out of
 * a stable scatter of the sorted values, already sorted.  Means sum the sorted values, so
 * the output does not depend on the order records arrived in.  Every
 * number is printed with a fixed format: the same run gives the same bytes. */
#include "report_int.h"
#include "tiers_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/fmt.h"
#include "workload_int.h" /* kvc__json_string */

#define MAX_GROUPS       65536u
#define ADAPTIVE_START_S 1e-3

/* ---- params, create, destroy ---------------------------------------------------------- */
kvc_report_params_t kvc_report_params_default(void)
{
    return (kvc_report_params_t){.sample_interval_s = 0, .max_rows = 4096};
}

static void rfree(kvc_report_t *r, void *p)
{
    kvc_free(&r->p.allocator, p);
}

static void *ralloc(kvc_report_t *r, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    return kvc_alloc(&r->p.allocator, n * size != 0 ? n * size : 1, 0);
}

static char *rstrdup(kvc_report_t *r, const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = ralloc(r, n, 1);
    if (c) memcpy(c, s, n);
    return c;
}

/* Grow an array to hold `need` elements. */
static int rgrow(kvc_report_t *r, void **arr, size_t *cap, size_t need, size_t elem, size_t used)
{
    if (need <= *cap) return 0;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return KVC_ENOMEM;
        nc *= 2;
    }
    void *na = ralloc(r, nc, elem);
    if (!na) return KVC_ENOMEM;
    if (used) memcpy(na, *arr, used * elem);
    rfree(r, *arr);
    *arr = na;
    *cap = nc;
    return 0;
}

static void groups_free(kvc_report_t *r, kvc__groups_t *g)
{
    if (g->names)
        for (uint32_t i = 0; i < g->n_named; i++) rfree(r, g->names[i]);
    rfree(r, g->names);
    rfree(r, g->groups);
}

static int groups_init(kvc_report_t *r, kvc__groups_t *g, const char *const *names, uint32_t n)
{
    memset(g, 0, sizeof *g);
    if (n == 0) return 0;
    if (!names || n > MAX_GROUPS) return KVC_EINVAL;
    for (uint32_t i = 0; i < n; i++)
        if (!names[i] || !names[i][0]) return KVC_EINVAL;
    g->names = ralloc(r, n, sizeof *g->names);
    if (!g->names) return KVC_ENOMEM;
    memset(g->names, 0, n * sizeof *g->names);
    g->n_named = n;
    for (uint32_t i = 0; i < n; i++)
        if (!(g->names[i] = rstrdup(r, names[i]))) return KVC_ENOMEM;
    g->groups = ralloc(r, n, sizeof *g->groups);
    if (!g->groups) return KVC_ENOMEM;
    memset(g->groups, 0, n * sizeof *g->groups);
    g->n = g->cap = n;
    return 0;
}

/* Group i, created (zeroed) with every group below it if new. */
static kvc__group_t *group_at(kvc_report_t *r, kvc__groups_t *g, uint32_t i)
{
    if (i >= g->cap) {
        size_t cap = g->cap;
        kvc__group_t *arr = g->groups;
        if (rgrow(r, (void **)&arr, &cap, (size_t)i + 1, sizeof *arr, g->n)) return NULL;
        g->groups = arr;
        g->cap = (uint32_t)KVC_MIN(cap, (size_t)UINT32_MAX);
    }
    if (i >= g->n) {
        memset(g->groups + g->n, 0, (i + 1 - g->n) * sizeof *g->groups);
        g->n = i + 1;
    }
    return &g->groups[i];
}

const char *kvc__group_name(const kvc__groups_t *g, uint32_t i, const char *prefix, char *buf,
                            size_t cap)
{
    if (i < g->n_named) return g->names[i];
    snprintf(buf, cap, "%s%u", prefix, i);
    return buf;
}

int kvc_report_create(const kvc_report_params_t *p, kvc_report_t **out)
{
    if (!out) return KVC_EINVAL;
    *out = NULL;
    kvc_report_params_t pp = p ? *p : kvc_report_params_default();
    if (!(pp.ttft_ms >= 0) || !(pp.tpot_ms >= 0) || !(pp.e2e_ms >= 0) || !isfinite(pp.ttft_ms) ||
        !isfinite(pp.tpot_ms) || !isfinite(pp.e2e_ms) || !(pp.sample_interval_s >= 0) ||
        !isfinite(pp.sample_interval_s) || pp.max_rows < 16)
        return KVC_EINVAL;
    kvc_report_t *r = kvc_alloc(&pp.allocator, sizeof *r, 0);
    if (!r) return KVC_ENOMEM;
    memset(r, 0, sizeof *r);
    r->p = pp;
    r->p.tenant_names = r->p.class_names = NULL;
    r->interval = pp.sample_interval_s > 0 ? pp.sample_interval_s : ADAPTIVE_START_S;
    int rc = groups_init(r, &r->tenants, pp.tenant_names, pp.n_tenants);
    if (!rc) rc = groups_init(r, &r->classes, pp.class_names, pp.n_classes);
    if (rc) {
        kvc_report_destroy(r);
        return rc;
    }
    *out = r;
    return 0;
}

void kvc_report_destroy(kvc_report_t *r)
{
    if (!r) return;
    groups_free(r, &r->tenants);
    groups_free(r, &r->classes);
    rfree(r, r->recs);
    rfree(r, r->rows);
    for (size_t i = 0; i < r->n_config; i++) {
        rfree(r, r->config[i].key);
        rfree(r, r->config[i].text);
    }
    rfree(r, r->config);
    kvc__report_tiers_free(r);
    for (int m = 0; m < 3; m++) rfree(r, r->sorted[m]);
    kvc_allocator_t a = r->p.allocator;
    kvc_free(&a, r);
}

/* ---- accumulation --------------------------------------------------------------------- */
static void group_add(kvc__group_t *g, const kvc_sim_record_t *rec, bool good)
{
    g->completed++;
    g->good += good;
    g->prompt += rec->n_prompt;
    g->output += rec->n_output;
    g->hit += rec->n_hit_tokens;
    g->preemptions += rec->n_preemptions;
    g->recomputed += rec->recomputed_tokens;
}

int kvc_report_add(kvc_report_t *r, const kvc_sim_record_t *rec)
{
    if (!r || !rec) return KVC_EINVAL;
    if (r->finished || !isfinite(rec->arrival_s) || !isfinite(rec->first_token_s) ||
        !isfinite(rec->finish_s) || rec->first_token_s < rec->arrival_s ||
        rec->finish_s < rec->first_token_s || rec->n_prompt == 0 || rec->n_output == 0 ||
        rec->n_hit_tokens > rec->n_prompt || rec->tenant >= MAX_GROUPS ||
        rec->priority >= MAX_GROUPS)
        return KVC_EINVAL;
    if (rgrow(r, (void **)&r->recs, &r->cap_recs, r->n_recs + 1, sizeof *r->recs, r->n_recs))
        return KVC_ENOMEM;
    kvc__group_t *t = group_at(r, &r->tenants, rec->tenant);
    kvc__group_t *c = t ? group_at(r, &r->classes, rec->priority) : NULL;
    if (!c) return KVC_ENOMEM;
    kvc__rec_t x = {
        .ttft_ms = (rec->first_token_s - rec->arrival_s) * 1e3,
        .tpot_ms = rec->n_output > 1
                       ? (rec->finish_s - rec->first_token_s) * 1e3 / (rec->n_output - 1)
                       : -1,
        .e2e_ms = (rec->finish_s - rec->arrival_s) * 1e3,
        .tenant = rec->tenant,
        .cls = rec->priority,
    };
    bool good = (r->p.ttft_ms == 0 || x.ttft_ms <= r->p.ttft_ms) &&
                (r->p.tpot_ms == 0 || x.tpot_ms <= r->p.tpot_ms) &&
                (r->p.e2e_ms == 0 || x.e2e_ms <= r->p.e2e_ms);
    r->recs[r->n_recs++] = x;
    r->max_finish_s = KVC_MAX(r->max_finish_s, rec->finish_s);
    group_add(&r->all, rec, good);
    group_add(t, rec, good);
    group_add(c, rec, good);
    return 0;
}

/* Fold rows pairwise into rows of twice the interval (adaptive mode). */
static void rows_coarsen(kvc_report_t *r)
{
    size_t out = 0;
    for (size_t i = 0; i < r->n_rows; i++) {
        kvc__row_t x = r->rows[i];
        x.idx /= 2;
        if (out && r->rows[out - 1].idx == x.idx) {
            kvc__row_t *y = &r->rows[out - 1];
            y->steps += x.steps;
            y->used_max = KVC_MAX(y->used_max, x.used_max);
            y->total_last = x.total_last;
            y->running_max = KVC_MAX(y->running_max, x.running_max);
            y->waiting_max = KVC_MAX(y->waiting_max, x.waiting_max);
            y->swapped_max = KVC_MAX(y->swapped_max, x.swapped_max);
            y->batch_max = KVC_MAX(y->batch_max, x.batch_max);
            y->batch_sum += x.batch_sum;
        } else {
            r->rows[out++] = x;
        }
    }
    r->n_rows = out;
    r->interval *= 2;
}

int kvc_report_sample(kvc_report_t *r, const kvc_sim_sample_t *s)
{
    if (!r || !s) return KVC_EINVAL;
    if (r->finished || !isfinite(s->t_s) || s->t_s < 0 || (r->have_sample && s->t_s < r->last.t_s))
        return KVC_EINVAL;
    bool adaptive = r->p.sample_interval_s == 0;
    /* keep interval indices exact in a double */
    while (s->t_s / r->interval >= 9.0e15) {
        if (!adaptive) return KVC_EINVAL;
        rows_coarsen(r);
    }
    uint64_t idx = (uint64_t)(s->t_s / r->interval);
    kvc__row_t *row = r->n_rows ? &r->rows[r->n_rows - 1] : NULL;
    if (!row || row->idx != idx) {
        if (rgrow(r, (void **)&r->rows, &r->cap_rows, r->n_rows + 1, sizeof *r->rows, r->n_rows))
            return KVC_ENOMEM;
        row = &r->rows[r->n_rows++];
        memset(row, 0, sizeof *row);
        row->idx = idx;
    }
    row->steps++;
    row->used_max = KVC_MAX(row->used_max, s->kv_blocks_used);
    row->total_last = s->kv_blocks_total;
    row->running_max = KVC_MAX(row->running_max, s->running);
    row->waiting_max = KVC_MAX(row->waiting_max, s->waiting);
    row->swapped_max = KVC_MAX(row->swapped_max, s->swapped);
    row->batch_max = KVC_MAX(row->batch_max, s->batch_tokens);
    row->batch_sum += s->batch_tokens;
    if (adaptive)
        while (r->n_rows > r->p.max_rows) rows_coarsen(r);

    /* time-weighted means: a sample's state holds until the next sample */
    if (r->have_sample) {
        double dt = s->t_s - r->last.t_s;
        r->used_dt += dt * r->last.kv_blocks_used;
        r->running_dt += dt * r->last.running;
    } else {
        r->first_t = s->t_s;
    }
    r->have_sample = true;
    r->last = *s;
    r->n_samples++;
    r->batch_sum += s->batch_tokens;
    r->peak_used = KVC_MAX(r->peak_used, s->kv_blocks_used);
    r->peak_running = KVC_MAX(r->peak_running, s->running);
    r->total_blocks = s->kv_blocks_total;
    return 0;
}

static int add_config(kvc_report_t *r, const char *key, const char *text, double num)
{
    if (!key || !key[0] || (!text && !isfinite(num))) return KVC_EINVAL;
    for (size_t i = 0; i < r->n_config; i++)
        if (!strcmp(r->config[i].key, key)) return KVC_EEXIST;
    if (rgrow(r, (void **)&r->config, &r->cap_config, r->n_config + 1, sizeof *r->config,
              r->n_config))
        return KVC_ENOMEM;
    kvc__config_t c = {.key = rstrdup(r, key), .text = text ? rstrdup(r, text) : NULL, .num = num};
    if (!c.key || (text && !c.text)) {
        rfree(r, c.key);
        rfree(r, c.text);
        return KVC_ENOMEM;
    }
    r->config[r->n_config++] = c;
    return 0;
}

int kvc_report_add_config(kvc_report_t *r, const char *key, const char *value)
{
    if (!value) return KVC_EINVAL;
    return add_config(r, key, value, 0);
}

int kvc_report_add_config_num(kvc_report_t *r, const char *key, double value)
{
    return add_config(r, key, NULL, value);
}

/* ---- statistics ------------------------------------------------------------------------ */
double kvc_percentile_sorted(const double *sorted, size_t n, double p)
{
    if (n == 0) return 0;
    if (!(p >= 0)) p = 0;
    if (p > 100) p = 100;
    /* p in hundredths of a percent, then integer arithmetic: no rounding
     * error can move the rank */
    uint64_t bp = (uint64_t)llround(p * 100);
    uint64_t rank = (uint64_t)(((kvc__u128)bp * n + 9999) / 10000);
    if (rank == 0) rank = 1;
    if (rank > n) rank = n;
    return sorted[rank - 1];
}

/* Summary of v[0..n), ascending.  Means sum the sorted values, so they do
 * not depend on the order records were added in. */
static void summarise_sorted(const double *v, size_t n, kvc_latency_summary_t *s)
{
    memset(s, 0, sizeof *s);
    if (n == 0) return;
    double sum = 0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    s->count = n;
    s->mean = sum / (double)n;
    s->p50 = kvc_percentile_sorted(v, n, 50);
    s->p90 = kvc_percentile_sorted(v, n, 90);
    s->p95 = kvc_percentile_sorted(v, n, 95);
    s->p99 = kvc_percentile_sorted(v, n, 99);
    s->max = v[n - 1];
}

static double metric(const kvc__rec_t *x, int m)
{
    return m == 0 ? x->ttft_ms : m == 1 ? x->tpot_ms : x->e2e_ms;
}

static kvc_latency_summary_t *group_metric(kvc__group_t *g, int m)
{
    return m == 0 ? &g->ttft : m == 1 ? &g->tpot : &g->e2e;
}

/* A value and its record's groups.  Non-negative doubles order like their
 * bit patterns read as integers, so a radix sort on `key` sorts the values. */
typedef struct {
    uint64_t key;
    uint32_t tenant, cls;
} item_t;

static double item_value(const item_t *it)
{
    double v;
    memcpy(&v, &it->key, sizeof v);
    return v;
}

/* LSD radix sort, 16-bit digits, stable; passes where every key shares the
 * digit are skipped (the exponent bits rarely differ).  O(n). */
static void radix_sort(item_t *a, item_t *tmp, size_t n, size_t *count)
{
    for (int shift = 0; shift < 64; shift += 16) {
        memset(count, 0, 65536 * sizeof *count);
        for (size_t i = 0; i < n; i++) count[(a[i].key >> shift) & 0xffff]++;
        if (n == 0 || count[(a[0].key >> shift) & 0xffff] == n) continue;
        size_t at = 0;
        for (size_t d = 0; d < 65536; d++) {
            size_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++) tmp[count[(a[i].key >> shift) & 0xffff]++] = a[i];
        memcpy(a, tmp, n * sizeof *a);
    }
}

/* Per-group summaries from items sorted by value: a stable scatter by group
 * leaves each group's values sorted. */
static void summarise_groups(kvc__groups_t *g, const item_t *it, size_t n, bool by_tenant, int m,
                             double *v, size_t *start)
{
    memset(start, 0, ((size_t)g->n + 1) * sizeof *start);
    for (size_t i = 0; i < n; i++) start[(by_tenant ? it[i].tenant : it[i].cls) + 1]++;
    for (uint32_t k = 0; k < g->n; k++) start[k + 1] += start[k];
    for (size_t i = 0; i < n; i++)
        v[start[by_tenant ? it[i].tenant : it[i].cls]++] = item_value(&it[i]);
    size_t lo = 0; /* start[k] now ends group k */
    for (uint32_t k = 0; k < g->n; k++) {
        summarise_sorted(v + lo, start[k] - lo, group_metric(&g->groups[k], m));
        lo = start[k];
    }
}

int kvc_report_finish(kvc_report_t *r, const kvc_report_totals_t *t)
{
    if (r->finished || !t || !isfinite(t->simulated_s) || t->simulated_s < 0) return KVC_EINVAL;
    size_t n = r->n_recs;
    size_t n_count = KVC_MAX((size_t)65536, (size_t)KVC_MAX(r->tenants.n, r->classes.n) + 1);
    double *sorted[3] = {0};
    size_t counts[3] = {0};
    item_t *items = ralloc(r, n, sizeof *items), *tmp = ralloc(r, n, sizeof *tmp);
    double *v = ralloc(r, n, sizeof *v);
    size_t *count = ralloc(r, n_count, sizeof *count);
    int rc = KVC_ENOMEM;
    if (!items || !tmp || !v || !count) goto out;
    for (int m = 0; m < 3; m++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            double x = metric(&r->recs[i], m);
            if (x < 0) continue; /* no TPOT for a single output token */
            x += 0.0;            /* -0 sorts as 0 */
            memcpy(&items[k].key, &x, sizeof x);
            items[k].tenant = r->recs[i].tenant;
            items[k++].cls = r->recs[i].cls;
        }
        radix_sort(items, tmp, k, count);
        if (!(sorted[m] = ralloc(r, k, sizeof(double)))) goto out;
        for (size_t i = 0; i < k; i++) sorted[m][i] = item_value(&items[i]);
        counts[m] = k;
        summarise_sorted(sorted[m], k, group_metric(&r->all, m));
        summarise_groups(&r->tenants, items, k, true, m, v, count);
        summarise_groups(&r->classes, items, k, false, m, v, count);
    }
    for (int m = 0; m < 3; m++) {
        r->sorted[m] = sorted[m];
        r->n_sorted[m] = counts[m];
        sorted[m] = NULL;
    }
    r->totals = *t;
    r->simulated_s = t->simulated_s > 0 ? t->simulated_s : r->max_finish_s;
    if (r->have_sample) {
        double end = KVC_MAX(r->last.t_s, r->simulated_s);
        double span = end - r->first_t;
        double used_dt = r->used_dt + (end - r->last.t_s) * r->last.kv_blocks_used;
        double run_dt = r->running_dt + (end - r->last.t_s) * r->last.running;
        r->mean_used = span > 0 ? used_dt / span : r->last.kv_blocks_used;
        r->mean_running = span > 0 ? run_dt / span : r->last.running;
    }
    r->finished = true;
    rc = 0;
out:
    for (int m = 0; m < 3; m++) rfree(r, sorted[m]);
    rfree(r, items);
    rfree(r, tmp);
    rfree(r, v);
    rfree(r, count);
    return rc;
}

/* ---- reading back ---------------------------------------------------------------------- */
static void fill_summary(const kvc_report_t *r, const kvc__group_t *g, bool all,
                         kvc_report_summary_t *o)
{
    memset(o, 0, sizeof *o);
    o->completed = g->completed;
    o->good = g->good;
    o->prompt_tokens = g->prompt;
    o->output_tokens = g->output;
    o->hit_tokens = g->hit;
    o->preemptions = g->preemptions;
    o->recomputed_tokens = g->recomputed;
    if (all) {
        /* the simulator's own counts also cover requests that never finished */
        if (r->totals.prompt_tokens) {
            o->prompt_tokens = r->totals.prompt_tokens;
            o->hit_tokens = r->totals.hit_tokens;
        }
        o->preemptions = r->totals.preemptions;
        o->recomputed_tokens = r->totals.recomputed_tokens;
    }
    o->ttft_ms = g->ttft;
    o->tpot_ms = g->tpot;
    o->e2e_ms = g->e2e;
    double s = r->simulated_s;
    o->throughput_tokens_per_s = s > 0 ? (double)g->output / s : 0;
    o->goodput_requests_per_s = s > 0 ? (double)g->good / s : 0;
    o->prefix_hit_rate = o->prompt_tokens ? (double)o->hit_tokens / (double)o->prompt_tokens : 0;
}

int kvc_report_summary(const kvc_report_t *r, kvc_report_scope_t scope, uint32_t index,
                       kvc_report_summary_t *out)
{
    if (!r->finished) return KVC_EINVAL;
    const kvc__group_t *g = &r->all;
    if (scope == KVC_REPORT_TENANT || scope == KVC_REPORT_CLASS) {
        const kvc__groups_t *gs = scope == KVC_REPORT_TENANT ? &r->tenants : &r->classes;
        if (index >= gs->n) return KVC_ENOENT;
        g = &gs->groups[index];
    } else if (scope != KVC_REPORT_ALL) {
        return KVC_EINVAL;
    }
    fill_summary(r, g, scope == KVC_REPORT_ALL, out);
    return 0;
}

/* ---- JSON ---------------------------------------------------------------------------- */
/* A number with a fixed number of decimals; -0 prints as 0. */
static void num(FILE *f, double v, int decimals)
{
    if (!isfinite(v)) {
        fputs("null", f);
        return;
    }
    if (v == 0) v = 0;
    fprintf(f, "%.*f", decimals, v);
}

static void json_latency(FILE *f, const char *key, const kvc_latency_summary_t *s, const char *ind)
{
    fprintf(f, "%s\"%s\": {\"count\": %llu", ind, key, (unsigned long long)s->count);
    const char *names[] = {"mean", "p50", "p90", "p95", "p99", "max"};
    double vals[] = {s->mean, s->p50, s->p90, s->p95, s->p99, s->max};
    for (int i = 0; i < 6; i++) {
        fprintf(f, ", \"%s\": ", names[i]);
        if (s->count)
            num(f, vals[i], 3);
        else
            fputs("null", f);
    }
    fputs("}", f);
}

/* The fields a scope shares with the top level. */
static void json_scope(FILE *f, const kvc_report_summary_t *s, const char *ind)
{
    fprintf(f, "%s\"completed\": %llu,\n", ind, (unsigned long long)s->completed);
    json_latency(f, "ttft_ms", &s->ttft_ms, ind);
    fputs(",\n", f);
    json_latency(f, "tpot_ms", &s->tpot_ms, ind);
    fputs(",\n", f);
    json_latency(f, "e2e_ms", &s->e2e_ms, ind);
    fprintf(f, ",\n%s\"throughput_tokens_per_s\": ", ind);
    num(f, s->throughput_tokens_per_s, 3);
    fprintf(f, ",\n%s\"goodput_requests_per_s\": ", ind);
    num(f, s->goodput_requests_per_s, 3);
    fprintf(f, ",\n%s\"slo_attainment\": ", ind);
    num(f, s->completed ? (double)s->good / (double)s->completed : 0, 6);
    fprintf(f, ",\n%s\"prompt_tokens\": %llu,\n%s\"output_tokens\": %llu,\n%s\"hit_tokens\": %llu",
            ind, (unsigned long long)s->prompt_tokens, ind, (unsigned long long)s->output_tokens,
            ind, (unsigned long long)s->hit_tokens);
    fprintf(f, ",\n%s\"prefix_hit_rate\": ", ind);
    num(f, s->prefix_hit_rate, 6);
    fprintf(f, ",\n%s\"preemptions\": %llu,\n%s\"recomputed_tokens\": %llu", ind,
            (unsigned long long)s->preemptions, ind, (unsigned long long)s->recomputed_tokens);
}

static void json_groups(const kvc_report_t *r, FILE *f, const char *key, const kvc__groups_t *g,
                        const char *prefix)
{
    fprintf(f, ",\n  \"%s\": {", key);
    for (uint32_t i = 0; i < g->n; i++) {
        char buf[32];
        kvc_report_summary_t s;
        fill_summary(r, &g->groups[i], false, &s);
        fputs(i ? ",\n    " : "\n    ", f);
        kvc__json_string(f, kvc__group_name(g, i, prefix, buf, sizeof buf));
        fputs(": {\n", f);
        json_scope(f, &s, "      ");
        fputs("\n    }", f);
    }
    fputs(g->n ? "\n  }" : "}", f);
}

static void slo(FILE *f, double v)
{
    if (v > 0)
        num(f, v, 3);
    else
        fputs("null", f);
}

int kvc_report_write_json(const kvc_report_t *r, FILE *f)
{
    if (!r->finished) return KVC_EINVAL;
    kvc_report_summary_t s;
    fill_summary(r, &r->all, true, &s);
    double secs = r->simulated_s;
    fputs("{\n", f);
    json_scope(f, &s, "  ");
    fprintf(f, ",\n  \"swapped_bytes\": %llu,\n  \"peak_kv_blocks\": %u",
            (unsigned long long)r->totals.swapped_bytes,
            KVC_MAX(r->totals.peak_kv_blocks, r->peak_used));
    const kvc_report_totals_t *t = &r->totals;
    fprintf(f,
            ",\n  \"stranded_blocks\": {\"peak\": %llu, \"end\": %llu},\n  \"stranded_bytes\": "
            "{\"peak\": %llu, \"end\": %llu},\n  \"strandings\": %llu,\n  \"errored_requests\": "
            "%llu",
            (unsigned long long)t->peak_stranded_blocks, (unsigned long long)t->end_stranded_blocks,
            (unsigned long long)t->peak_stranded_bytes, (unsigned long long)t->end_stranded_bytes,
            (unsigned long long)t->strandings, (unsigned long long)t->errored);
    fputs(",\n  \"simulated_seconds\": ", f);
    num(f, secs, 6);
    fprintf(f, ",\n  \"steps\": %llu", (unsigned long long)r->totals.steps);
    fputs(",\n  \"requests_per_s\": ", f);
    num(f, secs > 0 ? (double)s.completed / secs : 0, 3);
    fputs(",\n  \"total_tokens_per_s\": ", f);
    num(f, secs > 0 ? (double)(r->all.prompt + r->all.output) / secs : 0, 3);
    fputs(",\n  \"slo\": {\"ttft_ms\": ", f);
    slo(f, r->p.ttft_ms);
    fputs(", \"tpot_ms\": ", f);
    slo(f, r->p.tpot_ms);
    fputs(", \"e2e_ms\": ", f);
    slo(f, r->p.e2e_ms);
    fprintf(f, "},\n  \"kv_blocks_total\": %u,\n  \"mean_kv_blocks_used\": ", r->total_blocks);
    num(f, r->mean_used, 3);
    fprintf(f, ",\n  \"peak_running\": %u,\n  \"mean_running\": ", r->peak_running);
    num(f, r->mean_running, 3);
    fputs(",\n  \"mean_batch_tokens\": ", f);
    num(f, r->n_samples ? (double)r->batch_sum / (double)r->n_samples : 0, 3);
    fprintf(f, ",\n  \"samples\": %llu,\n  \"series_rows\": %zu,\n  \"series_interval_s\": ",
            (unsigned long long)r->n_samples, r->n_rows);
    num(f, r->interval, 6);
    json_groups(r, f, "tenants", &r->tenants, "tenant");
    json_groups(r, f, "classes", &r->classes, "class");
    kvc__report_tiers_json(r, f);
    fputs(",\n  \"config\": {", f);
    for (size_t i = 0; i < r->n_config; i++) {
        fputs(i ? ",\n    " : "\n    ", f);
        kvc__json_string(f, r->config[i].key);
        fputs(": ", f);
        if (r->config[i].text)
            kvc__json_string(f, r->config[i].text);
        else
            fprintf(f, "%.17g", r->config[i].num == 0 ? 0.0 : r->config[i].num);
    }
    fputs(r->n_config ? "\n  }\n}\n" : "}\n}\n", f);
    return ferror(f) ? KVC_EIO : 0;
}

/* ---- text ------------------------------------------------------------------------------ */
static void text_latency(FILE *f, const char *name, const kvc_latency_summary_t *s)
{
    fprintf(f, "  %-12s%10llu", name, (unsigned long long)s->count);
    double v[] = {s->mean, s->p50, s->p90, s->p95, s->p99, s->max};
    for (int i = 0; i < 6; i++) {
        if (s->count)
            fprintf(f, " %11.3f", v[i] == 0 ? 0.0 : v[i]);
        else
            fprintf(f, " %11s", "-");
    }
    fputc('\n', f);
}

static void text_ms(FILE *f, const kvc_latency_summary_t *s, double v)
{
    if (s->count)
        fprintf(f, " %10.1f", v == 0 ? 0.0 : v);
    else
        fprintf(f, " %10s", "-");
}

/* Group i's name as the text report prints it: control bytes escaped, at most 40 bytes. */
static const char *text_name(const kvc__groups_t *g, uint32_t i, const char *prefix, char *out,
                             size_t cap)
{
    char buf[32];
    const char *s = kvc__group_name(g, i, prefix, buf, sizeof buf);
    kvc__sim_escape(out, KVC_MIN(cap, (size_t)41), s, strlen(s));
    return out;
}

static void text_groups(const kvc_report_t *r, FILE *f, const char *title, const kvc__groups_t *g,
                        const char *prefix)
{
    if (g->n == 0) return;
    int width = (int)strlen(title);
    char buf[64];
    for (uint32_t i = 0; i < g->n; i++)
        width = KVC_MAX(width, (int)strlen(text_name(g, i, prefix, buf, sizeof buf)));
    width = KVC_MIN(width, 40);
    fprintf(f, "\n%-*s  %9s %10s %10s %10s %10s %10s %12s %8s %8s\n", width, title, "completed",
            "ttft p50", "ttft p99", "tpot p50", "tpot p99", "e2e p99", "out tok/s", "goodput",
            "hit");
    for (uint32_t i = 0; i < g->n; i++) {
        kvc_report_summary_t s;
        fill_summary(r, &g->groups[i], false, &s);
        fprintf(f, "%-*.*s  %9llu", width, width, text_name(g, i, prefix, buf, sizeof buf),
                (unsigned long long)s.completed);
        text_ms(f, &s.ttft_ms, s.ttft_ms.p50);
        text_ms(f, &s.ttft_ms, s.ttft_ms.p99);
        text_ms(f, &s.tpot_ms, s.tpot_ms.p50);
        text_ms(f, &s.tpot_ms, s.tpot_ms.p99);
        text_ms(f, &s.e2e_ms, s.e2e_ms.p99);
        fprintf(f, " %12.1f %8.3f %7.1f%%\n", s.throughput_tokens_per_s, s.goodput_requests_per_s,
                100.0 * s.prefix_hit_rate);
    }
}

/* s with control bytes escaped (a name or setting may come from the input), padded to
 * `width`. */
static void text_escaped(FILE *f, const char *s, int width)
{
    int n = 0;
    for (size_t len = strlen(s); len;) {
        char buf[256];
        size_t take = KVC_MIN(len, (size_t)60); /* 60 bytes escape to at most 240 */
        n += (int)kvc__sim_escape(buf, sizeof buf, s, take);
        fputs(buf, f);
        s += take;
        len -= take;
    }
    for (; n < width; n++) fputc(' ', f);
}

int kvc_report_write_text(const kvc_report_t *r, FILE *f)
{
    if (!r->finished) return KVC_EINVAL;
    kvc_report_summary_t s;
    fill_summary(r, &r->all, true, &s);
    double secs = r->simulated_s;
    fprintf(f, "simulation report\n");
    fprintf(f, "  completed          %llu requests in %.3f simulated s (%llu steps)\n",
            (unsigned long long)s.completed, secs, (unsigned long long)r->totals.steps);
    fprintf(f, "  throughput         %.1f output tokens/s, %.1f total tokens/s, %.3f requests/s\n",
            s.throughput_tokens_per_s,
            secs > 0 ? (double)(r->all.prompt + r->all.output) / secs : 0.0,
            secs > 0 ? (double)s.completed / secs : 0.0);
    fprintf(f, "  goodput            %.3f requests/s ", s.goodput_requests_per_s);
    if (r->p.ttft_ms > 0 || r->p.tpot_ms > 0 || r->p.e2e_ms > 0) {
        fprintf(f, "(%.1f%% met", s.completed ? 100.0 * (double)s.good / (double)s.completed : 0.0);
        const char *sep = " ";
        if (r->p.ttft_ms > 0) {
            fprintf(f, "%sTTFT <= %.6g ms", sep, r->p.ttft_ms);
            sep = ", ";
        }
        if (r->p.tpot_ms > 0) {
            fprintf(f, "%sTPOT <= %.6g ms", sep, r->p.tpot_ms);
            sep = ", ";
        }
        if (r->p.e2e_ms > 0) fprintf(f, "%sE2E <= %.6g ms", sep, r->p.e2e_ms);
        fputs(")\n", f);
    } else {
        fputs("(no SLO given: every completed request counts)\n", f);
    }
    fprintf(f, "  prefix hit rate    %.2f%% (%llu of %llu prompt tokens)\n",
            100.0 * s.prefix_hit_rate, (unsigned long long)s.hit_tokens,
            (unsigned long long)s.prompt_tokens);
    fprintf(f, "  preemptions        %llu (%llu tokens recomputed, %llu bytes swapped)\n",
            (unsigned long long)s.preemptions, (unsigned long long)s.recomputed_tokens,
            (unsigned long long)r->totals.swapped_bytes);
    uint32_t peak = KVC_MAX(r->totals.peak_kv_blocks, r->peak_used);
    fprintf(f, "  KV blocks          peak %u", peak);
    if (r->total_blocks)
        fprintf(f, " of %u (%.1f%%), mean %.1f", r->total_blocks, 100.0 * peak / r->total_blocks,
                r->mean_used);
    fputc('\n', f);
    const kvc_report_totals_t *t = &r->totals;
    char pb[32], eb[32];
    fprintf(f,
            "  stranded KV        peak %llu blocks (%s), at the end %llu (%s); %llu blocks "
            "stranded in all\n",
            (unsigned long long)t->peak_stranded_blocks,
            kvc__fmt_iec(pb, sizeof pb, (double)t->peak_stranded_bytes),
            (unsigned long long)t->end_stranded_blocks,
            kvc__fmt_iec(eb, sizeof eb, (double)t->end_stranded_bytes),
            (unsigned long long)t->strandings);
    fprintf(f, "  errored requests   %llu (ended by an error; not in the latencies)\n",
            (unsigned long long)t->errored);
    fprintf(f, "  running            peak %u, mean %.2f; %.1f tokens per step\n", r->peak_running,
            r->mean_running, r->n_samples ? (double)r->batch_sum / (double)r->n_samples : 0.0);
    fprintf(f, "\n%-14s%10s %11s %11s %11s %11s %11s %11s\n", "latency (ms)", "count", "mean",
            "p50", "p90", "p95", "p99", "max");
    text_latency(f, "TTFT", &s.ttft_ms);
    text_latency(f, "TPOT", &s.tpot_ms);
    text_latency(f, "E2E", &s.e2e_ms);
    text_groups(r, f, "tenant", &r->tenants, "tenant");
    text_groups(r, f, "class", &r->classes, "class");
    kvc__report_tiers_text(r, f);
    if (r->n_config) {
        fputs("\nconfig\n", f);
        for (size_t i = 0; i < r->n_config; i++) {
            fputs("  ", f);
            text_escaped(f, r->config[i].key, 28);
            if (r->config[i].text) {
                fputc(' ', f);
                text_escaped(f, r->config[i].text, 0);
                fputc('\n', f);
            } else {
                fprintf(f, " %.10g\n", r->config[i].num);
            }
        }
    }
    return ferror(f) ? KVC_EIO : 0;
}

/* ---- CSV --------------------------------------------------------------------------------- */
int kvc_report_write_csv(const kvc_report_t *r, FILE *f)
{
    if (!r->finished) return KVC_EINVAL;
    fputs("t_s,steps,kv_blocks_used,kv_blocks_total,kv_usage,running,waiting,swapped,"
          "batch_tokens_mean,batch_tokens_max\n",
          f);
    for (size_t i = 0; i < r->n_rows; i++) {
        const kvc__row_t *x = &r->rows[i];
        fprintf(f, "%.6f,%u,%u,%u,%.4f,%u,%u,%u,%.2f,%u\n", (double)x->idx * r->interval, x->steps,
                x->used_max, x->total_last,
                x->total_last ? (double)x->used_max / x->total_last : 0.0, x->running_max,
                x->waiting_max, x->swapped_max, (double)x->batch_sum / x->steps, x->batch_max);
    }
    return ferror(f) ? KVC_EIO : 0;
}

/* ---- progress bar ------------------------------------------------------------------------ */
#define PROGRESS_DELAY_NS  1000000000ULL
#define PROGRESS_PERIOD_NS 100000000ULL
#define PROGRESS_WIDTH     30

static uint64_t progress_now(const kvc_progress_t *p)
{
    return p->now_ns ? p->now_ns(p->now_ctx) : kvc_now_ns();
}

void kvc_progress_start(kvc_progress_t *p, FILE *f, const char *label, bool force)
{
    memset(p, 0, sizeof *p);
    p->f = f;
    p->label = label ? label : "";
    p->force = force;
    p->enabled = f && (force || isatty(fileno(f)));
    p->start_ns = kvc_now_ns();
}

static void progress_draw(kvc_progress_t *p, uint64_t done, uint64_t total, uint64_t now)
{
    double frac = total ? (double)KVC_MIN(done, total) / (double)total : 0;
    int fill = (int)(frac * PROGRESS_WIDTH);
    char bar[PROGRESS_WIDTH + 1];
    for (int i = 0; i < PROGRESS_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[PROGRESS_WIDTH] = '\0';
    double secs = (double)(now - p->start_ns) / 1e9;
    fprintf(p->f, "\r%s [%s] %5.1f%% %llu/%llu %.1fs", p->label, bar, 100 * frac,
            (unsigned long long)done, (unsigned long long)total, secs);
    if (frac > 0 && frac < 1)
        fprintf(p->f, " eta %.1fs   ", secs * (1 - frac) / frac);
    else
        fputs("          ", p->f);
    fflush(p->f);
    p->drawn = true;
    p->last_draw_ns = now;
}

void kvc_progress_update(kvc_progress_t *p, uint64_t done, uint64_t total)
{
    if (!p->enabled) return;
    uint64_t now = progress_now(p);
    if (now - p->start_ns < PROGRESS_DELAY_NS) return;
    if (p->drawn && now - p->last_draw_ns < PROGRESS_PERIOD_NS) return;
    progress_draw(p, done, total, now);
}

void kvc_progress_finish(kvc_progress_t *p, uint64_t done, uint64_t total)
{
    if (!p->enabled || !p->drawn) return;
    progress_draw(p, done, total, progress_now(p));
    fputc('\n', p->f);
    fflush(p->f);
    p->drawn = false;
}
