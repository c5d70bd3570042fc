/* synth.c - synthetic workloads of the sim layer: the spec (a JSON object
 * of streams, or an inline "poisson:rate=5,n=100,..." string) and the
 * generator.
 *
 * Each stream draws every quantity from its own random stream (arrivals,
 * prompt, output, user turns, turn counts, think times, prefix groups), all
 * seeded from the workload seed and the stream's index, so changing one
 * distribution leaves the others' draws alone, and a workload cut by
 * max_requests is exactly the first requests of the whole one.
 *
 * Tokens: a request without shared structure gets a window of one seeded
 * random tape, at an offset no other request uses; its output continues the
 * window.  Windows overlap, but a prefix cache chains block hashes from the
 * first token, so two windows at different offsets share a prefix only as
 * two independent random prompts would (by chance, at 1/vocab per token),
 * and a million 1K-token prompts take 4 MB instead of 4 GB.  A request of a
 * shared-prefix group holds its own copy (the group's prefix, then fresh
 * tokens); a conversation holds one buffer, [prompt 0][output 0][user 1]
 * [output 1]..., and turn k's prompt and output are windows of it, so each
 * turn resends exactly the previous turn's prompt and output. */
#include "workload_int.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- distributions ------------------------------------------------------------------ */
typedef enum { D_FIXED, D_UNIFORM, D_NORMAL, D_LOGNORMAL, D_EXPONENTIAL } dkind_t;

typedef struct {
    dkind_t kind;
    bool integer;
    double a, b;   /* fixed: value; uniform: min, max; normal: mean, stddev;
                      lognormal: mu, sigma of the log; exponential: mean */
    double lo, hi; /* clamp */
} dist_t;

static double u01(kvc_rng_t *r)
{
    return kvc_rng_double(r);
}

static double std_normal(kvc_rng_t *r)
{
    double u1 = 1.0 - u01(r), u2 = u01(r); /* u1 in (0, 1]: the log is finite */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}

static double dist_sample(const dist_t *d, kvc_rng_t *r)
{
    double x;
    switch (d->kind) {
    case D_FIXED:
        return d->a;
    case D_UNIFORM:
        if (d->integer) return d->a + (double)kvc_rng_below(r, (uint64_t)(d->b - d->a) + 1);
        x = d->a + (d->b - d->a) * u01(r);
        break;
    case D_NORMAL:
        x = d->a + d->b * std_normal(r);
        break;
    case D_LOGNORMAL:
        x = exp(d->a + d->b * std_normal(r));
        break;
    default:
        x = -d->a * log(1.0 - u01(r));
        break;
    }
    if (d->integer) x = floor(x + 0.5);
    if (x < d->lo) x = d->lo;
    if (x > d->hi) x = d->hi;
    return x;
}

/* The smallest value a distribution can give. */
static double dist_min(const dist_t *d)
{
    return d->kind == D_FIXED ? d->a : d->lo;
}

/* ---- parsing context ------------------------------------------------------------------ */
typedef struct {
    const char *what; /* the file or inline string, for messages */
    char *err;
    size_t err_cap;
} ctx_t;

