/* cmd_sim.c - `kvcache sim`: the scheduler and block manager in virtual time.
 *
 * Takes the planner's deployment options (model, GPU, parallelism, engine
 * limits), a workload (a trace or a synthetic spec), the scheduling
 * policies and the SLOs; runs the real pool, prefix cache, sequences and
 * scheduler against the cost model (src/sim/engine.c) and prints the report
 * (text or --json), optionally a CSV time series and SVG charts.
 *
 * `--scenario FILE` answers one question with one command: the file names
 * the question, the common arguments, the variants to compare and the
 * metrics to tabulate; each variant is parsed and run exactly as its
 * command line would be.
 */
#include "cli.h"
#include "kvcache/kvcache.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CMD      "sim"
#define MAX_CAPS 8

enum {
    O_WORKLOAD = KVC_CLI_PLAN_FIRST,
    O_NUM_BLOCKS,
    O_ADMISSION,
    O_EXPECTED_OUTPUT,
    O_EXPECTED_MARGIN,
    O_PREEMPTION,
    O_SWAP_SPACE,
    O_CLASS_CAP,
    O_TENANT_SHARE,
    O_TENANT_MAX_RUNNING,
    O_TENANT_FAIR,
    O_TENANT_SALTS,
    O_LONG_THRESHOLD,
    O_LONG_CAP,
    O_PREFILL_CHUNK,
    O_NO_PREFIX,
    O_NO_KV_CACHE,
    O_ALLOCATION,
    O_STEP_OVERHEAD,
    O_CLOSED_LOOP,
    O_SLO_TTFT,
    O_SLO_TPOT,
    O_SLO_E2E,
    O_SEED,
    O_MAX_REQUESTS,
    O_TIME_SCALE,
    O_JSON,
    O_CSV,
    O_SVG,
    O_TRACE,
    O_QUIET,
    O_SCENARIO,
    O_MAX_MEMORY,
    O_EVICTION,
    O_VICTIM,
    O_PROFILE,
    O_HOLD_SHARED,
    O_TIER,
    O_TIER_ADMISSION,
    O_TIER_BUDGET,
    O_BREAK_EVEN,
};

