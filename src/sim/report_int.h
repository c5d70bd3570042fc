/* report_int.h - the report object, shared by report.c (accumulation,
 * statistics, text/JSON/CSV) and svg.c (charts).  Not installed. */
#ifndef KVC_SIM_REPORT_INT_H
#define KVC_SIM_REPORT_INT_H

#include "kvcache/sim.h"

/* What a record keeps for the percentiles; the sums go to the groups. */
typedef struct {
    double ttft_ms, tpot_ms, e2e_ms; /* tpot_ms < 0: n_output == 1, no TPOT */
    uint32_t tenant, cls;
} kvc__rec_t;

typedef struct {
    uint64_t completed, good, prompt, output, hit, preemptions, recomputed;
    kvc_latency_summary_t ttft, tpot, e2e; /* filled by finish */
} kvc__group_t;

/* One time-series row: the samples of one interval. */
typedef struct {
    uint64_t idx;   /* the interval: [idx * interval, (idx + 1) * interval) */
    uint32_t steps; /* samples folded in */
    uint32_t used_max, total_last, running_max, waiting_max, swapped_max, batch_max;
    uint64_t batch_sum;
} kvc__row_t;

typedef struct {
    char *key, *text; /* text NULL: a number */
    double num;
} kvc__config_t;

typedef struct {
    char **names;
    uint32_t n_named; /* from the params */
    kvc__group_t *groups;
    uint32_t n, cap; /* groups seen or named */
} kvc__groups_t;

struct kvc_report {
    kvc_report_params_t p;
    kvc__groups_t tenants, classes;
    kvc__group_t all;
    kvc__rec_t *recs;
    size_t n_recs, cap_recs;
    kvc__row_t *rows;
    size_t n_rows, cap_rows;
    double interval; /* current row interval, s */
    /* samples, for the time-weighted means and peaks */
    bool have_sample;
    kvc_sim_sample_t last;
    double first_t;
    double used_dt, running_dt; /* integrals of value * dt */
    uint64_t n_samples, batch_sum;
    uint32_t peak_used, peak_running, total_blocks;
    kvc__config_t *config;
    size_t n_config, cap_config;
    bool finished;
    kvc_report_totals_t totals;
    double simulated_s;  /* the totals', or the last finish */
    double max_finish_s; /* the latest record's finish_s */
    double *sorted[3];   /* ttft, tpot, e2e of every record, ascending (finish) */
    size_t n_sorted[3];
    double mean_used, mean_running;
    struct kvc__report_tiers *tiers; /* kvc_report_set_tiers (tiers.c); NULL: none */
};

/* The name of group i: the named one, or "<prefix><i>" in buf. */
const char *kvc__group_name(const kvc__groups_t *g, uint32_t i, const char *prefix, char *buf,
                            size_t cap);

#endif