static int bad(ctx_t *c, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(ctx_t *c, const char *path, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvc__errf(c->err, c->err_cap, "%s: %s: %s", c->what, path, msg);
    return KVC_EPARSE;
}

static bool key_allowed(const char *k, const char *const *allowed)
{
    if (!strcmp(k, "comment") || !strcmp(k, "description")) return true;
    for (; *allowed; allowed++)
        if (!strcmp(k, *allowed)) return true;
    return false;
}

/* Unknown keys in a spec are errors: a typo must not silently fall back to a default. */
static int check_keys(ctx_t *c, const cJSON *o, const char *path, const char *const *allowed)
{
    for (const cJSON *it = o->child; it; it = it->next)
        if (!key_allowed(it->string, allowed)) return bad(c, path, "unknown key '%s'", it->string);
    return 0;
}

/* "an integer in [1, 16777216]" and the like, with bounds printed exactly. */
static void want_text(char *buf, size_t cap, bool integer, double lo, double hi)
{
    char a[32], b[32];
    snprintf(a, sizeof a, lo == floor(lo) && fabs(lo) < 1e15 ? "%.0f" : "%g", lo);
    snprintf(b, sizeof b, hi == floor(hi) && fabs(hi) < 1e15 ? "%.0f" : "%g", hi);
    const char *what = integer ? "an integer" : "a number";
    if (hi >= 1e300)
        snprintf(buf, cap, "%s >= %s", what, a);
    else
        snprintf(buf, cap, "%s in [%s, %s]", what, a, b);
}

/* A number at obj[key] in [lo, hi] (integral if `integer`).  Absent:
 * *present false (or an error if required). */
static int get_num(ctx_t *c, const cJSON *obj, const char *path, const char *key, double lo,
                   double hi, bool integer, bool required, double *out, bool *present)
{
    char where[192];
    snprintf(where, sizeof where, "%s.%s", path, key);
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (present) *present = it != NULL;
    if (!it) return required ? bad(c, where, "%s", "missing") : 0;
    double v = it->valuedouble;
    char want[96];
    want_text(want, sizeof want, integer, lo, hi);
    if (!cJSON_IsNumber(it) || !isfinite(v) || v < lo || v > hi || (integer && v != floor(v)))
        return bad(c, where, "expected %s", want);
    *out = v;
    return 0;
}

static int get_pos(ctx_t *c, const cJSON *obj, const char *path, const char *key, bool required,
                   double *out, bool *present)
{
    int rc = get_num(c, obj, path, key, 0, 1e300, false, required, out, present);
    if (!rc && (!present || *present) && *out <= 0) {
        char where[192];
        snprintf(where, sizeof where, "%s.%s", path, key);
        return bad(c, where, "%s", "expected a number > 0");
    }
    return rc;
}

/* A distribution: a bare number (fixed) or {"dist": ..., ...}.  Values lie
 * in [lo, hi]; `integer` rounds draws to the nearest integer. */
static int get_dist(ctx_t *c, const cJSON *v, const char *path, bool integer, double lo, double hi,
                    dist_t *d)
{
    memset(d, 0, sizeof *d);
    d->integer = integer;
    d->lo = lo;
    d->hi = hi;
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        if (!isfinite(x) || x < lo || x > hi || (integer && x != floor(x))) {
            char want[96];
            want_text(want, sizeof want, integer, lo, hi);
            return bad(c, path, "expected %s", want);
        }
        d->kind = D_FIXED;
        d->a = x;
        return 0;
    }
    if (!cJSON_IsObject(v)) return bad(c, path, "%s", "expected a number or a distribution object");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(v, "dist");
    if (!cJSON_IsString(k)) {
        char where[192];
        snprintf(where, sizeof where, "%s.dist", path);
        return bad(c, where, "%s",
                   "expected one of \"fixed\", \"uniform\", \"normal\", \"lognormal\", "
                   "\"exponential\"");
    }
    const char *kind = k->valuestring;
    static const char *const k_fixed[] = {"dist", "value", NULL};
    static const char *const k_uniform[] = {"dist", "min", "max", NULL};
    static const char *const k_shaped[] = {"dist", "mean", "stddev", "min", "max", NULL};
    static const char *const k_exp[] = {"dist", "mean", "min", "max", NULL};
    int rc;
    double mean = 0, sd = 0;
    bool has;
    if (!strcmp(kind, "fixed")) {
        if ((rc = check_keys(c, v, path, k_fixed))) return rc;
        if ((rc = get_num(c, v, path, "value", lo, hi, integer, true, &d->a, NULL))) return rc;
        d->kind = D_FIXED;
        return 0;
    }
    if (!strcmp(kind, "uniform")) {
        if ((rc = check_keys(c, v, path, k_uniform))) return rc;
        d->kind = D_UNIFORM;
    } else if (!strcmp(kind, "normal") || !strcmp(kind, "lognormal")) {
        if ((rc = check_keys(c, v, path, k_shaped))) return rc;
        d->kind = kind[0] == 'n' ? D_NORMAL : D_LOGNORMAL;
        double mlo = d->kind == D_NORMAL ? -1e300 : 0;
        if ((rc = get_num(c, v, path, "mean", mlo, 1e300, false, true, &mean, NULL)) ||
            (rc = get_num(c, v, path, "stddev", 0, 1e300, false, true, &sd, NULL)))
            return rc;
        if (d->kind == D_LOGNORMAL && mean <= 0) {
            char where[192];
            snprintf(where, sizeof where, "%s.mean", path);
            return bad(c, where, "%s", "expected a number > 0 (lognormal)");
        }
    } else if (!strcmp(kind, "exponential")) {
        if ((rc = check_keys(c, v, path, k_exp))) return rc;
        d->kind = D_EXPONENTIAL;
        if ((rc = get_pos(c, v, path, "mean", true, &mean, NULL))) return rc;
    } else {
        char where[192];
        snprintf(where, sizeof where, "%s.dist", path);
        return bad(c, where, "unknown distribution '%s'", kind);
    }
    bool need_bounds = d->kind == D_UNIFORM;
    if ((rc = get_num(c, v, path, "min", lo, hi, integer, need_bounds, &d->lo, &has))) return rc;
    if ((rc = get_num(c, v, path, "max", lo, hi, integer, need_bounds, &d->hi, &has))) return rc;
    if (d->lo > d->hi) return bad(c, path, "%s", "min is greater than max");
    switch (d->kind) {
    case D_UNIFORM:
        d->a = d->lo;
        d->b = d->hi;
        break;
    case D_NORMAL:
        d->a = mean;
        d->b = sd;
        break;
    case D_LOGNORMAL: {
        /* mean and stddev are the distribution's own; derive the log's */
        double s2 = log(1.0 + (sd * sd) / (mean * mean));
        d->a = log(mean) - s2 / 2;
        d->b = sqrt(s2);
        break;
    }
    default:
        d->a = mean;
        break;
    }
    return 0;
}