static const struct option own_options[] = {
    {"workload", required_argument, NULL, O_WORKLOAD},
    {"num-blocks", required_argument, NULL, O_NUM_BLOCKS},
    {"admission", required_argument, NULL, O_ADMISSION},
    {"expected-output", required_argument, NULL, O_EXPECTED_OUTPUT},
    {"expected-margin", required_argument, NULL, O_EXPECTED_MARGIN},
    {"preemption", required_argument, NULL, O_PREEMPTION},
    {"swap-space", required_argument, NULL, O_SWAP_SPACE},
    {"class-kv-cap", required_argument, NULL, O_CLASS_CAP},
    {"tenant-kv-share", required_argument, NULL, O_TENANT_SHARE},
    {"tenant-max-running", required_argument, NULL, O_TENANT_MAX_RUNNING},
    {"tenant-fair", no_argument, NULL, O_TENANT_FAIR},
    {"tenant-salts", no_argument, NULL, O_TENANT_SALTS},
    {"long-threshold", required_argument, NULL, O_LONG_THRESHOLD},
    {"long-kv-cap", required_argument, NULL, O_LONG_CAP},
    {"max-prefill-chunk", required_argument, NULL, O_PREFILL_CHUNK},
    {"no-prefix-caching", no_argument, NULL, O_NO_PREFIX},
    {"no-kv-cache", no_argument, NULL, O_NO_KV_CACHE},
    {"allocation", required_argument, NULL, O_ALLOCATION},
    {"step-overhead-ms", required_argument, NULL, O_STEP_OVERHEAD},
    {"profile", required_argument, NULL, O_PROFILE},
    {"hold-shared-prefix", no_argument, NULL, O_HOLD_SHARED},
    {"tier", required_argument, NULL, O_TIER},
    {"tier-admission", required_argument, NULL, O_TIER_ADMISSION},
    {"tier-disk-write-budget", required_argument, NULL, O_TIER_BUDGET},
    {"break-even", no_argument, NULL, O_BREAK_EVEN},
    {"closed-loop", no_argument, NULL, O_CLOSED_LOOP},
    {"slo-ttft-ms", required_argument, NULL, O_SLO_TTFT},
    {"slo-tpot-ms", required_argument, NULL, O_SLO_TPOT},
    {"slo-e2e-ms", required_argument, NULL, O_SLO_E2E},
    {"seed", required_argument, NULL, O_SEED},
    {"max-requests", required_argument, NULL, O_MAX_REQUESTS},
    {"time-scale", required_argument, NULL, O_TIME_SCALE},
    {"json", no_argument, NULL, O_JSON},
    {"csv", required_argument, NULL, O_CSV},
    {"svg", required_argument, NULL, O_SVG},
    {"trace", required_argument, NULL, O_TRACE},
    {"quiet", no_argument, NULL, O_QUIET},
    {"scenario", required_argument, NULL, O_SCENARIO},
    {"max-memory", required_argument, NULL, O_MAX_MEMORY},
    {"eviction", required_argument, NULL, O_EVICTION},
    {"victim", required_argument, NULL, O_VICTIM},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

typedef struct {
    kvc_cli_deploy_t dep;
    kvc_sim_config_t cfg;
    kvc_workload_params_t wp;
    const char *workload, *csv, *svg, *trace, *scenario, *profile;
    bool json, quiet, num_blocks_set, overhead_set;
    int n_given;          /* options other than --scenario, --json and --quiet */
    char first_given[64]; /* the first of them, for the message */
    struct {
        const char *cls; /* a class name or index, resolved once the workload is loaded */
        double share;
    } caps[MAX_CAPS];
    int n_caps;
    kvc_tier_spec_t tiers[KVC_SIM_MAX_TIERS]; /* --tier, in order (cfg.tiers points here at
                                                 run time: opts are copied by scenarios) */
    uint32_t n_tiers;
    bool break_even; /* --break-even: print the tiers' break-even table, run nothing */
} opts_t;

static void help(FILE *f)
{
    fprintf(
        f,
        "usage: kvcache sim --model NAME|config.json --gpu NAME --workload FILE|SPEC [options]\n"
        "       kvcache sim --scenario FILE [--json]\n"
        "\n"
        "Runs the real scheduler, pool, prefix cache and sequences in virtual time against a\n"
        "cost model of the GPU: step time = max(compute, memory) + TP communication + a fixed\n"
        "overhead (+ swap traffic), from the planner's descriptors.  Reports TTFT, time per\n"
        "output token and end-to-end latency percentiles, throughput, goodput under SLOs,\n"
        "preemptions, recomputed tokens, swapped bytes, prefix hit rate and KV usage.\n"
        "Same inputs and seed, same report, byte for byte.\n"
        "\n"
        "deployment: the options of `kvcache plan` (--model, --gpu, --tp, --pp, --dp,\n"
        "  --weight-dtype, --kv-dtype, --block-size, --gpu-memory-utilization,\n"
        "  --max-model-len, --max-num-seqs, --max-num-batched-tokens, --mfu, --mbu, ...)\n"
        "  --num-blocks N            KV blocks per replica (default: what the planner derives)\n");
    fprintf(f,
            "tiers (docs/sim.md, \"Tiers\"):\n"
            "  --tier SPEC               a KV tier, repeatable, in lookup order: host:SIZE,\n"
            "                            disk:PATH:SIZE (PATH only names it here) or\n"
            "                            redis://HOST:PORT[/PREFIX] (shared by the replicas),\n"
            "                            then ,mode=evict|write-through ,bw=RATE ,rtt=TIME\n"
            "                            (e.g. host:256GiB,bw=25GB/s,rtt=10us; defaults: host\n"
            "                            the GPU's PCIe and 10 us, disk 7 GB/s and 100 us,\n"
            "                            redis 1.25 GB/s (10 GbE) and 200 us)\n"
            "  --tier-admission P        disk tiers write: always (default), second-hit, depth:N\n"
            "  --tier-disk-write-budget SIZE/day  bytes a disk tier may write a day\n"
            "  --break-even              print only the tiers' break-even table: the round trip\n"
            "                            below which fetching a 1K..64K-token prefix beats\n"
            "                            recomputing it (no --workload needed)\n");
    fprintf(
        f, "workload:\n"
           "  --workload FILE|SPEC      a Mooncake or kvcache JSONL trace, a synthetic spec file,\n"
           "                            or an inline spec like "
           "poisson:rate=5,n=1000,prompt=1024,output=300\n"
           "  --seed N                  synthetic generation, hashing and draft draws (default 1)\n"
           "  --max-requests N          only the first N requests\n"
           "  --time-scale F            multiply arrival times (0.5: twice as fast)\n"
           "  --closed-loop             a conversation's next turn arrives think time after the\n"
           "                            previous turn finished (default: at its trace time)\n"
           "scheduling:\n"
           "  --admission P             greedy (default), reserve-max, reserve-expected\n"
           "  --expected-output N       reserve-expected: the output estimate (default 256)\n"
           "  --expected-margin F       reserve-expected: added fraction (default 0.2)\n"
           "  --preemption P            recompute (default), swap, backpressure\n"
           "  --victim P                the request to preempt: latest (default: the lowest\n"
           "                            class, then the latest arrival) or largest (the most\n"
           "                            blocks held)\n"
           "  --swap-space SIZE         host memory for swapped KV (default: unlimited)\n"
           "  --class-kv-cap C=F        class C (name or index) may hold share F of the pool\n"
           "  --tenant-kv-share F       each tenant may hold share F of the pool (a KV quota)\n"
           "  --tenant-max-running N    each tenant may run N requests at once (a count limit)\n"
           "  --tenant-fair             admit the least-consuming tenant first; split the budget\n"
           "  --tenant-salts            isolate tenants' prefix caches (salt = tenant name)\n"
           "  --long-threshold N        prompt + max output >= N tokens is a long request\n"
           "  --long-kv-cap F           long requests may hold share F of the pool together\n"
           "  --max-prefill-chunk N     prompt tokens per request per step (default: the budget)\n"
           "  --spec-tokens N           draft tokens per decode step (default 0)\n"
           "  --spec-acceptance F       probability a draft is accepted (default 0.7)\n"
           "  --no-prefix-caching       turn the prefix cache off\n"
           "  --no-kv-cache             the quadratic baseline: every step recomputes each\n"
           "                            sequence's whole context (prefix cache off)\n"
           "  --allocation A            paged (default), or contiguous: each request reserves\n"
           "                            max_model_len of KV (the pre-paging baseline; the\n"
           "                            report measures the fragmentation)\n"
           "  --eviction P              the prefix cache's eviction order: lru (default), lfu,\n"
           "                            priority (by class), naive-lru (any least recently\n"
           "                            used block, cached children or not; the report says\n"
           "                            what that strands)\n"
           "  --step-overhead-ms F      fixed cost per step (default 2; 0 with --profile)\n"
           "  --profile FILE            this machine's measured step times (bench/bench_profile)\n"
           "                            instead of the GPU roofline: a step takes the time\n"
           "                            interpolated at its batch tokens and mean context, plus\n"
           "                            the profile's step_overhead_ms; a request reaches the\n"
           "                            scheduler its request_ms after arriving (the deployment\n"
           "                            options still size the pool)\n");
    fprintf(f,
            "  --hold-shared-prefix      admit as kvcache's engine does: a request sharing a\n"
            "                            whole block of prefix with one still computing it waits\n"
            "                            until that block is computed (computed once)\n"
            "SLOs (for goodput):\n"
            "  --slo-ttft-ms F, --slo-tpot-ms F, --slo-e2e-ms F\n"
            "output:\n"
            "  --json                    one JSON object instead of the text report\n"
            "  --csv PATH                the time series (KV usage, batch, queues) as CSV\n"
            "  --svg DIR                 kv_usage.svg, batch.svg, latency_cdf.svg\n"
            "  --trace PATH              every step's decisions, in words ('-': stderr)\n"
            "  --quiet                   no progress bar\n"
            "  --max-memory SIZE         refuse a run that would hold more (default: the\n"
            "                            machine's memory)\n"
            "  --scenario FILE           run a scenario file's variants and compare them\n"
            "  -h, --help                this help\n");
}

/* s with control bytes escaped (\n, \t, \r, else \xNN), into out (cap bytes): input echoed
 * in a message or a table stays one line of text. */
static const char *esc(const char *s, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t at = 0;
    for (; s && *s && at + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\n' || c == '\t' || c == '\r') {
            out[at++] = '\\';
            out[at++] = c == '\n' ? 'n' : c == '\t' ? 't' : 'r';
        } else if (c < 0x20 || c == 0x7f) {
            out[at++] = '\\';
            out[at++] = 'x';
            out[at++] = hex[c >> 4];
            out[at++] = hex[c & 15];
        } else {
            out[at++] = (char)c;
        }
    }
    out[at] = '\0';
    return out;
}

