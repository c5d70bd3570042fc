/* fuzz_workload.c - libFuzzer target over the workload loaders: Mooncake
 * and kvcache JSONL traces, spec objects and inline spec strings, from
 * arbitrary bytes.  Every load must either fail with an error code and a
 * one-line message, or give a workload that keeps its invariants (arrival
 * order, lengths, caps, names, tokens in range) and survives a round trip
 * through the JSONL writer unchanged; anything else aborts.  Arrivals and
 * think times stay within KVC_SIM_MAX_TIME_S, messages hold no control
 * bytes, and a load that succeeds is repeated with one of its allocations
 * failing (which one depends on the input): it must fail with KVC_ENOMEM
 * and free everything.
 *
 * Encoding: byte 0 picks the format (bits 0-2: auto, mooncake, jsonl, spec,
 * inline string), tokens on demand (bit 3) and the Mooncake block size
 * (bits 4-7: 1..16 tokens); the rest is the input.  Loads are bounded
 * (64 requests, 4096-token prompts) so every input runs quickly. */
#include "kvcache/kvcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim/workload_int.h" /* kvc__is_inline_spec */

#define CHECK(cond, ...)                                    \
    do {                                                    \
        if (!(cond)) {                                      \
            fprintf(stderr, "fuzz_workload: " __VA_ARGS__); \
            fputc('\n', stderr);                            \
            abort();                                        \
        }                                                   \
    } while (0)

static void check(const kvc_workload_t *w, uint32_t vocab, bool generated)
{
    size_t n = kvc_workload_size(w);
    CHECK(n >= 1 && n <= 64, "size %zu", n);
    CHECK(kvc_workload_n_tenants(w) >= 1 && kvc_workload_n_classes(w) >= 1, "no names");
    kvc_token_t *buf = malloc(4096 * sizeof *buf);
    CHECK(buf, "oom");
    for (size_t i = 0; i < n; i++) {
        const kvc_sim_request_t *r = kvc_workload_request(w, i);
        CHECK(i == 0 || r->arrival_s >= kvc_workload_request(w, i - 1)->arrival_s, "order");
        CHECK(r->arrival_s >= 0 && r->arrival_s <= KVC_SIM_MAX_TIME_S, "arrival %g", r->arrival_s);
        CHECK(r->think_s >= 0 && r->think_s <= KVC_SIM_MAX_TIME_S, "think %g", r->think_s);
        CHECK(r->n_prompt >= 1 && r->n_prompt <= 4096, "n_prompt %u", r->n_prompt);
        CHECK(r->n_output >= 1 && r->n_output <= 4096, "n_output %u", r->n_output);
        CHECK(r->max_output >= r->n_output, "max_output");
        CHECK(r->tenant < kvc_workload_n_tenants(w), "tenant");
        CHECK(r->priority < kvc_workload_n_classes(w), "class");
        CHECK(r->output_tokens, "output tokens");
        CHECK(kvc_workload_prompt(w, i, buf, 4096) == 0, "prompt");
        CHECK(!r->tokens || !memcmp(buf, r->tokens, r->n_prompt * sizeof *buf), "prompt copy");
        if (generated)
            for (uint32_t k = 0; k < r->n_prompt; k++)
                CHECK(buf[k] >= 0 && (uint32_t)buf[k] < vocab, "token %d", buf[k]);
    }
    free(buf);
}

/* Write, load back, write again: the same bytes. */
static void round_trip(const kvc_workload_t *w)
{
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    FILE *f = open_memstream(&a, &la);
    CHECK(f && kvc_workload_write_jsonl(w, f) == 0, "write");
    fclose(f);
    kvc_workload_params_t p = kvc_workload_params_default();
    p.max_tokens = 4096;
    kvc_workload_t *back = NULL;
    char err[256];
    int rc = kvc_workload_load_buffer(a, la, "round trip", &p, &back, err, sizeof err);
    CHECK(rc == 0, "reload: %s", err);
    f = open_memstream(&b, &lb);
    CHECK(f && kvc_workload_write_jsonl(back, f) == 0, "rewrite");
    fclose(f);
    CHECK(la == lb && !memcmp(a, b, la), "round trip differs");
    kvc_workload_destroy(back);
    free(a);
    free(b);
}