/* ---- streams --------------------------------------------------------------------------- */
typedef enum { P_POISSON, P_BURST, P_FIXED } process_t;

typedef struct {
    char path[48];
    uint32_t tenant, cls;
    bool has_requests, has_duration;
    uint64_t requests;
    double duration, start;
    process_t process;
    double rate, interval;
    uint64_t burst;
    dist_t prompt, output, user, turns, think;
    bool has_max_output, multi;
    uint64_t max_output;
    uint64_t groups, prefix;
    double fraction;
} stream_t;

static int stream_name(ctx_t *c, kvc_workload_t *w, kvc__names_t *t, const cJSON *s,
                       const char *path, const char *key, const char *list, uint32_t *index)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, key);
    const char *name = "default";
    char where[192];
    snprintf(where, sizeof where, "%s.%s", path, key);
    if (it) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return bad(c, where, "%s", "expected a non-empty string");
        name = it->valuestring;
    } else if (t->closed) {
        *index = 0;
        return 0;
    }
    int rc = kvc__names_intern(w, t, name, strlen(name), index);
    if (rc == KVC_ENOENT) {
        char msg[160];
        snprintf(msg, sizeof msg, "'%.64s' is not listed in '%s'", name, list);
        return bad(c, where, "%s", msg);
    }
    if (rc == KVC_ENOMEM) {
        kvc__errf(c->err, c->err_cap, "%s: %s", c->what, kvc_strerror(rc));
        return rc;
    }
    return rc ? bad(c, where, "%s", kvc_strerror(rc)) : 0;
}

static int parse_stream(ctx_t *c, kvc_workload_t *w, const cJSON *s, size_t index, stream_t *st)
{
    static const char *const keys[] = {
        "name",   "tenant", "class",      "requests",      "duration_s",   "start_s", "arrival",
        "prompt", "output", "max_output", "shared_prefix", "conversation", NULL};
    static const char *const k_arrival[] = {"process", "rate", "size", "interval_s", NULL};
    static const char *const k_prefix[] = {"groups", "tokens", "fraction", NULL};
    static const char *const k_conv[] = {"turns", "think_s", "user_tokens", NULL};
    memset(st, 0, sizeof *st);
    snprintf(st->path, sizeof st->path, "streams[%zu]", index);
    const char *path = st->path;
    if (!cJSON_IsObject(s)) return bad(c, path, "%s", "expected an object");
    int rc;
    if ((rc = check_keys(c, s, path, keys))) return rc;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(s, "name");
    if (nm && !cJSON_IsString(nm)) return bad(c, path, "%s", "name: expected a string");
    if ((rc = stream_name(c, w, &w->tenants, s, path, "tenant", "tenants", &st->tenant)) ||
        (rc = stream_name(c, w, &w->classes, s, path, "class", "classes", &st->cls)))
        return rc;
    double v;
    uint32_t max_tokens = w->params.max_tokens;
    if ((rc = get_num(c, s, path, "requests", 1, (double)KVC_SIM_MAX_REQUESTS, true, false, &v,
                      &st->has_requests)))
        return rc;
    if (st->has_requests) st->requests = (uint64_t)v;
    if ((rc = get_pos(c, s, path, "duration_s", false, &st->duration, &st->has_duration)))
        return rc;
    if (!st->has_requests && !st->has_duration)
        return bad(c, path, "%s", "give 'requests' or 'duration_s' (or both)");
    if ((rc = get_num(c, s, path, "start_s", 0, 1e300, false, false, &st->start, NULL))) return rc;

    char sub[96];
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(s, "arrival");
    snprintf(sub, sizeof sub, "%s.arrival", path);
    if (!arr) return bad(c, sub, "%s", "missing");
    if (!cJSON_IsObject(arr)) return bad(c, sub, "%s", "expected an object");
    if ((rc = check_keys(c, arr, sub, k_arrival))) return rc;
    const cJSON *proc = cJSON_GetObjectItemCaseSensitive(arr, "process");
    const char *pname = cJSON_IsString(proc) ? proc->valuestring : "";
    if (!strcmp(pname, "poisson"))
        st->process = P_POISSON;
    else if (!strcmp(pname, "burst"))
        st->process = P_BURST;
    else if (!strcmp(pname, "fixed") || !strcmp(pname, "uniform"))
        st->process = P_FIXED;
    else {
        snprintf(sub, sizeof sub, "%s.arrival.process", path);
        return bad(c, sub, "%s", "expected \"poisson\", \"burst\", \"fixed\" or \"uniform\"");
    }
    if (st->process == P_BURST) {
        if ((rc = get_num(c, arr, sub, "size", 1, 1e9, true, true, &v, NULL))) return rc;
        st->burst = (uint64_t)v;
        if ((rc = get_pos(c, arr, sub, "interval_s", true, &st->interval, NULL))) return rc;
    } else {
        if ((rc = get_pos(c, arr, sub, "rate", true, &st->rate, NULL))) return rc;
    }

    const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "prompt");
    snprintf(sub, sizeof sub, "%s.prompt", path);
    if (!it) return bad(c, sub, "%s", "missing");
    if ((rc = get_dist(c, it, sub, true, 1, max_tokens, &st->prompt))) return rc;
    it = cJSON_GetObjectItemCaseSensitive(s, "output");
    snprintf(sub, sizeof sub, "%s.output", path);
    if (!it) return bad(c, sub, "%s", "missing");
    if ((rc = get_dist(c, it, sub, true, 1, max_tokens, &st->output))) return rc;
    if ((rc = get_num(c, s, path, "max_output", 1, max_tokens, true, false, &v,
                      &st->has_max_output)))
        return rc;
    if (st->has_max_output) st->max_output = (uint64_t)v;

    it = cJSON_GetObjectItemCaseSensitive(s, "shared_prefix");
    snprintf(sub, sizeof sub, "%s.shared_prefix", path);
    if (it) {
        if (!cJSON_IsObject(it)) return bad(c, sub, "%s", "expected an object");
        if ((rc = check_keys(c, it, sub, k_prefix))) return rc;
        if ((rc = get_num(c, it, sub, "groups", 1, 1e9, true, true, &v, NULL))) return rc;
        st->groups = (uint64_t)v;
        if ((rc = get_num(c, it, sub, "tokens", 1, max_tokens, true, true, &v, NULL))) return rc;
        st->prefix = (uint64_t)v;
        bool has;
        st->fraction = 1;
        if ((rc = get_num(c, it, sub, "fraction", 0, 1, false, false, &st->fraction, &has)))
            return rc;
        if (dist_min(&st->prompt) <= (double)st->prefix) {
            char msg[128];
            snprintf(msg, sizeof msg,
                     "the shortest prompt (%.0f) must exceed shared_prefix.tokens "
                     "(%llu)",
                     dist_min(&st->prompt), (unsigned long long)st->prefix);
            snprintf(sub, sizeof sub, "%s.prompt", path);
            return bad(c, sub, "%s", msg);
        }
    }

    it = cJSON_GetObjectItemCaseSensitive(s, "conversation");
    snprintf(sub, sizeof sub, "%s.conversation", path);
    if (it) {
        if (!cJSON_IsObject(it)) return bad(c, sub, "%s", "expected an object");
        if ((rc = check_keys(c, it, sub, k_conv))) return rc;
        st->multi = true;
        char sub2[128];
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(it, "turns");
        snprintf(sub2, sizeof sub2, "%s.turns", sub);
        if (!t) return bad(c, sub2, "%s", "missing");
        if ((rc = get_dist(c, t, sub2, true, 1, 1e6, &st->turns))) return rc;
        t = cJSON_GetObjectItemCaseSensitive(it, "think_s");
        snprintf(sub2, sizeof sub2, "%s.think_s", sub);
        st->think = (dist_t){.kind = D_FIXED, .a = 0, .lo = 0, .hi = 1e12};
        if (t && (rc = get_dist(c, t, sub2, false, 0, 1e12, &st->think))) return rc;
        t = cJSON_GetObjectItemCaseSensitive(it, "user_tokens");
        snprintf(sub2, sizeof sub2, "%s.user_tokens", sub);
        st->user = st->prompt;
        if (t && (rc = get_dist(c, t, sub2, true, 1, max_tokens, &st->user))) return rc;
    }
    return 0;
}