/* kvc_cli_error with whatever the message quotes escaped. */
static int sim_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sim_error(const char *fmt, ...)
{
    char raw[2048], line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    return kvc_cli_error(CMD, "%s", esc(raw, line, sizeof line));
}

/* "a, b or c" from a NULL-terminated list of names. */
static const char *name_list(const char *const *names, char *out, size_t cap)
{
    size_t n = 0, at = 0;
    while (names[n]) n++;
    out[0] = '\0';
    for (size_t i = 0; i < n && at < cap; i++) {
        const char *sep = i == 0 ? "" : i + 1 == n ? " or " : ", ";
        int k = snprintf(out + at, cap - at, "%s%s", sep, names[i]);
        if (k < 0) break;
        at += (size_t)k;
    }
    return out;
}

static int parse(int argc, char **argv, opts_t *o)
{
    struct option opts[KVC_CLI_MAX_OPTIONS];
    if (kvc_cli_join_options(opts, KVC_CLI_MAX_OPTIONS, kvc_cli_deploy_options, own_options))
        return sim_error("internal: too many options");
    memset(o, 0, sizeof *o);
    kvc_cli_deploy_init(&o->dep);
    o->cfg = kvc_sim_config_default();
    o->cfg.sched.expected_output = 256;
    o->wp = kvc_workload_params_default();
    optind = 1;
    opterr = 0;
    int ch, li = -1;
    uint64_t u;
    double d;
    while ((ch = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
        char opt_name[64];
        kvc_cli_opt_name(opt_name, sizeof opt_name, opts, li, ch, argc, argv);
        li = -1;
        if (ch != O_SCENARIO && ch != O_JSON && ch != O_QUIET && ch != 'h' && !o->n_given++)
            snprintf(o->first_given, sizeof o->first_given, "%s", opt_name);
        int handled = kvc_cli_deploy_option(&o->dep, CMD, ch, opt_name, optarg);
        if (handled < 0) return 1;
        if (handled) continue;
#define U64(lo, hi, field)                                                 \
    do {                                                                   \
        if (!kvc_cli_opt_u64(CMD, opt_name, optarg, lo, hi, &u)) return 1; \
        field = u;                                                         \
    } while (0)
#define DBL(lo, hi, field)                                                    \
    do {                                                                      \
        if (!kvc_cli_opt_double(CMD, opt_name, optarg, lo, hi, &d)) return 1; \
        field = d;                                                            \
    } while (0)
        switch (ch) {
        case O_WORKLOAD:
            o->workload = optarg;
            break;
        case O_NUM_BLOCKS:
            U64(1, 1u << 30, o->cfg.num_blocks);
            break;
        case O_ADMISSION:
            if (kvc_admission_parse(optarg, &o->cfg.sched.admission))
                return sim_error("--admission: '%s' is not greedy, reserve-max or reserve-expected",
                                 optarg);
            break;
        case O_EXPECTED_OUTPUT:
            U64(1, 1u << 30, o->cfg.sched.expected_output);
            break;
        case O_EXPECTED_MARGIN:
            DBL(0, 100, o->cfg.sched.expected_margin);
            break;
        case O_PREEMPTION:
            if (kvc_preemption_parse(optarg, &o->cfg.sched.preemption))
                return sim_error("--preemption: '%s' is not recompute, swap or backpressure",
                                 optarg);
            break;
        case O_SWAP_SPACE:
            if (kvc_plan_parse_bytes(optarg, &u) || !u)
                return sim_error("--swap-space: '%s' is not a size (e.g. 64GiB)", optarg);
            o->cfg.sched.swap_space_bytes = u;
            break;
        case O_CLASS_CAP: {
            const char *eqs = strchr(optarg, '=');
            if (!eqs || eqs == optarg || !kvc_cli_parse_double(eqs + 1, 0, 1, &d) || !(d > 0))
                return sim_error("--class-kv-cap: '%s' is not CLASS=SHARE with 0 < SHARE <= 1",
                                 optarg);
            if (o->n_caps == MAX_CAPS) return sim_error("--class-kv-cap: at most %d", MAX_CAPS);
            o->caps[o->n_caps].cls = optarg;
            o->caps[o->n_caps++].share = d;
            break;
        }
        case O_TENANT_SHARE:
            DBL(1e-6, 1, o->cfg.sched.tenant_kv_share);
            break;
        case O_TENANT_MAX_RUNNING:
            U64(1, 1u << 24, o->cfg.sched.tenant_max_running);
            break;
        case O_TENANT_FAIR:
            o->cfg.sched.tenant_fair = true;
            break;
        case O_TENANT_SALTS:
            o->cfg.tenant_salts = true;
            break;
        case O_LONG_THRESHOLD:
            U64(1, 1u << 31, o->cfg.sched.long_threshold);
            break;
        case O_LONG_CAP:
            DBL(1e-6, 1, o->cfg.sched.long_kv_cap);
            break;
        case O_PREFILL_CHUNK:
            U64(1, 1u << 30, o->cfg.sched.max_prefill_chunk);
            break;
        case O_NO_PREFIX:
            o->cfg.prefix_caching = false;
            break;
        case O_NO_KV_CACHE:
            o->cfg.no_kv_cache = true;
            break;
        case O_ALLOCATION: {
            int a = kvc_sim_allocation_parse(optarg);
            if (a < 0) return sim_error("--allocation: '%s' is not paged or contiguous", optarg);
            o->cfg.allocation = (kvc_sim_allocation_t)a;
            break;
        }
        case O_STEP_OVERHEAD:
            DBL(0, 1e6, d);
            o->cfg.step_overhead_s = d * 1e-3;
            o->overhead_set = true;
            break;
        case O_PROFILE:
            o->profile = optarg;
            break;
        case O_HOLD_SHARED:
            o->cfg.hold_shared_prefix = true;
            break;
        case O_CLOSED_LOOP:
            o->cfg.closed_loop = true;
            break;
        case O_TIER: {
            char msg[256];
            if (o->n_tiers == KVC_SIM_MAX_TIERS)
                return sim_error("--tier: at most %d tiers", KVC_SIM_MAX_TIERS);
            if (kvc_tier_spec_parse(optarg, &o->tiers[o->n_tiers], msg, sizeof msg))
                return sim_error("--tier: %s", msg);
            o->n_tiers++;
            break;
        }
        case O_TIER_ADMISSION:
            if (kvc_tier_admission_parse(optarg, &o->cfg.tier_admission))
                return sim_error("--tier-admission: '%s' is not always, second-hit or depth:N",
                                 optarg);
            break;
        case O_TIER_BUDGET:
            if (kvc_tier_budget_parse(optarg, &o->cfg.tier_disk_write_budget))
                return sim_error("--tier-disk-write-budget: '%s' is not SIZE/day (e.g. 50GiB/day)",
                                 optarg);
            break;
        case O_BREAK_EVEN:
            o->break_even = true;
            break;
        case O_SLO_TTFT:
            DBL(1e-9, 1e12, o->cfg.slo_ttft_ms);
            break;
        case O_SLO_TPOT:
            DBL(1e-9, 1e12, o->cfg.slo_tpot_ms);
            break;
        case O_SLO_E2E:
            DBL(1e-9, 1e12, o->cfg.slo_e2e_ms);
            break;
        case O_SEED:
            U64(1, UINT64_MAX, o->cfg.seed);
            o->wp.seed = o->cfg.seed;
            break;
        case O_MAX_REQUESTS:
            U64(1, UINT64_C(1) << 40, o->wp.max_requests);
            break;
        case O_TIME_SCALE:
            DBL(1e-9, 1e9, o->wp.time_scale);
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_CSV:
            o->csv = optarg;
            break;
        case O_SVG:
            o->svg = optarg;
            break;
        case O_TRACE:
            o->trace = optarg;
            break;
        case O_QUIET:
            o->quiet = true;
            break;
        case O_SCENARIO:
            o->scenario = optarg;
            break;
        case O_MAX_MEMORY:
            if (kvc_plan_parse_bytes(optarg, &u) || !u)
                return sim_error("--max-memory: '%s' is not a size (e.g. 16GiB)", optarg);
            o->cfg.max_memory_bytes = u;
            break;
        case O_EVICTION:
            if (kvc_eviction_parse(optarg, &o->cfg.eviction)) {
                char names[256];
                return sim_error("--eviction: '%s' is not %s", optarg,
                                 name_list(kvc_eviction_names(), names, sizeof names));
            }
            break;
        case O_VICTIM: {
            kvc_victim_t v;
            if (kvc_victim_parse(optarg, &v)) {
                const char *vn[KVC_VICTIM__COUNT + 1];
                for (int i = 0; i < KVC_VICTIM__COUNT; i++)
                    vn[i] = kvc_victim_name((kvc_victim_t)i);
                vn[KVC_VICTIM__COUNT] = NULL;
                char names[256];
                return sim_error("--victim: '%s' is not %s", optarg,
                                 name_list(vn, names, sizeof names));
            }
            o->cfg.sched.victim = kvc_victim_policy(v);
            break;
        }
        case 'h':
            help(stdout);
            return 2;
        default:
            return kvc_cli_bad_option(CMD, ch, opt_name);
        }
#undef U64
#undef DBL
    }
    if (optind < argc) return sim_error("unexpected argument '%s' (try --help)", argv[optind]);
    /* the scheduler follows the deployment's engine limits; speculation from the shared options */
    o->cfg.sched.spec_tokens = o->dep.p.spec_tokens;
    if (o->dep.p.spec_acceptance > 0) o->cfg.spec_acceptance = o->dep.p.spec_acceptance;
    return 0;
}

static void progress(void *ctx, uint64_t done, uint64_t total)
{
    kvc_progress_update(ctx, done, total);
}

/* --csv and --svg, made ready before the run: a path that cannot be written fails at once,
 * not after the whole report was printed.  What was created for them is removed again if the
 * run fails. */
typedef struct {
    FILE *csv;
    bool csv_made, svg_dir_made, svg_file_made;
} outputs_t;

static void outputs_abandon(const opts_t *o, outputs_t *out)
{
    if (out->csv) fclose(out->csv);
    if (out->csv_made) unlink(o->csv);
    if (out->svg_file_made || out->svg_dir_made) {
        char path[4096];
        snprintf(path, sizeof path, "%s/kv_usage.svg", o->svg);
        if (out->svg_file_made) unlink(path);
        if (out->svg_dir_made) rmdir(o->svg);
    }
    *out = (outputs_t){0};
}

/* 0, or an errno for the folder `dir`: it exists (or is made, one level) and takes a file. */
static int svg_prepare(const char *dir, outputs_t *out)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT) return errno;
        if (mkdir(dir, 0777) != 0) return errno;
        out->svg_dir_made = true;
    } else if (!S_ISDIR(st.st_mode)) {
        return ENOTDIR;
    }
    char path[4096];
    if (snprintf(path, sizeof path, "%s/kv_usage.svg", dir) >= (int)sizeof path)
        return ENAMETOOLONG;
    bool existed = stat(path, &st) == 0;
    FILE *f = fopen(path, "a"); /* "a": an existing chart is only replaced after the run */
    if (!f) return errno;
    fclose(f);
    out->svg_file_made = !existed;
    return 0;
}

