/* tiers_int.h - internal: the simulator's KV tiers (tiers.c) as engine.c drives them.  One
 * object per run; local tiers (host, disk) live per replica, between replica_begin and
 * replica_end; a redis tier lives for the run, shared by the replicas.  Not installed. */
#ifndef KVC_SIM_TIERS_INT_H
#define KVC_SIM_TIERS_INT_H

#include "kvcache/sim.h"

typedef struct kvc__sim_tiers kvc__sim_tiers_t;

/* The run's tiers for cfg (resolved: its plan limits are the planner's), from the planner's
 * result pr and the cost model cm (copied), allocating through `a` (borrowed for the run).
 * KVC_EINVAL with one line in err (too many tiers, the prefix cache off, sliding-window
 * groups, a tier that holds no block), KVC_ENOMEM. */
int kvc__sim_tiers_create(const kvc_sim_config_t *cfg, const kvc_plan_result_t *pr,
                          const kvc_sim_cost_model_t *cm, uint32_t n_groups,
                          const kvc_allocator_t *a, kvc__sim_tiers_t **out, char *err, size_t cap);
void kvc__sim_tiers_destroy(kvc__sim_tiers_t *t); /* NULL: no-op */
/* Route the prefix cache's events to the tiers (before kvc_prefix_create). */
void kvc__sim_tiers_hook(kvc__sim_tiers_t *t, kvc_prefix_params_t *cp);
/* A replica starts: its prefix cache and pool, its clock (read at every event), its local
 * stores.  KVC_ENOMEM. */
int kvc__sim_tiers_replica_begin(kvc__sim_tiers_t *t, kvc_prefix_t *pc, uint32_t num_blocks,
                                 const double *now);
/* The replica ends: its local stores' counters are summed in, the stores freed.  Returns the
 * first error an event met (KVC_ENOMEM), else 0. */
int kvc__sim_tiers_replica_end(kvc__sim_tiers_t *t);
/* Admission of workload request wi with query q (its prompt, namespace, priority) at the
 * replica's now.  A request whose fetch is complete (its second call): the fetched blocks
 * are cached in the pool, *arrival is set back to the arrival it had when the fetch began,
 * *wait false.  Otherwise the lookup continues past the pool in the tiers; when runs are
 * fetched, *wait is true and *ready_s the time the last one completes (call again then).
 * KVC_ENOMEM, KVC_ECORRUPT (a layer below refused what only a bug would make it refuse). */
int kvc__sim_tiers_admit(kvc__sim_tiers_t *t, const kvc_prefix_query_t *q, uint32_t wi,
                         double *arrival, bool *wait, double *ready_s);
/* Whether workload request wi has a fetch in flight or complete (its admission is the second
 * call above, which must not be held back again). */
bool kvc__sim_tiers_fetching(const kvc__sim_tiers_t *t, uint32_t wi);
/* The tiers' counters and table into out. */
void kvc__sim_tiers_result(const kvc__sim_tiers_t *t, kvc_sim_result_t *out);

/* The report's tiers section (report.c calls these). */
int kvc__report_tiers_text(const kvc_report_t *r, FILE *f);
int kvc__report_tiers_json(const kvc_report_t *r, FILE *f);
void kvc__report_tiers_free(kvc_report_t *r);

#endif