/* ---- generation ---------------------------------------------------------------------- */
enum {
    R_ARRIVAL,
    R_PROMPT,
    R_OUTPUT,
    R_USER,
    R_TURNS,
    R_THINK,
    R_GROUP,
    R_TAIL,
    R_PREFIX,
    R_CONV,
    R_TAPE = 1000
};

static uint64_t stream_seed(uint64_t seed, size_t stream, unsigned purpose)
{
    return kvc__mix64(kvc__mix64(seed, stream), purpose);
}

typedef struct {
    uint64_t local;      /* index of the request within its stream */
    uint64_t conv;       /* conversation slot + 1 (0: none) */
    uint64_t conv_local; /* index of the conversation within its stream */
    uint32_t group;      /* shared-prefix group, KVC_NONE for none */
    uint32_t stream;
} recipe_t;

typedef struct {
    recipe_t *rec;
    size_t cap;
} recipes_t;

static int push(ctx_t *c, kvc_workload_t *w, recipes_t *rs, const kvc_sim_request_t *r,
                const recipe_t *rec, const char *path)
{
    int rc = kvc__wl_reserve(w, w->n + 1);
    if (rc == KVC_ERANGE) return bad(c, path, "%s", "more requests than a workload can hold");
    if (!rc && rs->cap < w->cap) {
        recipe_t *nr = kvc__wl_alloc(w, w->cap * sizeof *nr);
        if (!nr) {
            rc = KVC_ENOMEM;
        } else {
            if (w->n) memcpy(nr, rs->rec, w->n * sizeof *nr);
            kvc__wl_free(w, rs->rec);
            rs->rec = nr;
            rs->cap = w->cap;
        }
    }
    if (rc) {
        kvc__errf(c->err, c->err_cap, "%s: %s", c->what, kvc_strerror(rc));
        return rc;
    }
    rs->rec[w->n] = *rec;
    w->req[w->n++] = *r;
    return 0;
}