static int outputs_open(const opts_t *o, outputs_t *out)
{
    *out = (outputs_t){0};
    if (o->csv) {
        struct stat st;
        bool existed = stat(o->csv, &st) == 0;
        out->csv = fopen(o->csv, "w");
        if (!out->csv) return sim_error("--csv: cannot write %s: %s", o->csv, strerror(errno));
        out->csv_made = !existed;
    }
    int e = o->svg ? svg_prepare(o->svg, out) : 0;
    if (e) {
        outputs_abandon(o, out);
        return sim_error("--svg: cannot write into %s: %s", o->svg, strerror(e));
    }
    return 0;
}

/* Load, run, print the report if `print` and write --csv and --svg.  On success *report is the
 * finished report. */
static int run_profiled(opts_t *o, bool print, kvc_report_t **report_out, kvc_sim_result_t *res,
                        char *err, size_t err_cap);

static int run(opts_t *o, bool print, kvc_report_t **report_out, kvc_sim_result_t *res)
{
    *report_out = NULL;
    if (o->break_even && !o->n_tiers)
        return sim_error(
            "--break-even: give the tiers (--tier SPEC, e.g. redis://x:6379,rtt=80ms)");
    if (!o->workload && !o->break_even)
        return sim_error("no --workload (a trace file or a spec; try --help)");
    if (kvc_cli_deploy_resolve(&o->dep, CMD, &o->cfg.model, &o->cfg.gpu)) return 1;
    o->cfg.plan = o->dep.p;
    o->cfg.tiers = o->n_tiers ? o->tiers : NULL;
    o->cfg.n_tiers = o->n_tiers;
    char err[512];
    kvc_sim_profile_t *prof = NULL;
    if (o->profile) {
        if (kvc_sim_profile_load(o->profile, &prof, err, sizeof err))
            return sim_error("--profile: %s", err);
        o->cfg.profile = prof;
        if (!o->overhead_set) o->cfg.step_overhead_s = 0; /* the measured steps include it */
    }
    int rc;
    if (o->break_even) { /* the table alone */
        kvc_sim_tier_table_t table;
        rc = kvc_sim_tier_table(&o->cfg, &table, err, sizeof err);
        if (rc)
            rc = sim_error("%s", err);
        else if (print && (o->json ? kvc_sim_tier_table_write_json(&table, stdout, "") ||
                                         fputc('\n', stdout) == EOF
                                   : kvc_sim_tier_table_write_text(&table, stdout)))
            rc = sim_error("cannot write the table");
        o->cfg.profile = NULL;
        kvc_sim_profile_destroy(prof);
        return rc ? rc : 3; /* 3: printed, no report */
    }
    rc = run_profiled(o, print, report_out, res, err, sizeof err);
    o->cfg.profile = NULL;
    kvc_sim_profile_destroy(prof);
    return rc;
}

