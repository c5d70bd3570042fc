/* profile.c - a measured hardware profile for the simulator's cost model: step times on a
 * grid of (batch tokens, mean keys per query), read from the JSON a bench program writes
 * (bench/bench_profile.c), interpolated bilinearly, and the server's fixed costs around the
 * steps (per request, per step) measured beside it.  cost.c uses it in place of the roofline
 * when the run's config names one; engine.c delays each admission by its per-request cost.  See
 * include/kvcache/sim.h. */
#include "kvcache/sim.h"
#include "util/msg.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvc_sim_profile {
    uint32_t n_tokens, n_context;
    kvc_sim_profile_fixed_t fixed; /* the optional fixed costs (0 in a profile without them) */
    double tokens[KVC_SIM_PROFILE_MAX_POINTS], context[KVC_SIM_PROFILE_MAX_POINTS];
    double *step_s; /* (n_tokens, n_context) */
};

/* An axis: an array of 1..KVC_SIM_PROFILE_MAX_POINTS strictly increasing numbers >= lo. */
static int axis(const cJSON *o, const char *key, double lo, const char *name, double *v,
                uint32_t *n, char *err, size_t cap)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsArray(a))
        return kvc__msgf(KVC_EPARSE, err, cap, "%s: \"%s\" must be an array of numbers", name, key);
    int len = cJSON_GetArraySize(a);
    if (len < 1 || len > KVC_SIM_PROFILE_MAX_POINTS)
        return kvc__msgf(KVC_EPARSE, err, cap, "%s: \"%s\" has %d values; 1 to %d", name, key, len,
                         KVC_SIM_PROFILE_MAX_POINTS);
    uint32_t i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < lo)
            return kvc__msgf(KVC_EPARSE, err, cap, "%s: \"%s\"[%u] must be a number >= %g", name,
                             key, i, lo);
        v[i] = x->valuedouble;
        if (i && v[i] <= v[i - 1])
            return kvc__msgf(KVC_EPARSE, err, cap, "%s: \"%s\" must increase (at %u)", name, key,
                             i);
    }
    *n = i;
    return 0;
}

/* An optional field: absent, *v stays 0; present, a number of ms from 0 to 60000 (*v in s):
 * a fixed cost over a minute is no server's, and would push the simulated clock past use. */
static int fixed_ms(const cJSON *o, const char *key, const char *name, double *v, char *err,
                    size_t cap)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x) return 0;
    if (!cJSON_IsNumber(x) || !(x->valuedouble >= 0 && x->valuedouble <= 60000))
        return kvc__msgf(KVC_EPARSE, err, cap, "%s: \"%s\" must be a number of ms from 0 to 60000",
                         name, key);
    *v = x->valuedouble * 1e-3;
    return 0;
}

int kvc_sim_profile_parse(const char *json, size_t len, const char *name, kvc_sim_profile_t **out,
                          char *err, size_t cap)
{
    if (!out) return KVC_EINVAL;
    *out = NULL;
    if (!json || !name) return KVC_EINVAL;
    cJSON *o = cJSON_ParseWithLength(json, len);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return kvc__msgf(KVC_EPARSE, err, cap, "%s: not a JSON object", name);
    }
    kvc_sim_profile_t *p = calloc(1, sizeof *p);
    int rc = p ? 0 : KVC_ENOMEM;
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "kvcache_profile");
    if (!rc && (!cJSON_IsNumber(ver) || ver->valuedouble != 1))
        rc = kvc__msgf(KVC_EPARSE, err, cap, "%s: not a kvcache profile (\"kvcache_profile\": 1)",
                       name);
    if (!rc) rc = axis(o, "tokens", 1, name, p->tokens, &p->n_tokens, err, cap);
    if (!rc) rc = axis(o, "context", 0, name, p->context, &p->n_context, err, cap);
    if (!rc) rc = fixed_ms(o, "request_ms", name, &p->fixed.request_s, err, cap);
    if (!rc) rc = fixed_ms(o, "step_overhead_ms", name, &p->fixed.step_s, err, cap);
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(o, "step_ms");
    if (!rc && (!cJSON_IsArray(rows) || cJSON_GetArraySize(rows) != (int)p->n_tokens))
        rc = kvc__msgf(KVC_EPARSE, err, cap,
                       "%s: \"step_ms\" must be an array of %u rows (one per tokens value)", name,
                       p->n_tokens);
    if (!rc && !(p->step_s = malloc((size_t)p->n_tokens * p->n_context * sizeof *p->step_s)))
        rc = KVC_ENOMEM;
    uint32_t i = 0;
    for (const cJSON *row = rows ? rows->child : NULL; !rc && row; row = row->next, i++) {
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != (int)p->n_context) {
            rc = kvc__msgf(KVC_EPARSE, err, cap,
                           "%s: \"step_ms\"[%u] must be an array of %u numbers (one per context "
                           "value)",
                           name, i, p->n_context);
            break;
        }
        uint32_t k = 0;
        for (const cJSON *x = row->child; x; x = x->next, k++) {
            if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || !(x->valuedouble > 0)) {
                rc = kvc__msgf(KVC_EPARSE, err, cap,
                               "%s: \"step_ms\"[%u][%u] must be a positive number of ms", name, i,
                               k);
                break;
            }
            p->step_s[(size_t)i * p->n_context + k] = x->valuedouble * 1e-3;
        }
    }
    cJSON_Delete(o);
    if (rc) {
        if (rc == KVC_ENOMEM) kvc__msgf(rc, err, cap, "%s: out of memory", name);
        kvc_sim_profile_destroy(p);
        return rc;
    }
    *out = p;
    return 0;
}