static int generate_stream(ctx_t *c, kvc_workload_t *w, recipes_t *rs, const stream_t *st,
                           size_t si, uint64_t *n_conv)
{
    const kvc_workload_params_t *p = &w->params;
    kvc_rng_t ra, rp, ro, ru, rt, rk, rg;
    kvc_rng_seed(&ra, stream_seed(p->seed, si, R_ARRIVAL));
    kvc_rng_seed(&rp, stream_seed(p->seed, si, R_PROMPT));
    kvc_rng_seed(&ro, stream_seed(p->seed, si, R_OUTPUT));
    kvc_rng_seed(&ru, stream_seed(p->seed, si, R_USER));
    kvc_rng_seed(&rt, stream_seed(p->seed, si, R_TURNS));
    kvc_rng_seed(&rk, stream_seed(p->seed, si, R_THINK));
    kvc_rng_seed(&rg, stream_seed(p->seed, si, R_GROUP));
    uint64_t cap = st->has_requests ? st->requests : UINT64_MAX;
    /* The first N requests by arrival come from the first N conversations
     * (a conversation's turns never arrive before its start), so max_requests
     * bounds the generation without changing what is kept. */
    uint64_t conv_cap = p->max_requests ? p->max_requests : UINT64_MAX;
    double t = st->start, end = st->start + st->duration;
    uint64_t made = 0, c0 = 0;
    for (; made < cap && c0 < conv_cap; c0++) {
        double t0;
        if (st->process == P_POISSON)
            t0 = t += -log(1.0 - u01(&ra)) / st->rate;
        else if (st->process == P_FIXED)
            t0 = st->start + (double)c0 / st->rate;
        else
            t0 = st->start + (double)(c0 / st->burst) * st->interval;
        if (st->has_duration && t0 >= end) break;
        uint64_t turns = st->multi ? (uint64_t)dist_sample(&st->turns, &rt) : 1;
        uint32_t group = KVC_NONE;
        if (st->groups) {
            double u = u01(&rg);
            uint64_t g = kvc_rng_below(&rg, st->groups);
            if (u < st->fraction) group = (uint32_t)g;
        }
        uint64_t hist = 0;
        double ta = t0;
        for (uint64_t k = 0; k < turns && made < cap; k++) {
            uint64_t n_prompt;
            double think = 0;
            if (k == 0) {
                n_prompt = (uint64_t)dist_sample(&st->prompt, &rp);
            } else {
                think = dist_sample(&st->think, &rk);
                ta += think;
                n_prompt = hist + (uint64_t)dist_sample(&st->user, &ru);
                if (n_prompt > p->max_tokens) break; /* the history is full: the chat ends */
            }
            uint64_t n_out = (uint64_t)dist_sample(&st->output, &ro);
            if (st->has_max_output) n_out = KVC_MIN(n_out, st->max_output);
            kvc_sim_request_t r = {
                .arrival_s = ta * p->time_scale,
                .n_prompt = (uint32_t)n_prompt,
                .n_output = (uint32_t)n_out,
                .tenant = st->tenant,
                .priority = st->cls,
                .turn = (uint32_t)k,
                .max_output = (uint32_t)(st->has_max_output ? st->max_output : n_out),
                .think_s = think * p->time_scale,
            };
            recipe_t rec = {
                .local = made,
                .conv = st->multi ? *n_conv + c0 + 1 : 0,
                .conv_local = c0,
                .group = group,
                .stream = (uint32_t)si,
            };
            int rc = push(c, w, rs, &r, &rec, st->path);
            if (rc) return rc;
            hist = n_prompt + n_out;
            made++;
        }
    }
    if (st->multi) *n_conv += c0;
    return 0;
}