static int run_profiled(opts_t *o, bool print, kvc_report_t **report_out, kvc_sim_result_t *res,
                        char *err, size_t err_cap)
{
    kvc_workload_t *w = NULL;
    if (kvc_workload_load(o->workload, &o->wp, &w, err, err_cap)) return sim_error("%s", err);
    for (int i = 0; i < o->n_caps; i++) { /* class caps by name or index */
        const char *eqs = strchr(o->caps[i].cls, '=');
        size_t len = (size_t)(eqs - o->caps[i].cls);
        int found = -1;
        for (uint32_t c = 0; c < kvc_workload_n_classes(w); c++) {
            const char *name = kvc_workload_class_name(w, c);
            if (strlen(name) == len && !strncmp(name, o->caps[i].cls, len)) found = (int)c;
        }
        char idx[16];
        if (found < 0 && len < sizeof idx) {
            memcpy(idx, o->caps[i].cls, len);
            idx[len] = 0;
            uint64_t u;
            if (kvc_cli_parse_u64(idx, 0, KVC_MAX_CLASSES - 1, &u)) found = (int)u;
        }
        if (found < 0 || found >= KVC_MAX_CLASSES) {
            kvc_workload_destroy(w);
            return sim_error("--class-kv-cap: the workload has no class '%.*s'", (int)len,
                             o->caps[i].cls);
        }
        o->cfg.sched.class_kv_cap[found] = o->caps[i].share;
    }
    FILE *trace = NULL;
    if (o->trace) {
        trace = strcmp(o->trace, "-") ? fopen(o->trace, "w") : stderr;
        if (!trace) {
            kvc_workload_destroy(w);
            return sim_error("--trace: cannot write %s: %s", o->trace, strerror(errno));
        }
    }
    o->cfg.trace = trace;
    outputs_t outs;
    if (outputs_open(o, &outs)) {
        if (trace && trace != stderr) fclose(trace);
        kvc_workload_destroy(w);
        return 1;
    }
    kvc_report_params_t rp = kvc_report_params_default();
    rp.ttft_ms = o->cfg.slo_ttft_ms;
    rp.tpot_ms = o->cfg.slo_tpot_ms;
    rp.e2e_ms = o->cfg.slo_e2e_ms;
    rp.tenant_names = kvc_workload_tenant_names(w);
    rp.n_tenants = kvc_workload_n_tenants(w);
    rp.class_names = kvc_workload_class_names(w);
    rp.n_classes = kvc_workload_n_classes(w);
    kvc_report_t *report = NULL;
    int rc = kvc_report_create(&rp, &report);
    kvc_progress_t bar;
    kvc_progress_start(&bar, stderr, "simulating", false);
    if (print && !o->quiet) {
        o->cfg.progress = progress;
        o->cfg.progress_ctx = &bar;
    }
    if (!rc) rc = kvc_sim_run(&o->cfg, w, report, res, err, err_cap);
    if (print && !o->quiet) kvc_progress_finish(&bar, res->completed, res->requests);
    if (trace && trace != stderr) fclose(trace);
    kvc_workload_destroy(w);
    if (rc) {
        outputs_abandon(o, &outs);
        kvc_report_destroy(report);
        return sim_error("%s", err[0] ? err : kvc_strerror(rc));
    }
    *report_out = report;
    if (print) {
        rc =
            o->json ? kvc_report_write_json(report, stdout) : kvc_report_write_text(report, stdout);
        if (rc) {
            outputs_abandon(o, &outs);
            return sim_error("cannot write the report: %s", kvc_strerror(rc));
        }
    }
    if (outs.csv) {
        rc = kvc_report_write_csv(report, outs.csv);
        if (fclose(outs.csv)) rc = KVC_EIO;
        if (rc) return sim_error("--csv: cannot write %s: %s", o->csv, kvc_strerror(rc));
    }
    if (o->svg && (rc = kvc_report_write_svg(report, o->svg)))
        return sim_error("--svg: cannot write into %s: %s", o->svg, kvc_strerror(rc));
    return 0;
}

