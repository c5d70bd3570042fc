/* kvcache/kvcache.h - the umbrella header: every public layer of libkvcache,
 * and the version macros (kvcache/version.h, through util.h).  See
 * docs/design.md for the layers and their invariants.
 *
 * Building against the installed library:
 *     cc app.c $(pkg-config --cflags --libs kvcache)
 * or, in CMake:
 *     find_package(kvcache 0.1 REQUIRED)
 *     target_link_libraries(app PRIVATE kvcache::kvcache)   (or kvcache::kvcache_static) */
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
#include "kvcache/gguf.h"
#include "kvcache/model.h"
#include "kvcache/tokenizer.h"
#include "kvcache/matmul.h"
#include "kvcache/engine.h"
#include "kvcache/chat.h"
#include "kvcache/llama2c.h"
#include "kvcache/tier.h"

#endif /* KVCACHE_KVCACHE_H */
