/* bench_tokenizer.c - encode speed of the tokenizers on long English text.
 *
 * The text is the repository's own English (README.md and the docs/ folder's .md files, about 190
 * KB), cut into prompts of 64 KiB (about 16K tokens for an English BPE vocabulary, the prompt size
 * the engine must tokenize without noticing) on line boundaries.  Each vocabulary encodes every
 * prompt; a run's rate is the total bytes over the total time, and the figure is the median
 * of the runs (MB/s, 10^6 bytes a second), with the tokens per prompt and the milliseconds per
 * 16K tokens.  The rate is given by wall-clock time and by the process's CPU time: on this
 * shared machine the second is the one that does not depend on what else runs.  Vocabularies: GPT-2
 * (byte-level BPE, GPT-2's regex), DeepSeek LLM (BPE, six regexes) and Llama 2 (SentencePiece),
 * from tests/data/models/vocab.
 *
 * usage: bench_tokenizer [--reps N] [--data DIR] [--vocab NAME] [TEXT_FILE...]
 *        (run from the repository root; --vocab runs only that vocabulary)
 */
#include "bench_util.h"
#include "kvcache/kvcache.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROMPT_BYTES (64 * 1024)

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int append_file(const char *path, char **buf, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) {
        char *p = realloc(*buf, *n + k);
        if (!p) {
            fclose(f);
            return -1;
        }
        *buf = p;
        memcpy(*buf + *n, chunk, k);
        *n += k;
    }
    fclose(f);
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 7;
    const char *data = "tests/data", *only = NULL;
    char *text = NULL;
    size_t len = 0;
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "--data") && i + 1 < argc) {
            data = argv[++i];
        } else if (append_file(argv[i], &text, &len) == 0) {
            n_files++;
        } else {
            fprintf(stderr, "bench_tokenizer: cannot read %s\n", argv[i]);
            return 1;
        }
    }
    if (!n_files) {
        glob_t gl;
        if (glob("docs/*.md", 0, NULL, &gl) == 0) {
            append_file("README.md", &text, &len);
            for (size_t i = 0; i < gl.gl_pathc; i++) append_file(gl.gl_pathv[i], &text, &len);
            globfree(&gl);
        }
    }
    if (len < PROMPT_BYTES || reps < 1) {
        fprintf(stderr, "bench_tokenizer: no text (run from the repository root, or name files)\n");
        return 1;
    }
    /* prompts of about PROMPT_BYTES, cut after a newline */
    size_t cuts[256], n_prompts = 0, at = 0;
    while (at < len && n_prompts < 255) {
        size_t end = at + PROMPT_BYTES < len ? at + PROMPT_BYTES : len;
        while (end < len && text[end - 1] != '\n') end++;
        cuts[n_prompts++] = at;
        at = end;
    }
    cuts[n_prompts] = at;
    printf("text: %zu bytes in %zu prompts of about %d KiB, %d runs\n", at, n_prompts,
           PROMPT_BYTES / 1024, reps);

    const char *vocabs[] = {"gpt-2", "deepseek-llm", "llama-spm"};
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        if (only && strcmp(only, vocabs[v])) continue;
        char path[1024], err[256];
        snprintf(path, sizeof path, "%s/models/vocab/ggml-vocab-%s.gguf", data, vocabs[v]);
        kvc_gguf_t *g = NULL;
        kvc_tokenizer_t *t = NULL;
        if (kvc_gguf_open(path, NULL, &g, err, sizeof err) ||
            kvc_tokenizer_create_gguf(g, NULL, &t, err, sizeof err)) {
            fprintf(stderr, "bench_tokenizer: %s: %s\n", path, err);
            return 1;
        }
        kvc_gguf_close(g);
        size_t cap = 3 * (PROMPT_BYTES * 2) + 5, n_tokens = 0;
        kvc_token_t *ids = malloc(cap * sizeof *ids);
        double *rate = malloc((size_t)reps * sizeof *rate);
        double *cpu = malloc((size_t)reps * sizeof *cpu);
        if (!ids || !rate || !cpu) return 1;
        for (int r = 0; r < reps; r++) {
            double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
            n_tokens = 0;
            for (size_t p = 0; p < n_prompts; p++) {
                size_t n = 0;
                int rc =
                    kvc_tokenizer_encode(t, text + cuts[p], cuts[p + 1] - cuts[p], 0, ids, cap, &n);
                if (rc) {
                    fprintf(stderr, "bench_tokenizer: encode: %s\n", kvc_strerror(rc));
                    return 1;
                }
                n_tokens += n;
            }
            rate[r] = (double)at / (clock_s(CLOCK_MONOTONIC) - t0) / 1e6;
            cpu[r] = (double)at / (clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0) / 1e6;
        }
        double mbs = kvc_bench_median(rate, reps), mbs_cpu = kvc_bench_median(cpu, reps);
        double tok_per_prompt = (double)n_tokens / (double)n_prompts;
        printf("%-13s %-6s %6.2f MB/s wall %6.2f MB/s cpu  %6.0f tokens/prompt  %5.1f ms cpu per "
               "16K tokens\n",
               vocabs[v], kvc_tokenizer_model(t), mbs, mbs_cpu, tok_per_prompt,
               16384.0 * ((double)at / (double)n_tokens) / (mbs_cpu * 1e6) * 1e3);
        free(ids);
        free(rate);
        free(cpu);
        kvc_tokenizer_destroy(t);
    }
    free(text);
    return 0;
}