/* The load the input asks for: an inline string (`spec`, NUL-terminated) or a buffer. */
static int load(unsigned mode, const char *spec, const char *text, size_t len,
                kvc_workload_params_t *p, kvc_workload_t **w, char *err, size_t err_cap)
{
    if (mode == 4) return kvc_workload_load(spec, p, w, err, err_cap);
    p->format = mode == 1   ? KVC_WORKLOAD_MOONCAKE
                : mode == 2 ? KVC_WORKLOAD_JSONL
                : mode == 3 ? KVC_WORKLOAD_SPEC
                            : KVC_WORKLOAD_AUTO;
    return kvc_workload_load_buffer(text, len, "fuzz", p, w, err, err_cap);
}

static void check_message(const char *err)
{
    CHECK(err[0], "no message");
    for (const char *c = err; *c; c++)
        CHECK((unsigned char)*c >= 0x20 && *c != 0x7f, "control byte in '%s'", err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t cfg = data[0];
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    kvc_workload_params_t p = kvc_workload_params_default();
    p.max_requests = 64;
    p.max_tokens = 4096;
    p.vocab = 1000;
    p.tokens_on_demand = cfg & 8;
    p.block_tokens = 1 + (cfg >> 4);
    kvc_workload_t *w = NULL;
    char err[256] = "";
    unsigned mode = cfg & 7;
    char *spec = NULL;
    if (mode == 4) {
        spec = malloc(len + 1);
        CHECK(spec, "oom");
        memcpy(spec, text, len);
        spec[len] = '\0';
        /* only strings that can never name a file: no path may be opened */
        if (!kvc__is_inline_spec(spec) || strchr(spec, '/') || strlen(spec) != len) {
            free(spec);
            return 0;
        }
    }
    kvc_failing_alloc_t count = {0};
    p.allocator = kvc_failing_allocator(&count);
    int rc = load(mode, spec, text, len, &p, &w, err, sizeof err);
    if (rc) {
        CHECK(!w, "failed load returned a workload");
        CHECK(rc == KVC_EPARSE || rc == KVC_EIO || rc == KVC_EINVAL, "code %s: %s", kvc_errname(rc),
              err);
        check_message(err);
        CHECK(count.n_live == 0, "a failed load leaked %llu", (unsigned long long)count.n_live);
        free(spec);
        return 0;
    }
    /* the same load with one of its allocations failing */
    if (count.n_allocs) {
        uint64_t h = kvc_hash128(data, size, 0x66617574ULL).lo;
        kvc_failing_alloc_t st = {.fail_at = 1 + h % count.n_allocs};
        kvc_workload_params_t q = p;
        q.allocator = kvc_failing_allocator(&st);
        kvc_workload_t *w2 = NULL;
        char err2[256] = "";
        int rc2 = load(mode, spec, text, len, &q, &w2, err2, sizeof err2);
        CHECK(rc2 == KVC_ENOMEM && !w2, "allocation %llu of %llu failed: %s (%s)",
              (unsigned long long)st.fail_at, (unsigned long long)count.n_allocs, kvc_errname(rc2),
              err2);
        check_message(err2);
        CHECK(st.n_live == 0, "a failed load leaked %llu", (unsigned long long)st.n_live);
    }
    free(spec);
    kvc_workload_format_t f = kvc_workload_format(w);
    check(w, p.vocab, f == KVC_WORKLOAD_SPEC || f == KVC_WORKLOAD_MOONCAKE);
    round_trip(w);
    kvc_workload_destroy(w);
    CHECK(count.n_live == 0, "destroy leaked %llu", (unsigned long long)count.n_live);
    return 0;
}
