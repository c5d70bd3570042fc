/* bench_tier.c - each tier's fetch latency and bandwidth for the engine's bench models'
 * block sizes, and the break-even run length below which recompute wins.
 *
 * Blocks: 16 tokens of f16 K and V, so a block is 16 * 2 * layers * kv_heads * head_dim * 2
 * bytes (58M: 8 layers, 4 KV heads of 64: 128 KiB; 0.5B: 24 layers: 384 KiB).  Per model and
 * tier: put 64 blocks one at a time, get them one at a time, and as one batch (for redis
 * one pipelined round trip; host and disk loop), medians of --reps runs.  The disk tier is
 * measured twice: warm (its file in the page cache, what a recently written block costs)
 * and cold (fdatasync + POSIX_FADV_DONTNEED before the gets, what the device costs).
 * Latency and bandwidth are then fitted from batches of 1 to 64 blocks (least squares over
 * the medians: seconds = latency + bytes / bandwidth), and kvc_tier_decide gives the
 * break-even run against the model's prefill rate (the engine's pp512 on this machine,
 * README's table; --prefill overrides it) and against 1e4, 1e5 and 1e6 tokens/s, the rates
 * of engines that prefill faster (a GPU's).
 *
 * Redis: a redis-server started here on a free port (or --redis HOST:PORT).
 *
 * usage: bench_tier [--reps N] [--dir DIR] [--redis HOST:PORT] [--prefill TOK_PER_S]
 */
#include "bench_util.h"
#include "kvcache/kvcache.h"
#include "kvcache/tier.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BT    16
#define NBLK  64
#define MAXRP 64

typedef struct {
    const char *name;
    uint32_t layers, kv_heads, head_dim;
    double prefill_tok_s; /* pp512, 1 thread, README's engine table */
} model_t;

static const model_t models[] = {
    {"58M q8_0", 8, 4, 64, 528},
    {"0.5B q8_0", 24, 4, 64, 54.3},
};

static double now_s(void)
{
    return (double)kvc_now_ns() * 1e-9;
}

typedef struct {
    kvc_tier_key_t key;
    kvc_token_t tokens[BT];
} bkey_t;

static bkey_t keys[NBLK];
static kvc_tier_key_t kk[NBLK];

static void make_keys(uint64_t salt)
{
    for (int i = 0; i < NBLK; i++) {
        memset(&keys[i], 0, sizeof keys[i]);
        for (int t = 0; t < BT; t++) keys[i].tokens[t] = (kvc_token_t)(i * BT + t);
        keys[i].key.hash = (kvc_hash128_t){salt * 1000003u + (uint64_t)i + 1, salt};
        keys[i].key.tokens = keys[i].tokens;
        keys[i].key.n_tokens = BT;
        keys[i].key.depth = (uint32_t)i;
        kk[i] = keys[i].key;
    }
}

static pid_t redis_pid = -1;

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a)) {
        close(fd);
        return -1;
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static int start_redis(void)
{
    int port = free_port();
    if (port <= 0) return -1;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a crashed parent */
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, 1);
            dup2(devnull, 2);
        }
        execlp("redis-server", "redis-server", "--port", ps, "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", (char *)NULL);
        _exit(127);
    }
    redis_pid = pid;
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
    return port;
}

typedef struct {
    double put_us, get_us, get_batch_us; /* per block, medians */
    double lat_s, bw_Bps;                /* fitted from batches of 1..64 */
    bool ok;
} result_t;

