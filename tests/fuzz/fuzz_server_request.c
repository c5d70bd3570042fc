/* fuzz_server_request.c - libFuzzer target over the server's request parser and tenants
 * file: arbitrary bytes, as a completions body, a chat body and a tenants file, must parse
 * into a request whose every field is in range, or be refused with a 4xx naming why; never a
 * crash, an out-of-bounds read or a leak (ASan checks).  The first byte picks the parser.
 * The corpus (tests/fuzz/corpus/server_request) holds valid bodies of each kind. */
#include "server/server_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            fprintf(stderr, "fuzz_server_request: " __VA_ARGS__); \
            fputc('\n', stderr);                                  \
            abort();                                              \
        }                                                         \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!size) return 0;
    const int kind = data[0] % 3;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    if (kind == 2) {
        kvc__srv_tenants_t t;
        char msg[256];
        int rc = kvc__srv_tenants_parse(body, len, &t, msg, sizeof msg);
        CHECK(rc == 0 || rc == KVC_EPARSE, "tenants: %d", rc);
        if (!rc) {
            CHECK(t.n_keys >= 1 && t.n_tenants >= 1 && t.n_tenants <= t.n_keys, "tenant counts");
            for (uint32_t i = 0; i < t.n_keys; i++) {
                CHECK(t.keys[i].tenant < t.n_tenants, "a key names no tenant");
                CHECK(kvc__srv_tenants_find(&t, t.keys[i].key, strlen(t.keys[i].key)) >= 0,
                      "a key is not found");
            }
        } else
            CHECK(t.n_tenants == 0 && t.n_keys == 0 && msg[0], "a refusal left state");
        kvc__srv_tenants_free(&t);
        return 0;
    }
    kvc__srv_req_t r;
    kvc__srv_err_t e;
    const int rc = kvc__srv_parse(body, len, kind == 1, 32000, &r, &e);
    if (rc) {
        CHECK(rc == -1 && e.status >= 400 && e.status < 600 && e.message[0] && e.type, "refusal");
        CHECK(!r.prompts && !r.msgs && !r.model, "a refusal left state");
        return 0;
    }
    CHECK(r.model && r.n >= 1 && r.n <= KVC_MAX_SAMPLES, "n");
    CHECK(r.gp.n_stop <= KVC_MAX_STOP && r.top_logprobs <= KVC_MAX_LOGPROBS, "ranges");
    CHECK(r.gp.temperature >= 0 && r.gp.temperature <= 2 && r.gp.top_p > 0 && r.gp.top_p <= 1,
          "sampling ranges");
    if (kind == 1)
        CHECK(r.n_msgs >= 1 && r.msgs[0].role && r.msgs[0].content, "messages");
    else {
        CHECK(r.n_prompts >= 1 && r.n_prompts <= KVC_SRV_MAX_PROMPTS, "prompts");
        for (uint32_t i = 0; i < r.n_prompts; i++) {
            CHECK(!!r.prompts[i].text != !!r.prompts[i].ids, "a prompt is text or ids");
            for (uint32_t k = 0; k < r.prompts[i].n_ids; k++)
                CHECK(r.prompts[i].ids[k] >= 0 && r.prompts[i].ids[k] < 32000, "an id in range");
        }
    }
    kvc__srv_req_free(&r);
    return 0;
}