/* Give every kept request its tokens (see the banner). */
static int materialise(kvc_workload_t *w, const recipes_t *rs, const stream_t *streams,
                       uint64_t n_conv)
{
    const kvc_workload_params_t *p = &w->params;
    size_t n = w->n;
    int rc = KVC_ENOMEM;
    uint64_t *tape_off = kvc__wl_alloc(w, n * sizeof *tape_off);
    uint64_t *conv_len = kvc__wl_alloc(w, (n_conv + 1) * sizeof *conv_len);
    uint64_t *conv_id = kvc__wl_alloc(w, (n_conv + 1) * sizeof *conv_id);
    size_t *conv_first = kvc__wl_alloc(w, (n_conv + 1) * sizeof *conv_first);
    kvc_token_t **conv_buf = kvc__wl_alloc(w, (n_conv + 1) * sizeof *conv_buf);
    if (!tape_off || !conv_len || !conv_id || !conv_first || !conv_buf) goto out;
    memset(conv_len, 0, (n_conv + 1) * sizeof *conv_len);
    memset(conv_id, 0, (n_conv + 1) * sizeof *conv_id);

    /* Pass 1: tape offsets in arrival order, conversation ids by first
     * appearance, conversation buffer lengths, group requests' copies. */
    uint64_t next_off = 0, tape_len = 0, next_conv = 0;
    for (size_t i = 0; i < n; i++) {
        kvc_sim_request_t *r = &w->req[i];
        const recipe_t *rec = &rs->rec[i];
        uint64_t whole = (uint64_t)r->n_prompt + r->n_output;
        if (rec->conv) {
            if (!conv_id[rec->conv]) {
                conv_id[rec->conv] = ++next_conv;
                conv_first[rec->conv] = i;
            }
            r->conversation = conv_id[rec->conv];
            conv_len[rec->conv] = KVC_MAX(conv_len[rec->conv], whole);
            continue;
        }
        tape_off[i] = next_off++;
        if (rec->group == KVC_NONE) {
            tape_len = KVC_MAX(tape_len, tape_off[i] + whole);
            continue;
        }
        tape_len = KVC_MAX(tape_len, tape_off[i] + r->n_output);
        const stream_t *st = &streams[rec->stream];
        kvc_token_t *t = kvc__wl_tokens(w, r->n_prompt);
        if (!t) goto out;
        kvc__fill_tokens(t, st->prefix,
                         kvc__mix64(stream_seed(p->seed, rec->stream, R_PREFIX), rec->group),
                         p->vocab);
        kvc__fill_tokens(t + st->prefix, r->n_prompt - st->prefix,
                         kvc__mix64(stream_seed(p->seed, rec->stream, R_TAIL), rec->local),
                         p->vocab);
        r->tokens = t;
    }

    /* Pass 2: one buffer per conversation (its first turn names the group). */
    for (uint64_t k = 1; k <= n_conv; k++) {
        conv_buf[k] = NULL;
        if (!conv_id[k]) continue;
        const recipe_t *rec = &rs->rec[conv_first[k]];
        const stream_t *st = &streams[rec->stream];
        kvc_token_t *t = kvc__wl_tokens(w, conv_len[k]);
        if (!t) goto out;
        uint64_t pre = rec->group == KVC_NONE ? 0 : st->prefix;
        if (pre)
            kvc__fill_tokens(t, pre,
                             kvc__mix64(stream_seed(p->seed, rec->stream, R_PREFIX), rec->group),
                             p->vocab);
        kvc__fill_tokens(t + pre, conv_len[k] - pre,
                         kvc__mix64(stream_seed(p->seed, rec->stream, R_CONV), rec->conv_local),
                         p->vocab);
        conv_buf[k] = t;
    }

    kvc_token_t *tape = NULL;
    if (tape_len) {
        tape = kvc__wl_tokens(w, tape_len);
        if (!tape) goto out;
        kvc__fill_tokens(tape, tape_len, stream_seed(p->seed, 0, R_TAPE), p->vocab);
    }
    for (size_t i = 0; i < n; i++) {
        kvc_sim_request_t *r = &w->req[i];
        const recipe_t *rec = &rs->rec[i];
        if (rec->conv) {
            r->tokens = conv_buf[rec->conv];
            r->output_tokens = r->tokens + r->n_prompt;
        } else if (rec->group == KVC_NONE) {
            r->tokens = tape + tape_off[i];
            r->output_tokens = r->tokens + r->n_prompt;
        } else {
            r->output_tokens = tape + tape_off[i];
        }
    }
    rc = 0;
out:
    kvc__wl_free(w, tape_off);
    kvc__wl_free(w, conv_len);
    kvc__wl_free(w, conv_id);
    kvc__wl_free(w, conv_first);
    kvc__wl_free(w, conv_buf);
    return rc;
}

/* Every kept request arrives (and thinks) within the simulator's horizon. */
static int check_horizon(ctx_t *c, const kvc_workload_t *w, const recipes_t *rs)
{
    for (size_t i = 0; i < w->n; i++) {
        const kvc_sim_request_t *r = &w->req[i];
        if (r->arrival_s <= KVC_SIM_MAX_TIME_S && r->think_s <= KVC_SIM_MAX_TIME_S) continue;
        char where[32];
        snprintf(where, sizeof where, "streams[%u]", rs->rec[i].stream);
        bool late = !(r->arrival_s <= KVC_SIM_MAX_TIME_S);
        return bad(c, where,
                   "request %zu %s %.6g s (time scale %.6g), past the simulator's horizon of %s", i,
                   late ? "arrives at" : "thinks for", late ? r->arrival_s : r->think_s,
                   w->params.time_scale, KVC__SIM_HORIZON_TEXT);
    }
    return 0;
}

static int declare(ctx_t *c, kvc_workload_t *w, kvc__names_t *t, const cJSON *spec, const char *key)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(spec, key);
    if (!arr) return 0;
    if (!cJSON_IsArray(arr) || !arr->child)
        return bad(c, key, "%s", "expected a non-empty array of names");
    for (const cJSON *it = arr->child; it; it = it->next) {
        if (!cJSON_IsString(it) || !it->valuestring[0])
            return bad(c, key, "%s", "expected a non-empty array of names");
        uint32_t idx;
        int rc = kvc__names_intern(w, t, it->valuestring, strlen(it->valuestring), &idx);
        if (rc == KVC_ENOMEM) {
            kvc__errf(c->err, c->err_cap, "%s: %s", c->what, kvc_strerror(rc));
            return rc;
        }
        if (rc) return bad(c, key, "%s", kvc_strerror(rc));
    }
    t->closed = true;
    return 0;
}