/* ---- scenarios ----------------------------------------------------------------------- */
/* One metric of a finished run by name: "ttft_ms.p99", "tenant:NAME.e2e_ms.p50",
 * "class:NAME.tpot_ms.p90", "preemptions", ...  false if unknown. */
static bool metric(const kvc_report_t *r, const kvc_sim_result_t *res, const kvc_workload_t *w,
                   const char *name, double *out)
{
    kvc_report_scope_t scope = KVC_REPORT_ALL;
    uint32_t index = 0;
    const char *key = name;
    if (!strncmp(name, "tenant:", 7) || !strncmp(name, "class:", 6)) {
        bool tenant = name[0] == 't';
        const char *nm = name + (tenant ? 7 : 6), *dot = strchr(nm, '.');
        if (!dot) return false;
        size_t len = (size_t)(dot - nm);
        uint32_t n = tenant ? kvc_workload_n_tenants(w) : kvc_workload_n_classes(w);
        bool found = false;
        for (uint32_t i = 0; i < n && !found; i++) {
            const char *s = tenant ? kvc_workload_tenant_name(w, i) : kvc_workload_class_name(w, i);
            if (strlen(s) == len && !strncmp(s, nm, len)) index = i, found = true;
        }
        if (!found) return false;
        scope = tenant ? KVC_REPORT_TENANT : KVC_REPORT_CLASS;
        key = dot + 1;
    }
    kvc_report_summary_t s;
    if (kvc_report_summary(r, scope, index, &s)) return false;
    static const struct {
        const char *prefix;
        size_t off;
    } lat[] = {{"ttft_ms.", offsetof(kvc_report_summary_t, ttft_ms)},
               {"tpot_ms.", offsetof(kvc_report_summary_t, tpot_ms)},
               {"e2e_ms.", offsetof(kvc_report_summary_t, e2e_ms)}};
    for (size_t i = 0; i < KVC_ARRAY_LEN(lat); i++) {
        size_t pl = strlen(lat[i].prefix);
        if (strncmp(key, lat[i].prefix, pl)) continue;
        const kvc_latency_summary_t *l =
            (const kvc_latency_summary_t *)((const char *)&s + lat[i].off);
        const char *q = key + pl;
        if (!strcmp(q, "p50"))
            *out = l->p50;
        else if (!strcmp(q, "p90"))
            *out = l->p90;
        else if (!strcmp(q, "p95"))
            *out = l->p95;
        else if (!strcmp(q, "p99"))
            *out = l->p99;
        else if (!strcmp(q, "mean"))
            *out = l->mean;
        else if (!strcmp(q, "max"))
            *out = l->max;
        else
            return false;
        return true;
    }
    if (!strcmp(key, "completed"))
        *out = (double)s.completed;
    else if (!strcmp(key, "good"))
        *out = (double)s.good;
    else if (!strcmp(key, "throughput_tokens_per_s"))
        *out = s.throughput_tokens_per_s;
    else if (!strcmp(key, "goodput_requests_per_s"))
        *out = s.goodput_requests_per_s;
    else if (!strcmp(key, "prefix_hit_rate"))
        *out = s.prefix_hit_rate;
    else if (!strcmp(key, "preemptions"))
        *out = (double)s.preemptions;
    else if (!strcmp(key, "recomputed_tokens"))
        *out = (double)s.recomputed_tokens;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "swapped_bytes"))
        *out = (double)(res->swapped_out_bytes + res->swapped_in_bytes);
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "tier_saved_tokens"))
        *out = (double)res->tier_saved_tokens;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "peak_kv_blocks"))
        *out = res->peak_kv_blocks;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "fragmentation.mean"))
        *out = res->fragmentation_mean;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "fragmentation.peak"))
        *out = res->fragmentation_peak;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "kv_blocks_total"))
        *out = res->num_blocks; /* the report's key: KV blocks per replica */
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "simulated_seconds"))
        *out = res->simulated_s;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "peak_running"))
        *out = res->peak_running;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "rejected"))
        *out = (double)res->rejected;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "errored_requests"))
        *out = (double)res->errored;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "stranded_blocks.peak"))
        *out = (double)res->peak_stranded_blocks;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "stranded_blocks.end"))
        *out = (double)res->end_stranded_blocks;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "stranded_bytes.peak"))
        *out = (double)res->peak_stranded_blocks * (double)res->kv_bytes_per_block;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "stranded_bytes.end"))
        *out = (double)res->end_stranded_blocks * (double)res->kv_bytes_per_block;
    else if (scope == KVC_REPORT_ALL && !strcmp(key, "strandings"))
        *out = (double)res->strandings;
    else
        return false;
    return true;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n + 4096 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap + 1);
            if (!nb) break;
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    bool bad = ferror(f);
    fclose(f);
    if (bad || !buf) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int scenario(const char *path, bool json)
{
    size_t len;
    char *text = read_file(path, &len);
    if (!text) return sim_error("--scenario: cannot read %s: %s", path, strerror(errno));
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    int rc = 0;
    const cJSON *question = cJSON_GetObjectItemCaseSensitive(root, "question");
    const cJSON *note = cJSON_GetObjectItemCaseSensitive(root, "note"); /* optional */
    const cJSON *common = cJSON_GetObjectItemCaseSensitive(root, "args");
    const cJSON *variants = cJSON_GetObjectItemCaseSensitive(root, "variants");
    const cJSON *metrics = cJSON_GetObjectItemCaseSensitive(root, "metrics");
    if (!cJSON_IsObject(root) || !cJSON_IsString(question) || !cJSON_IsArray(common) ||
        !cJSON_IsArray(variants) || !cJSON_IsArray(metrics) || cJSON_GetArraySize(variants) < 1 ||
        cJSON_GetArraySize(metrics) < 1 || (note && !cJSON_IsString(note))) {
        cJSON_Delete(root);
        return sim_error(
            "--scenario %s: needs \"question\", \"args\", \"variants\" and \"metrics\" (and "
            "a \"note\", if any, is a string)",
            path);
    }
    /* relative paths in the arguments (workloads, configs) are taken from the scenario's folder */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    int n_metrics = cJSON_GetArraySize(metrics), n_var = cJSON_GetArraySize(variants);
    double *values = calloc((size_t)n_metrics * (size_t)n_var, sizeof(double));
    bool *have = calloc((size_t)n_metrics * (size_t)n_var, sizeof(bool));
    const char **names = calloc((size_t)n_var, sizeof(char *));
    char **argv = calloc(256, sizeof(char *));
    char **owned = calloc(256, sizeof(char *));
    if (!values || !have || !names || !argv || !owned) rc = sim_error("out of memory");
    for (int v = 0; !rc && v < n_var; v++) {
        const cJSON *var = cJSON_GetArrayItem(variants, v);
        const cJSON *vname = cJSON_GetObjectItemCaseSensitive(var, "name");
        const cJSON *vargs = cJSON_GetObjectItemCaseSensitive(var, "args");
        if (!cJSON_IsString(vname) || !cJSON_IsArray(vargs)) {
            rc = sim_error("--scenario %s: variant %d needs \"name\" and \"args\"", path, v + 1);
            break;
        }
        names[v] = vname->valuestring;
        int argc = 0, n_owned = 0;
        argv[argc++] = (char *)"sim";
        const cJSON *lists[2] = {common, vargs};

        for (int l = 0; l < 2 && !rc; l++) {
            const cJSON *a;
            cJSON_ArrayForEach(a, lists[l])
            {
                if (!cJSON_IsString(a) || argc >= 250) {
                    rc = sim_error("--scenario %s: arguments must be strings (at most 250)", path);
                    break;
                }
                char *arg = a->valuestring;
                /* a value naming a file next to the scenario (a workload, a config.json) */
                if (arg[0] != '-' && arg[0] != '/' && n_owned < 256) {
                    size_t need = strlen(dir) + strlen(arg) + 2;
                    char *p = malloc(need);
                    if (p) {
                        snprintf(p, need, "%s/%s", dir, arg);
                        if (access(p, R_OK) == 0)
                            arg = owned[n_owned++] = p;
                        else
                            free(p);
                    }
                }
                argv[argc++] = arg;
            }
        }
        argv[argc] = NULL;
        opts_t o;
        kvc_report_t *report = NULL;
        kvc_sim_result_t res;
        if (!rc) {
            int prc = parse(argc, argv, &o);
            if (prc) rc = 1;
        }
        if (!rc && o.scenario)
            rc = sim_error("--scenario %s: variant '%s' gives --scenario: a scenario cannot run "
                           "another scenario",
                           path, names[v]);
        if (!rc && o.json)
            rc = sim_error("--scenario %s: variant '%s' gives --json: give it next to --scenario",
                           path, names[v]);
        if (!rc && o.break_even)
            rc = sim_error("--scenario %s: variant '%s' gives --break-even: it runs nothing", path,
                           names[v]);
        if (!rc) {
            o.quiet = true;
            if (!json && isatty(2))
                fprintf(stderr, "kvcache sim: scenario %s: running '%s'\n", path, names[v]);
            if (run(&o, false, &report, &res)) rc = 1;
        }
        if (!rc) {
            kvc_workload_t *w = NULL;
            char err[256];
            if (kvc_workload_load(o.workload, &o.wp, &w, err, sizeof err))
                rc = sim_error("%s", err);
            for (int m = 0; !rc && m < n_metrics; m++) {
                const cJSON *mn = cJSON_GetArrayItem(metrics, m);
                if (!cJSON_IsString(mn)) {
                    rc = sim_error("--scenario %s: metric %d is not a string", path, m + 1);
                    break;
                }
                have[v * n_metrics + m] =
                    metric(report, &res, w, mn->valuestring, &values[v * n_metrics + m]);
                if (!have[v * n_metrics + m])
                    rc = sim_error("--scenario %s: unknown metric '%s'", path, mn->valuestring);
            }
            kvc_workload_destroy(w);
        }
        kvc_report_destroy(report);
        for (int i = 0; i < n_owned; i++) free(owned[i]);
    }
    if (!rc) {
        if (json) {
            cJSON *out = cJSON_CreateObject();
            cJSON_AddStringToObject(out, "scenario", path);
            cJSON_AddStringToObject(out, "question", question->valuestring);
            if (note) cJSON_AddStringToObject(out, "note", note->valuestring);
            cJSON *vs = cJSON_AddArrayToObject(out, "variants");
            for (int v = 0; v < n_var; v++) {
                cJSON *o = cJSON_CreateObject();
                cJSON_AddStringToObject(o, "name", names[v]);
                cJSON *mo = cJSON_AddObjectToObject(o, "metrics");
                for (int m = 0; m < n_metrics; m++)
                    cJSON_AddNumberToObject(mo, cJSON_GetArrayItem(metrics, m)->valuestring,
                                            values[v * n_metrics + m]);
                cJSON_AddItemToArray(vs, o);
            }
            char *s = cJSON_PrintUnformatted(out);
            if (s) puts(s);
            free(s);
            cJSON_Delete(out);
        } else {
            char e1[4096], e2[4096];
            printf("scenario: %s\nquestion: %s\n\n%-22s", esc(path, e1, sizeof e1),
                   esc(question->valuestring, e2, sizeof e2), "variant");
            /* a column is as wide as its metric's name, 16 at least */
            for (int m = 0; m < n_metrics; m++)
                printf(" %16s", esc(cJSON_GetArrayItem(metrics, m)->valuestring, e1, sizeof e1));
            putchar('\n');
            for (int v = 0; v < n_var; v++) {
                printf("%-22s", esc(names[v], e1, sizeof e1));
                for (int m = 0; m < n_metrics; m++) {
                    double x = values[v * n_metrics + m];
                    int wd = (int)strlen(
                        esc(cJSON_GetArrayItem(metrics, m)->valuestring, e1, sizeof e1));
                    wd = wd > 16 ? wd : 16;
                    if (x == floor(x) && fabs(x) < 1e15)
                        printf(" %*.0f", wd, x);
                    else
                        printf(" %*.3f", wd, x);
                }
                putchar('\n');
            }
            if (note) printf("\nnote: %s\n", esc(note->valuestring, e2, sizeof e2));
        }
    }
    free(values);
    free(have);
    free(names);
    free(argv);
    free(owned);
    cJSON_Delete(root);
    return rc;
}

int kvc_cmd_sim(int argc, char **argv)
{
    opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc == 2 ? 0 : 1;
    if (o.scenario) {
        if (o.n_given) /* they would apply to nothing: each variant is its own command line */
            return sim_error("--scenario: %s cannot be given next to --scenario (put it in the "
                             "scenario's \"args\")",
                             o.first_given);
        return scenario(o.scenario, o.json);
    }
    kvc_report_t *report = NULL;
    kvc_sim_result_t res;
    rc = run(&o, true, &report, &res);
    if (rc == 3) rc = 0; /* --break-even: the table alone */
    kvc_report_destroy(report);
    if (!rc && fflush(stdout) != 0)
        return sim_error("cannot write the output: %s", strerror(errno));
    return rc;
}
