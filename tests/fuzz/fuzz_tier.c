/* fuzz_tier.c - libFuzzer target over the tier layer's untrusted inputs, with oracles.
 *
 * byte 0 % 3 picks what the rest is:
 *   0: a --tier spec, a write budget and an admission policy (one NUL-terminated copy each):
 *      a parse that succeeds must give fields in range;
 *   1: a stored record, as a disk file or a redis value hands it back: verification may
 *      accept it only if re-encoding its payload under the expected key gives exactly the
 *      same bytes (a record that passes is the one that was written, nothing else);
 *   2: operations on a small host store (put, get, delete, contains, flip a stored byte),
 *      against a reference of what was put: a get that hits returns exactly the last bytes
 *      put under that key and never a record whose bytes were flipped since; the index
 *      check passes after every operation.  Any violation aborts.
 */
#include "kvcache/tier.h"
#include "tier/tier_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BT 2
#define BB 8
#define NK 6

static void parse_strings(const uint8_t *d, size_t n)
{
    char s[256];
    size_t m = n < sizeof s - 1 ? n : sizeof s - 1;
    memcpy(s, d, m);
    s[m] = '\0';
    kvc_tier_spec_t t;
    if (kvc_tier_spec_parse(s, &t, NULL, 0) == 0) {
        if (t.kind > KVC_TIER_REDIS || t.mode > KVC_TIER_MODE_WRITE_THROUGH) abort();
        if (t.kind != KVC_TIER_REDIS && t.capacity_bytes == 0) abort();
        if (t.kind == KVC_TIER_DISK && (t.path[0] == '\0' || strlen(t.path) >= KVC_TIER_PATH_MAX))
            abort();
        if (t.kind == KVC_TIER_REDIS &&
            (t.port == 0 || t.host[0] == '\0' || t.prefix[0] == '\0' || strchr(t.prefix, ':')))
            abort();
    }
    uint64_t b;
    if (kvc_tier_budget_parse(s, &b) == 0 && b == 0) abort();
    kvc_tier_admission_t a;
    if (kvc_tier_admission_parse(s, &a) == 0 && a.kind >= KVC_TIER_ADMIT__COUNT) abort();
}

static void fixed_key(kvc_tier_key_t *k, kvc_token_t *tok, uint64_t i)
{
    memset(k, 0, sizeof *k);
    tok[0] = (kvc_token_t)i;
    tok[1] = 7;
    k->hash = (kvc_hash128_t){i + 1, 2};
    k->parent_hash = (kvc_hash128_t){i, 0};
    k->tokens = tok;
    k->n_tokens = BT;
}

static void verify_record(const uint8_t *d, size_t n)
{
    kvc_token_t tok[BT];
    kvc_tier_key_t k;
    fixed_key(&k, tok, 0);
    if (kvc__tier_record_verify(d, n, &k, BB, BT) != 0) return;
    size_t rec = kvc__tier_record_size(BB, BT);
    if (n != rec) abort();
    kvc__tier_hdr_t h;
    memcpy(&h, d, sizeof h);
    k.depth = h.depth;
    unsigned char *again = malloc(rec);
    if (!again) return;
    kvc__tier_record_encode(again, &k, d + kvc__tier_payload_offset(BT), BB, h.seq);
    if (memcmp(again, d, rec) != 0) abort();
    free(again);
}

static void host_ops(const uint8_t *d, size_t n)
{
    kvc_tier_params_t p = kvc_tier_params_default();
    p.block_bytes = BB;
    p.block_tokens = BT;
    p.capacity_bytes = kvc_tier_record_bytes(BB, BT) * 3; /* fewer slots than keys */
    if (n > 0 && d[0] & 1) (void)!kvc_tier_admission_parse("second-hit", &p.admission);
    kvc_tier_store_t *s = NULL;
    if (kvc_tier_host_create(&p, &s)) return;
    enum { REC = 168 }; /* kvc_tier_record_bytes(BB, BT) */
    unsigned char last[NK][BB], image[NK][REC];
    bool valid[NK] = {false}; /* last[] is what a hit must return */
    if (kvc_tier_record_bytes(BB, BT) != REC) abort();
    for (size_t i = 1; i + 1 < n; i += 2) {
        uint64_t key = d[i + 1] % NK;
        kvc_token_t tok[BT];
        kvc_tier_key_t k;
        fixed_key(&k, tok, key);
        unsigned char buf[BB];
        switch (d[i] % 5) {
        case 0: {
            memset(buf, d[i], BB);
            buf[0] = (unsigned char)key;
            kvc_tier_put_status_t st;
            if (kvc_tier_put(s, &k, buf, &st)) abort();
            if (st == KVC_TIER_PUT_STORED) {
                memcpy(last[key], buf, BB);
                memcpy(image[key], kvc__tier_host_record(s, &k), REC);
                valid[key] = true;
            }
            break;
        }
        case 1:
            if (kvc_tier_get(s, &k, buf) == 0 && (!valid[key] || memcmp(buf, last[key], BB)))
                abort();
            break;
        case 2:
            (void)kvc_tier_delete(s, &k);
            valid[key] = false;
            break;
        case 3:
            if (kvc_tier_contains(s, &k) < 0) abort();
            break;
        case 4: {
            unsigned char *r = kvc__tier_host_record(s, &k);
            if (r) {
                r[d[i] % REC] ^= (unsigned char)(1u << (d[i + 1] % 8));
                /* Servable only if the flips so far cancelled out (the written bytes again). */
                /* (a record the index holds was written by this key's last STORED put) */
                valid[key] = memcmp(r, image[key], REC) == 0;
            }
            break;
        }
        }
        if (kvc_tier_check(s, NULL, 0)) abort();
    }
    kvc_tier_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    switch (data[0] % 3) {
    case 0:
        parse_strings(data + 1, size - 1);
        break;
    case 1:
        verify_record(data + 1, size - 1);
        break;
    default:
        host_ops(data + 1, size - 1);
        break;
    }
    return 0;
}