/* Drop the disk file's pages from the page cache (after writing them back). */
static void drop_cache(const char *path)
{
    if (!path) return;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

static unsigned char *data, *out;
static void *op[NBLK];
static const void *dp[NBLK];

/* Put NBLK fresh blocks; seconds per block, or -1 if any put did not store. */
static double put_round(kvc_tier_store_t *s, uint64_t salt, bool batch)
{
    make_keys(salt);
    kvc_tier_put_status_t st[NBLK];
    double t0 = now_s();
    if (batch) {
        if (kvc_tier_put_many(s, kk, dp, NBLK, st)) return -1;
    } else
        for (int i = 0; i < NBLK; i++)
            if (kvc_tier_put(s, &kk[i], data, &st[i])) return -1;
    double t = (now_s() - t0) / NBLK;
    for (int i = 0; i < NBLK; i++)
        if (st[i] != KVC_TIER_PUT_STORED) return -1;
    return t;
}

static result_t measure(kvc_tier_store_t *s, int reps, const char *cold_path, uint64_t *salt)
{
    result_t r = {.ok = true};
    double put[MAXRP], get[MAXRP], getb[MAXRP];
    int res[NBLK];
    for (int rep = 0; rep < reps; rep++) {
        uint64_t sa = ++*salt;
        put[rep] = put_round(s, sa, false);
        if (put[rep] < 0) r.ok = false;
        drop_cache(cold_path);
        double t0 = now_s();
        for (int i = 0; i < NBLK; i++)
            if (kvc_tier_get(s, &kk[i], op[i])) r.ok = false;
        get[rep] = (now_s() - t0) / NBLK;
        drop_cache(cold_path);
        t0 = now_s();
        if (kvc_tier_get_many(s, kk, op, NBLK, res) != NBLK) r.ok = false;
        getb[rep] = (now_s() - t0) / NBLK;
    }
    r.put_us = kvc_bench_median(put, reps) * 1e6;
    r.get_us = kvc_bench_median(get, reps) * 1e6;
    r.get_batch_us = kvc_bench_median(getb, reps) * 1e6;
    /* Fit latency and bandwidth from batches of several sizes (one batch is one fetch):
     * least squares over the medians, seconds = latency + bytes / bandwidth. */
    static const int sizes[] = {1, 2, 4, 8, 16, 32, 64};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    double med[NS];
    if (put_round(s, ++*salt, false) < 0) r.ok = false;
    for (int k = 0; k < NS; k++) {
        double v[MAXRP];
        for (int rep = 0; rep < reps; rep++) {
            drop_cache(cold_path);
            double t0 = now_s();
            if (kvc_tier_get_many(s, kk, op, (size_t)sizes[k], res) != sizes[k]) r.ok = false;
            v[rep] = now_s() - t0;
        }
        med[k] = kvc_bench_median(v, reps);
    }
    double mx = 0, my = 0, sxx = 0, sxy = 0;
    for (int k = 0; k < NS; k++) {
        mx += (double)sizes[k] * (double)s->block_bytes / NS;
        my += med[k] / NS;
    }
    for (int k = 0; k < NS; k++) {
        double dx = (double)sizes[k] * (double)s->block_bytes - mx;
        sxx += dx * dx;
        sxy += dx * (med[k] - my);
    }
    double slope = sxy / sxx;
    r.bw_Bps = slope > 0 ? 1.0 / slope : 1e12;
    r.lat_s = my - slope * mx > 0 ? my - slope * mx : 0;
    return r;
}

static double batch_put_us(kvc_tier_store_t *s, int reps, uint64_t *salt)
{
    double v[MAXRP];
    for (int rep = 0; rep < reps; rep++) v[rep] = put_round(s, ++*salt, true);
    return kvc_bench_median(v, reps) * 1e6;
}

int main(int argc, char **argv)
{
    int reps = 5;
    const char *dir = ".";
    const char *redis = NULL;
    double prefill = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "--redis") == 0 && i + 1 < argc)
            redis = argv[++i];
        else if (strcmp(argv[i], "--prefill") == 0 && i + 1 < argc)
            prefill = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_tier [--reps N] [--dir DIR] [--redis HOST:PORT] "
                            "[--prefill TOK_PER_S]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > MAXRP) reps = 5;
    signal(SIGPIPE, SIG_IGN);
    char rhost[256] = "127.0.0.1";
    int rport = 0;
    if (redis) {
        const char *c = strrchr(redis, ':');
        if (!c || (size_t)(c - redis) >= sizeof rhost) return 2;
        memcpy(rhost, redis, (size_t)(c - redis));
        rhost[c - redis] = '\0';
        rport = atoi(c + 1);
    } else
        rport = start_redis();

    printf("| model | block | tier | put us/block | get us/block | batch get us/block | "
           "batch put us/block | fitted latency us | fitted GB/s | recompute ms/block | "
           "break-even (blocks) | at 1e4 tok/s | at 1e5 tok/s | at 1e6 tok/s |\n");
    printf("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    uint64_t salt = 0;
    for (size_t m = 0; m < KVC_ARRAY_LEN(models); m++) {
        const model_t *md = &models[m];
        size_t bb = (size_t)BT * 2 * md->layers * md->kv_heads * md->head_dim * 2;
        double rate = prefill > 0 ? prefill : md->prefill_tok_s;
        data = malloc(bb);
        out = malloc((size_t)NBLK * bb);
        for (size_t b = 0; b < bb; b++) data[b] = (unsigned char)(b * 13);
        for (int i = 0; i < NBLK; i++) {
            op[i] = out + (size_t)i * bb;
            dp[i] = data;
        }
        kvc_tier_params_t p = kvc_tier_params_default();
        p.block_bytes = bb;
        p.block_tokens = BT;
        p.capacity_bytes = (uint64_t)kvc_tier_record_bytes(bb, BT) * NBLK * 4;
        p.timeout_ms = 2000;
        p.model_id = "bench";
        char path[1024];
        snprintf(path, sizeof path, "%s/bench_tier-%d.bin", dir, (int)getpid());
        const char *tiers[] = {"host", "disk (warm)", "disk (cold)", "redis"};
        for (size_t t = 0; t < KVC_ARRAY_LEN(tiers); t++) {
            kvc_tier_store_t *s = NULL;
            int rc;
            if (t == 0)
                rc = kvc_tier_host_create(&p, &s);
            else if (t < 3) {
                unlink(path);
                p.capacity_bytes = (uint64_t)(kvc_tier_record_bytes(bb, BT) + 64) * NBLK * 4;
                rc = kvc_tier_disk_create(path, &p, &s);
            } else {
                if (rport <= 0) {
                    printf("| %s | %zu KiB | redis | (no redis-server) ||||||||||| \n", md->name,
                           bb >> 10);
                    continue;
                }
                rc = kvc_tier_redis_create(rhost, (uint16_t)rport, "bench", &p, &s);
            }
            if (rc) {
                fprintf(stderr, "bench_tier: %s: %s\n", tiers[t], kvc_strerror(rc));
                return 1;
            }
            /* Fill the store once first: the measured rounds then reuse memory and file
             * blocks already touched (first-touch page faults are not the tier's cost). */
            for (int w = 0; w < 4; w++)
                if (put_round(s, ++salt, false) < 0) fprintf(stderr, "warm-up put failed\n");
            result_t r = measure(s, reps, t == 2 ? path : NULL, &salt);
            double bput = batch_put_us(s, reps, &salt);
            /* Break-even at this engine's rate, then at faster engines' (a GPU prefills a
             * small model at 1e4..1e6 tokens/s): where recompute starts to win. */
            const double rates[] = {rate, 1e4, 1e5, 1e6};
            char be[4][32];
            double rec_ms = 0;
            for (int q = 0; q < 4; q++) {
                kvc_tier_run_t run = {.n_blocks = 1,
                                      .block_bytes = bb,
                                      .block_tokens = BT,
                                      .bandwidth_Bps = r.bw_Bps,
                                      .latency_s = r.lat_s,
                                      .prefill_tokens_per_s = rates[q]};
                kvc_tier_decision_t d;
                if (kvc_tier_decide(&run, &d)) return 1;
                if (q == 0) rec_ms = d.recompute_s * 1e3;
                if (d.break_even == UINT32_MAX)
                    snprintf(be[q], sizeof be[q], "never");
                else
                    snprintf(be[q], sizeof be[q], "%u", d.break_even);
            }
            printf("| %s | %zu KiB | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %s | "
                   "%s | %s | %s%s |\n",
                   md->name, bb >> 10, tiers[t], r.put_us, r.get_us, r.get_batch_us, bput,
                   r.lat_s * 1e6, r.bw_Bps / 1e9, rec_ms, be[0], be[1], be[2], be[3],
                   r.ok ? "" : " (errors)");
            kvc_tier_stats_t st;
            kvc_tier_stats(s, &st);
            if (st.n_faults || st.n_corrupt || st.n_mismatch)
                fprintf(stderr, "bench_tier: %s: %llu faults, %llu corrupt, %llu mismatched\n",
                        tiers[t], (unsigned long long)st.n_faults, (unsigned long long)st.n_corrupt,
                        (unsigned long long)st.n_mismatch);
            kvc_tier_destroy(s);
            if (t > 0 && t < 3) unlink(path);
        }
        free(data);
        free(out);
    }
    double load[3] = {0};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("\nload average %.2f; ", load[0]);
    printf("prefill rate: %s; blocks of %d tokens, f16 K and V; %d reps, medians\n",
           prefill > 0 ? "--prefill" : "README's pp512 (58M q8_0: 528, 0.5B q8_0: 54.3 tok/s)", BT,
           reps);
    if (redis_pid > 0) {
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
    }
    return 0;
}