int kvc__load_spec(kvc_workload_t *w, const cJSON *spec, const char *what, char *err,
                   size_t err_cap)
{
    static const char *const keys[] = {"streams", "tenants", "classes", NULL};
    ctx_t c = {.what = what, .err = err, .err_cap = err_cap};
    int rc;
    if ((rc = check_keys(&c, spec, "spec", keys))) return rc;
    if ((rc = declare(&c, w, &w->tenants, spec, "tenants")) ||
        (rc = declare(&c, w, &w->classes, spec, "classes")))
        return rc;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(spec, "streams");
    if (!cJSON_IsArray(arr) || !arr->child)
        return bad(&c, "streams", "%s", "expected a non-empty array of stream objects");
    size_t n_streams = (size_t)cJSON_GetArraySize(arr);
    stream_t *streams = kvc__wl_alloc(w, n_streams * sizeof *streams);
    recipes_t rs = {0};
    uint32_t *perm = NULL;
    if (!streams) {
        rc = KVC_ENOMEM;
        kvc__errf(err, err_cap, "%s: %s", what, kvc_strerror(rc));
        goto out;
    }
    size_t si = 0;
    for (const cJSON *s = arr->child; s; s = s->next, si++)
        if ((rc = parse_stream(&c, w, s, si, &streams[si]))) goto out;
    /* Size the arrays once when every stream's count is known: growing a
     * million-request array by doubling costs more than generating it. */
    uint64_t bound = 0;
    for (si = 0; si < n_streams && bound != UINT64_MAX; si++) {
        uint64_t b = streams[si].has_requests ? streams[si].requests : UINT64_MAX;
        if (w->params.max_requests) b = KVC_MIN(b, (uint64_t)w->params.max_requests);
        bound = b == UINT64_MAX ? UINT64_MAX : bound + b;
    }
    if (bound <= (1u << 28)) {
        rc = kvc__wl_reserve(w, (size_t)bound);
        if (!rc) {
            rs.rec = kvc__wl_alloc(w, w->cap * sizeof *rs.rec);
            rs.cap = rs.rec ? w->cap : 0;
            if (!rs.rec) rc = KVC_ENOMEM;
        }
        if (rc) {
            kvc__errf(err, err_cap, "%s: %s", what, kvc_strerror(rc));
            goto out;
        }
    }
    uint64_t n_conv = 0;
    for (si = 0; si < n_streams; si++)
        if ((rc = generate_stream(&c, w, &rs, &streams[si], si, &n_conv))) goto out;
    if (w->n == 0) goto out; /* the caller reports "no requests" */

    /* Merge the streams by arrival (stable: ties keep stream order), keep the first N. */
    rc = kvc__arrival_perm(w, w->req, w->n, &perm, NULL);
    if (!rc && perm) {
        kvc_sim_request_t *req = kvc__wl_alloc(w, w->cap * sizeof *req);
        recipe_t *rec = kvc__wl_alloc(w, rs.cap * sizeof *rec);
        if (!req || !rec) {
            kvc__wl_free(w, req);
            kvc__wl_free(w, rec);
            rc = KVC_ENOMEM;
        } else {
            for (size_t i = 0; i < w->n; i++) {
                req[i] = w->req[perm[i]];
                rec[i] = rs.rec[perm[i]];
            }
            kvc__wl_free(w, w->req);
            kvc__wl_free(w, rs.rec);
            w->req = req;
            rs.rec = rec;
        }
    }
    if (!rc && w->params.max_requests && w->n > w->params.max_requests)
        w->n = w->params.max_requests;
    if (!rc && (rc = check_horizon(&c, w, &rs))) goto out;
    if (!rc) rc = materialise(w, &rs, streams, n_conv);
    if (rc) kvc__errf(err, err_cap, "%s: %s", what, kvc_strerror(rc));
out:
    kvc__wl_free(w, perm);
    kvc__wl_free(w, rs.rec);
    kvc__wl_free(w, streams);
    return rc;
}

/* ---- inline specs ------------------------------------------------------------------ */
static const char *const processes[] = {"poisson", "burst", "fixed", "uniform", NULL};

bool kvc__is_inline_spec(const char *s)
{
    const char *colon = strchr(s, ':');
    if (!colon) return false;
    for (const char *const *p = processes; *p; p++)
        if ((size_t)(colon - s) == strlen(*p) && !strncmp(s, *p, strlen(*p))) return true;
    return false;
}

/* A number, or "A..B" for a uniform range. */
static bool parse_number(const char *s, size_t len, double *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf) return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    *out = strtod(buf, &end);
    return end == buf + len && isfinite(*out);
}

