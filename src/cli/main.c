/* main.c - the kvcache command: dispatches to its subcommands. */
#include "cli.h"
#include "kvcache/kvcache.h"

#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"explain", kvc_cmd_explain,
     "walk prompts through the prefix cache: per block hash, hit or miss and why, evictions"},
    {"plan", kvc_cmd_plan, "size a deployment's KV cache and startup memory, with the derivation"},
    {"sim", kvc_cmd_sim,
     "simulate the scheduler and block manager in virtual time on a trace or a synthetic workload"},
    {"run", kvc_cmd_run, "generate text with the CPU engine on the paged cache"},
    {"serve", kvc_cmd_serve, "serve the engine over an OpenAI-compatible HTTP API"},
    {"model", kvc_cmd_model, "what a GGUF model file holds: hyperparameters, tokenizer, tensors"},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvcache <command> [options]\n\n"
            "kvcache %s - a KV-cache runtime for LLM serving.\n\ncommands:\n",
            KVC_VERSION);
    for (size_t i = 0; i < KVC_ARRAY_LEN(commands); i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'kvcache <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvcache %s\n", KVC_VERSION);
        return 0;
    }
    for (size_t i = 0; i < KVC_ARRAY_LEN(commands); i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    kvc_cli_error(NULL, "unknown command '%s' (try 'kvcache --help')", argv[1]);
    return 2;
}
