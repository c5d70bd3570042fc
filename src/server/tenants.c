/* tenants.c - the tenants file of `kvcache serve --api-keys FILE`: API key -> tenant, with
 * its cache salt (or the shared cache), KV-token quota, priority class, prompt and
 * concurrency limits.  All or nothing: a malformed file is one KVC_EPARSE naming the key
 * and field, and nothing stays allocated. */
#include "server_int.h"

#include "kvcache/sched.h"
#include "util/msg.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvc__srv_tenants_free(kvc__srv_tenants_t *t)
{
    if (!t) return;
    for (uint32_t i = 0; i < t->n_tenants; i++) free(t->tenants[i].name);
    for (uint32_t i = 0; i < t->n_keys; i++) free(t->keys[i].key);
    free(t->tenants);
    free(t->keys);
    memset(t, 0, sizeof *t);
}

static int uint_field(const cJSON *o, const char *key, const char *name, double hi, uint64_t *dst,
                      char *msg, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > hi || v->valuedouble != floor(v->valuedouble))
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tenants: key '%.40s': \"%s\" must be a whole number in [0, %.0f]", key,
                         name, hi);
    *dst = (uint64_t)v->valuedouble;
    return 0;
}

static bool same(const kvc__srv_tenant_t *a, const kvc__srv_tenant_t *b)
{
    return !memcmp(a->ns.salt, b->ns.salt, KVC_SALT_BYTES) && a->shared == b->shared &&
           a->kv_token_quota == b->kv_token_quota && a->priority == b->priority &&
           a->max_prompt_tokens == b->max_prompt_tokens && a->max_concurrent == b->max_concurrent;
}

static int parse_one(const cJSON *kv, kvc__srv_tenants_t *t, char *msg, size_t cap)
{
    const char *key = kv->string;
    if (!key || !key[0] || strlen(key) > 256)
        return kvc__msgf(KVC_EPARSE, msg, cap, "tenants: API keys are 1 to 256 bytes");
    if (!cJSON_IsObject(kv))
        return kvc__msgf(KVC_EPARSE, msg, cap, "tenants: key '%.40s': not an object", key);
    for (uint32_t i = 0; i < t->n_keys; i++)
        if (!strcmp(t->keys[i].key, key))
            return kvc__msgf(KVC_EPARSE, msg, cap, "tenants: key '%.40s' appears twice", key);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(kv, "tenant");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 64)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tenants: key '%.40s': \"tenant\" must be a name of 1 to 64 bytes", key);
    for (const char *c = name->valuestring; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '_' || *c == '-' || *c == '.'))
            return kvc__msgf(KVC_EPARSE, msg, cap,
                             "tenants: key '%.40s': tenant names are letters, digits, '_', '-' "
                             "and '.' (they label metrics)",
                             key);
    kvc__srv_tenant_t nt = {0};
    const cJSON *cache = cJSON_GetObjectItemCaseSensitive(kv, "cache");
    if (cache && !cJSON_IsNull(cache)) {
        if (!cJSON_IsString(cache) ||
            (strcmp(cache->valuestring, "shared") && strcmp(cache->valuestring, "isolated")))
            return kvc__msgf(KVC_EPARSE, msg, cap,
                             "tenants: key '%.40s': \"cache\" is \"isolated\" or \"shared\"", key);
        nt.shared = !strcmp(cache->valuestring, "shared");
    }
    const cJSON *salt = cJSON_GetObjectItemCaseSensitive(kv, "cache_salt");
    if (salt && !cJSON_IsNull(salt) && (!cJSON_IsString(salt) || !salt->valuestring[0]))
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tenants: key '%.40s': \"cache_salt\" must be a non-empty string", key);
    if (salt && cJSON_IsString(salt) && nt.shared)
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tenants: key '%.40s': a shared cache has no \"cache_salt\"", key);
    if (!nt.shared) {
        /* isolated: its own salt, the tenant's name unless given; "tenant:" keeps a tenant's
         * namespace apart from any per-request cache_salt of a shared tenant */
        char buf[400];
        snprintf(buf, sizeof buf, "tenant:%s",
                 cJSON_IsString(salt) ? salt->valuestring : name->valuestring);
        if (kvc_namespace_set_salt(&nt.ns, buf))
            return kvc__msgf(KVC_ENOMEM, msg, cap, "tenants: the salt digest failed");
    }
    uint64_t u = 0;
    int rc;
    if ((rc = uint_field(kv, key, "kv_token_quota", 1e15, &nt.kv_token_quota, msg, cap))) return rc;
    if ((rc = uint_field(kv, key, "priority", KVC_MAX_CLASSES - 1, &u, msg, cap))) return rc;
    nt.priority = (uint32_t)u;
    u = 0;
    if ((rc = uint_field(kv, key, "max_prompt_tokens", 4294967295.0, &u, msg, cap))) return rc;
    nt.max_prompt_tokens = (uint32_t)u;
    u = 0;
    if ((rc = uint_field(kv, key, "max_concurrent", 4294967295.0, &u, msg, cap))) return rc;
    nt.max_concurrent = (uint32_t)u;

    uint32_t ti = t->n_tenants;
    for (uint32_t i = 0; i < t->n_tenants; i++)
        if (!strcmp(t->tenants[i].name, name->valuestring)) {
            if (!same(&t->tenants[i], &nt))
                return kvc__msgf(KVC_EPARSE, msg, cap,
                                 "tenants: tenant '%s' is given two different settings",
                                 name->valuestring);
            ti = i;
        }
    if (ti == t->n_tenants) {
        kvc__srv_tenant_t *v = realloc(t->tenants, (t->n_tenants + 1) * sizeof *v);
        if (!v) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
        t->tenants = v;
        if (!(nt.name = strdup(name->valuestring)))
            return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
        t->tenants[t->n_tenants++] = nt;
    }
    void *k = realloc(t->keys, (t->n_keys + 1) * sizeof *t->keys);
    if (!k) return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    t->keys = k;
    if (!(t->keys[t->n_keys].key = strdup(key)))
        return kvc__msgf(KVC_ENOMEM, msg, cap, "out of memory");
    t->keys[t->n_keys++].tenant = ti;
    return 0;
}

int kvc__srv_tenants_parse(const char *json, size_t len, kvc__srv_tenants_t *out, char *msg,
                           size_t cap)
{
    memset(out, 0, sizeof *out);
    cJSON *j = json ? cJSON_ParseWithLength(json, len) : NULL;
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return kvc__msgf(KVC_EPARSE, msg, cap,
                         "tenants: not a JSON object of API key -> {\"tenant\": NAME, ...}");
    }
    int rc = 0;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, j)
    {
        if ((rc = parse_one(kv, out, msg, cap))) break;
    }
    if (!rc && !out->n_keys) rc = kvc__msgf(KVC_EPARSE, msg, cap, "tenants: no API keys");
    cJSON_Delete(j);
    if (rc) kvc__srv_tenants_free(out);
    return rc;
}

int kvc__srv_tenants_find(const kvc__srv_tenants_t *t, const char *key, size_t len)
{
    for (uint32_t i = 0; i < t->n_keys; i++) {
        const char *k = t->keys[i].key;
        const size_t kl = strlen(k);
        /* compare every byte of equal-length keys, so timing does not say how much matched */
        unsigned diff = (unsigned)(kl != len);
        for (size_t b = 0; b < kl && kl == len; b++) diff |= (unsigned char)(k[b] ^ key[b]);
        if (!diff) return (int)t->keys[i].tenant;
    }
    return -1;
}