static cJSON *inline_value(const char *v, bool range_ok)
{
    const char *dots = strstr(v, "..");
    double a, b;
    if (!dots) return parse_number(v, strlen(v), &a) ? cJSON_CreateNumber(a) : NULL;
    if (!range_ok || !parse_number(v, (size_t)(dots - v), &a) ||
        !parse_number(dots + 2, strlen(dots + 2), &b))
        return NULL;
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (!cJSON_AddStringToObject(o, "dist", "uniform") || !cJSON_AddNumberToObject(o, "min", a) ||
        !cJSON_AddNumberToObject(o, "max", b)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

typedef struct {
    const char *key;
    const char *obj; /* NULL: the stream; else a sub-object */
    const char *field;
    char type; /* 'n' number, 'd' number or range, 's' string */
} inline_key_t;

static const inline_key_t inline_keys[] = {
    {"rate", "arrival", "rate", 'n'},
    {"size", "arrival", "size", 'n'},
    {"interval", "arrival", "interval_s", 'n'},
    {"n", NULL, "requests", 'n'},
    {"requests", NULL, "requests", 'n'},
    {"duration", NULL, "duration_s", 'n'},
    {"start", NULL, "start_s", 'n'},
    {"prompt", NULL, "prompt", 'd'},
    {"output", NULL, "output", 'd'},
    {"max_output", NULL, "max_output", 'n'},
    {"tenant", NULL, "tenant", 's'},
    {"class", NULL, "class", 's'},
    {"groups", "shared_prefix", "groups", 'n'},
    {"prefix", "shared_prefix", "tokens", 'n'},
    {"fraction", "shared_prefix", "fraction", 'n'},
    {"turns", "conversation", "turns", 'd'},
    {"think", "conversation", "think_s", 'd'},
    {"user", "conversation", "user_tokens", 'd'},
};

static cJSON *sub_object(cJSON *parent, const char *name)
{
    cJSON *o = cJSON_GetObjectItemCaseSensitive(parent, name);
    if (o) return o;
    o = cJSON_CreateObject();
    if (o && !cJSON_AddItemToObject(parent, name, o)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

cJSON *kvc__inline_spec(const char *s, const kvc_allocator_t *a, int *rc, char *err, size_t err_cap)
{
    *rc = KVC_ENOMEM;
    const char *colon = strchr(s, ':');
    size_t len = strlen(s);
    char *buf = kvc_alloc(a, len + 1, 0);
    cJSON *spec = cJSON_CreateObject(), *streams = NULL, *st = NULL, *arrival = NULL;
    if (!buf || !spec) goto fail;
    memcpy(buf, s, len + 1);
    streams = cJSON_AddArrayToObject(spec, "streams");
    st = cJSON_CreateObject();
    if (!streams || !st) goto fail;
    if (!cJSON_AddItemToArray(streams, st)) {
        cJSON_Delete(st);
        goto fail;
    }
    arrival = sub_object(st, "arrival");
    buf[colon - s] = '\0';
    if (!arrival || !cJSON_AddStringToObject(arrival, "process", buf)) goto fail;
    for (char *tok = buf + (colon - s) + 1, *next; tok && *tok; tok = next) {
        next = strchr(tok, ',');
        if (next) *next++ = '\0';
        while (isspace((unsigned char)*tok)) tok++;
        if (!*tok) continue;
        char *eq = strchr(tok, '=');
        if (!eq) {
            kvc__errf(err, err_cap, "spec '%s': '%s' is not key=value", s, tok);
            *rc = KVC_EPARSE;
            goto fail;
        }
        *eq = '\0';
        const char *val = eq + 1;
        const inline_key_t *k = NULL;
        for (size_t i = 0; i < KVC_ARRAY_LEN(inline_keys); i++)
            if (!strcmp(inline_keys[i].key, tok)) k = &inline_keys[i];
        if (!k) {
            kvc__errf(err, err_cap, "spec '%s': unknown key '%s'", s, tok);
            *rc = KVC_EPARSE;
            goto fail;
        }
        cJSON *parent = k->obj ? sub_object(st, k->obj) : st;
        if (!parent) goto fail;
        if (cJSON_HasObjectItem(parent, k->field)) {
            kvc__errf(err, err_cap, "spec '%s': key '%s' given twice", s, tok);
            *rc = KVC_EPARSE;
            goto fail;
        }
        cJSON *item = k->type == 's' ? cJSON_CreateString(val) : inline_value(val, k->type == 'd');
        if (!item) {
            kvc__errf(err, err_cap, "spec '%s': key '%s': '%s' is not %s", s, tok, val,
                      k->type == 'd' ? "a number or a range A..B" : "a number");
            *rc = KVC_EPARSE;
            goto fail;
        }
        if (!cJSON_AddItemToObject(parent, k->field, item)) {
            cJSON_Delete(item);
            goto fail;
        }
    }
    kvc_free(a, buf);
    *rc = 0;
    return spec;
fail:
    if (*rc == KVC_ENOMEM) kvc__errf(err, err_cap, "spec '%s': %s", s, kvc_strerror(*rc));
    kvc_free(a, buf);
    cJSON_Delete(spec);
    return NULL;
}
