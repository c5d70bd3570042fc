/* kvcache/kvcache.h - the umbrella header: every public layer of libkvcache.
 * See ../shared/DESIGN.md for the layers and their invariants. */
#ifndef KVCACHE_KVCACHE_H
#define KVCACHE_KVCACHE_H

#include "kvcache/util.h"
#include "kvcache/pool.h"
#include "kvcache/prefix.h"
#include "kvcache/seq.h"
#include "kvcache/sched.h"
#include "kvcache/plan.h"
#include "kvcache/sim.h"
#include "kvcache/attn.h"

#define KVC_VERSION "0.1.0"

#endif /* KVCACHE_KVCACHE_H */