int kvc_sim_profile_load(const char *path, kvc_sim_profile_t **out, char *err, size_t cap)
{
    if (!out) return KVC_EINVAL;
    *out = NULL;
    if (!path) return KVC_EINVAL;
    FILE *f = fopen(path, "rb");
    if (!f) return kvc__msgf(KVC_EIO, err, cap, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, bcap = 0;
    int rc = 0;
    for (;;) {
        if (len + 4096 > bcap) {
            if (bcap >= (64u << 20)) {
                rc = kvc__msgf(KVC_EPARSE, err, cap, "%s: over 64 MiB: not a profile", path);
                break;
            }
            size_t nc = bcap ? bcap * 2 : 65536;
            char *nb = realloc(buf, nc);
            if (!nb) {
                rc = kvc__msgf(KVC_ENOMEM, err, cap, "%s: out of memory", path);
                break;
            }
            buf = nb, bcap = nc;
        }
        size_t r = fread(buf + len, 1, bcap - len, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) rc = kvc__msgf(KVC_EIO, err, cap, "%s: cannot read", path);
            break;
        }
    }
    fclose(f);
    if (!rc) rc = kvc_sim_profile_parse(buf, len, path, out, err, cap);
    free(buf);
    return rc;
}

void kvc_sim_profile_destroy(kvc_sim_profile_t *p)
{
    if (!p) return;
    free(p->step_s);
    free(p);
}

/* The segment of axis v (n values) that x falls in or extends, and x's position along it
 * (0..1 inside, beyond either end outside). */
static uint32_t segment(const double *v, uint32_t n, double x, double *t)
{
    if (n == 1) {
        *t = 0;
        return 0;
    }
    uint32_t i = 0;
    while (i + 2 < n && x > v[i + 1]) i++;
    *t = (x - v[i]) / (v[i + 1] - v[i]);
    return i;
}

double kvc_sim_profile_step_s(const kvc_sim_profile_t *p, double tokens, double context)
{
    double tt, tc;
    uint32_t i = segment(p->tokens, p->n_tokens, tokens, &tt);
    uint32_t k = segment(p->context, p->n_context, context, &tc);
    const uint32_t i1 = p->n_tokens > 1 ? i + 1 : i, k1 = p->n_context > 1 ? k + 1 : k;
    const double *s = p->step_s;
    const size_t nc = p->n_context;
    double a = s[i * nc + k] + tc * (s[i * nc + k1] - s[i * nc + k]);
    double b = s[i1 * nc + k] + tc * (s[i1 * nc + k1] - s[i1 * nc + k]);
    double v = a + tt * (b - a);
    return v > 0 && isfinite(v) ? v : 0;
}

kvc_sim_profile_fixed_t kvc_sim_profile_fixed(const kvc_sim_profile_t *p)
{
    return p ? p->fixed : (kvc_sim_profile_fixed_t){0};
}
