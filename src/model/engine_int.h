/* engine_int.h - internal: a request's generation parameters as the sampler takes them. */
#ifndef KVC_MODEL_ENGINE_INT_H
#define KVC_MODEL_ENGINE_INT_H

#include "kvcache/engine.h"
#include "kvcache/sample.h"

static inline void kvc__sampling_from_gen(const kvc_gen_params_t *g, kvc_sampling_params_t *s)
{
    *s = kvc_sampling_params_default();
    s->temperature = g->temperature;
    s->top_k = g->top_k;
    s->top_p = g->top_p;
    s->min_p = g->min_p;
    s->repetition_penalty = g->repetition_penalty;
    s->presence_penalty = g->presence_penalty;
    s->frequency_penalty = g->frequency_penalty;
    s->seed = g->seed;
    s->n_logprobs = g->n_logprobs;
}

#endif
