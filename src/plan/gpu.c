/* gpu.c - the plan layer's hardware descriptor: GPU presets, each value with
 * its public source, and the parsing of sizes and rates with units.
 *
 * Memory is what the runtime reports as the device's total (cudaMemGetInfo,
 * which PyTorch prints as "total capacity" and vLLM as total_gpu_memory): the
 * number an engine multiplies by gpu_memory_utilization.  It is below both the
 * datasheet figure and nvidia-smi's total, and it varies a little between
 * driver versions; pass --gpu-memory to use the figure your machine prints.
 * FLOP rates are dense (datasheets print sparse rates, twice these); link
 * rates are per direction (datasheets print both directions added).
 */
#include "plan_int.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define GIB_CENTI(x) ((uint64_t)(x)*KVC__GIB / 100) /* x hundredths of a GiB */
#define TB           1e12
#define GB           1e9
#define TFLOPS       1e12

static const struct {
    const char *aliases[3];
    kvc_plan_gpu_t gpu;
} gpu_presets[] = {
    {{"a100-80gb-sxm", "a100", "a100-sxm"},
     {.name = "A100-80GB SXM",
      /* 79.15 GiB: PyTorch's "total capacity of 79.15 GiB" on an A100 80GB whose
       * nvidia-smi total reads 81920MiB (nvidia-smi totals also listed in
       * github.com/modal-labs/modal-client/pull/2797). */
      .memory_bytes = GIB_CENTI(7915),
      /* NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf),
       * A100 80GB SXM column: 2,039 GB/s HBM2e; BF16 Tensor Core 312 TFLOPS (624 with
       * sparsity); no FP8; NVLink 600 GB/s (both directions); PCIe Gen4 64 GB/s. */
      .hbm_bytes_per_s = 2039 * GB,
      .bf16_flops = 312 * TFLOPS,
      .fp8_flops = 0,
      /* NVIDIA A100 Tensor Core GPU Architecture whitepaper: 40 MB L2. */
      .l2_bytes = 40 * KVC__MIB,
      .interconnect_bytes_per_s = 300 * GB,
      .pcie_bytes_per_s = 32 * GB}},
    {{"a100-40gb", "a100-40gb-sxm", "a100-sxm4-40gb"},
     {.name = "A100-40GB SXM",
      /* 39.59 GiB: PyTorch's "39.59 GiB total capacity" in public A100-40GB out-of-memory
       * logs (nvidia-smi reads 40960MiB). */
      .memory_bytes = GIB_CENTI(3959),
      /* NVIDIA A100 datasheet, A100 40GB SXM column: 1,555 GB/s HBM2; BF16 Tensor Core
       * 312 TFLOPS dense; no FP8; NVLink 600 GB/s (both directions); PCIe Gen4 64 GB/s
       * (both directions). */
      .hbm_bytes_per_s = 1555 * GB,
      .bf16_flops = 312 * TFLOPS,
      .fp8_flops = 0,
      /* the same GA100 die as the 80 GB part: 40 MB L2 */
      .l2_bytes = 40 * KVC__MIB,
      .interconnect_bytes_per_s = 300 * GB,
      .pcie_bytes_per_s = 32 * GB}},
    {{"h100-sxm", "h100", "h100-sxm5"},
     {.name = "H100 SXM",
      /* 79.22 GiB: vLLM's "total_gpu_memory (79.22GiB)" on H100-80G
       * (github.com/vllm-project/vllm/pull/12126 and pull/10511); nvidia-smi reads
       * 81559MiB (github.com/NVIDIA/nccl/issues/1264). */
      .memory_bytes = GIB_CENTI(7922),
      /* NVIDIA H100 datasheet, H100 SXM column: 3.35 TB/s HBM3; BF16 1,979 TFLOPS
       * and FP8 3,958 TFLOPS with sparsity (989.5 and 1,979 dense); NVLink 900 GB/s;
       * PCIe Gen5 128 GB/s (both directions). */
      .hbm_bytes_per_s = 3.35 * TB,
      .bf16_flops = 989.5 * TFLOPS,
      .fp8_flops = 1979 * TFLOPS,
      /* NVIDIA H100 Tensor Core GPU Architecture whitepaper: 50 MB L2 on H100 SXM5. */
      .l2_bytes = 50 * KVC__MIB,
      .interconnect_bytes_per_s = 450 * GB,
      .pcie_bytes_per_s = 64 * GB}},
    {{"h100-pcie", NULL, NULL},
     {.name = "H100 PCIe",
      /* nvidia-smi reads 81559MiB, the same total as the SXM part (e.g. nvidia-smi
       * listings of "NVIDIA H100 PCIe ... / 81559MiB" in public repositories), so the
       * runtime figure of the SXM part is used: 79.22 GiB. */
      .memory_bytes = GIB_CENTI(7922),
      /* NVIDIA H100 datasheet, H100 PCIe column: 2 TB/s HBM2e; BF16 1,513 TFLOPS and
       * FP8 3,026 TFLOPS with sparsity (756 and 1,513 dense); NVLink bridge 600 GB/s;
       * PCIe Gen5 128 GB/s (both directions). */
      .hbm_bytes_per_s = 2.0 * TB,
      .bf16_flops = 756 * TFLOPS,
      .fp8_flops = 1513 * TFLOPS,
      /* NVIDIA H100 whitepaper: 50 MB L2 on the PCIe part as well. */
      .l2_bytes = 50 * KVC__MIB,
      .interconnect_bytes_per_s = 300 * GB,
      .pcie_bytes_per_s = 64 * GB}},
    {{"h200", "h200-sxm", NULL},
     {.name = "H200",
      /* 139.80 GiB: PyTorch's "total capacity of 139.80 GiB" in public H200 OOM logs;
       * nvidia-smi reads 143771MiB; the datasheet says 141 GB. */
      .memory_bytes = GIB_CENTI(13980),
      /* NVIDIA H200 datasheet (H200 SXM): 4.8 TB/s HBM3e; BF16 1,979 TFLOPS and FP8
       * 3,958 TFLOPS with sparsity (989.5 and 1,979 dense, the H100's); NVLink
       * 900 GB/s; PCIe Gen5 128 GB/s (both directions). */
      .hbm_bytes_per_s = 4.8 * TB,
      .bf16_flops = 989.5 * TFLOPS,
      .fp8_flops = 1979 * TFLOPS,
      /* The same GH100 die and L2 as the H100 SXM: 50 MB. */
      .l2_bytes = 50 * KVC__MIB,
      .interconnect_bytes_per_s = 450 * GB,
      .pcie_bytes_per_s = 64 * GB}},
    {{"b200", "hgx-b200", NULL},
     {.name = "B200",
      /* 178.35 GiB: PyTorch's "total capacity of 178.35 GiB" in public B200 OOM logs;
       * nvidia-smi reads 183359MiB; NVIDIA's HGX page says 180 GB. */
      .memory_bytes = GIB_CENTI(17835),
      /* nvidia.com/en-us/data-center/hgx (HGX B200, per GPU): 7.7 TB/s HBM3e; FP16/BF16
       * 4.5 PFLOPS and FP8 9 PFLOPS with sparsity (2.25 and 4.5 dense); NVLink 5
       * 1.8 TB/s; PCIe Gen5 128 GB/s (both directions). */
      .hbm_bytes_per_s = 7.7 * TB,
      .bf16_flops = 2250 * TFLOPS,
      .fp8_flops = 4500 * TFLOPS,
      /* chipsandcheese.com "Nvidia's B200: Keeping the CUDA Juggernaut Rolling":
       * 126 MB of L2 split across the two dies. */
      .l2_bytes = 126 * KVC__MIB,
      .interconnect_bytes_per_s = 900 * GB,
      .pcie_bytes_per_s = 64 * GB}},
    {{"l40s", NULL, NULL},
     {.name = "L40S",
      /* 44.40 GiB: PyTorch's "total capacity of 44.40 GiB" on an L40 (the same 48 GB
       * GDDR6 board, github.com/NVlabs/Eagle/issues/68); nvidia-smi reads 46068MiB on
       * an L40S (github.com/modal-labs/modal-client/pull/2797). */
      .memory_bytes = GIB_CENTI(4440),
      /* NVIDIA L40S datasheet: 864 GB/s GDDR6; BF16 362.05 TFLOPS (733 sparse); FP8
       * 733 TFLOPS (1,466 sparse); PCIe Gen4 x16 64 GB/s (both directions); no NVLink. */
      .hbm_bytes_per_s = 864 * GB,
      .bf16_flops = 362.05 * TFLOPS,
      .fp8_flops = 733 * TFLOPS,
      /* AD102 with 142 SMs: 96 MiB of L2 (arXiv 2606.22588 measures 96 MiB on the L40,
       * the same chip configuration). */
      .l2_bytes = 96 * KVC__MIB,
      .interconnect_bytes_per_s = 0,
      .pcie_bytes_per_s = 32 * GB}},
    {{"mi300x", "mi300", NULL},
     {.name = "MI300X",
      /* rocminfo's GPU pool "Size: 201310208(0xbffc000) KB" = 196592 MiB = 191.98 GiB,
       * also PyTorch's "total capacity of 191.98 GiB" in public MI300X logs. */
      .memory_bytes = UINT64_C(201310208) * 1024,
      /* AMD Instinct MI300X data sheet: 5.3 TB/s HBM3; peak BF16 1,307.4 TFLOPS and
       * FP8 2,614.9 TFLOPS dense (twice with sparsity); 7 Infinity Fabric links,
       * 896 GB/s peak aggregate (both directions); PCIe Gen5 x16 128 GB/s. */
      .hbm_bytes_per_s = 5.3 * TB,
      .bf16_flops = 1307.4 * TFLOPS,
      .fp8_flops = 2614.9 * TFLOPS,
      /* CDNA 3 white paper: 4 MB L2 per XCD, 8 XCDs (the 256 MB Infinity Cache sits
       * behind it, in front of HBM). */
      .l2_bytes = 32 * KVC__MIB,
      .interconnect_bytes_per_s = 448 * GB,
      .pcie_bytes_per_s = 64 * GB}},
};

size_t kvc_plan_gpu_preset_count(void)
{
    return KVC_ARRAY_LEN(gpu_presets);
}

const char *kvc_plan_gpu_preset_name(size_t i)
{
    return i < KVC_ARRAY_LEN(gpu_presets) ? gpu_presets[i].aliases[0] : NULL;
}

int kvc_plan_gpu_preset(const char *name, kvc_plan_gpu_t *out)
{
    if (!out) return KVC_EINVAL;
    if (!name) return KVC_ENOENT;
    for (size_t i = 0; i < KVC_ARRAY_LEN(gpu_presets); i++)
        for (int a = 0; a < 3 && gpu_presets[i].aliases[a]; a++)
            if (!strcasecmp(name, gpu_presets[i].aliases[a]) ||
                !strcasecmp(name, gpu_presets[i].gpu.name)) {
                *out = gpu_presets[i].gpu;
                return 0;
            }
    return KVC_ENOENT;
}

int kvc_plan_gpu_check(const kvc_plan_gpu_t *g, char *msg, size_t len)
{
    if (!g) return kvc__msgf(KVC_EINVAL, msg, len, "no GPU");
    if (!g->memory_bytes) return kvc__msgf(KVC_EINVAL, msg, len, "the GPU's memory is zero");
    if (g->memory_bytes > KVC_PLAN_MAX_BYTES || g->l2_bytes > KVC_PLAN_MAX_BYTES)
        return kvc__msgf(KVC_EINVAL, msg, len,
                         "the GPU's memory %llu B (L2 %llu B) is out of range: at most %llu B",
                         (unsigned long long)g->memory_bytes, (unsigned long long)g->l2_bytes,
                         (unsigned long long)KVC_PLAN_MAX_BYTES);
    if (!(g->hbm_bytes_per_s > 0) || !isfinite(g->hbm_bytes_per_s))
        return kvc__msgf(KVC_EINVAL, msg, len, "the GPU's memory bandwidth must be positive");
    if (!(g->bf16_flops > 0) || !isfinite(g->bf16_flops))
        return kvc__msgf(KVC_EINVAL, msg, len, "the GPU's bf16 FLOP/s must be positive");
    if (!(g->fp8_flops >= 0) || !(g->pcie_bytes_per_s >= 0) || !(g->interconnect_bytes_per_s >= 0))
        return kvc__msgf(KVC_EINVAL, msg, len, "the GPU's rates cannot be negative");
    /* The comparisons are false for NaN, so NaN is refused above; these refuse inf too. */
    if (!(g->hbm_bytes_per_s <= KVC_PLAN_MAX_RATE) || !(g->pcie_bytes_per_s <= KVC_PLAN_MAX_RATE) ||
        !(g->interconnect_bytes_per_s <= KVC_PLAN_MAX_RATE))
        return kvc__msgf(KVC_EINVAL, msg, len, "the GPU's bandwidths must be at most %g B/s",
                         KVC_PLAN_MAX_RATE);
    if (!(g->bf16_flops <= KVC_PLAN_MAX_FLOPS) || !(g->fp8_flops <= KVC_PLAN_MAX_FLOPS))
        return kvc__msgf(KVC_EINVAL, msg, len, "the GPU's FLOP/s must be at most %g",
                         KVC_PLAN_MAX_FLOPS);
    return 0;
}

/* ---- units ----------------------------------------------------------------- */
typedef struct {
    const char *unit;
    double mult;
} unit_t;

/* Parse "<number>[ ]<unit>" with the unit from `units` (a bare number is
 * multiplied by `bare`) into *out.  Returns 0 or KVC_EINVAL. */
static int parse_with_units(const char *s, const unit_t *units, size_t n_units, double bare,
                            double *out)
{
    if (!s) return KVC_EINVAL;
    while (isspace((unsigned char)*s)) s++;
    if (!*s || *s == '-' || *s == '+') return KVC_EINVAL;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0) return KVC_EINVAL;
    while (isspace((unsigned char)*end)) end++;
    double mult = 0;
    if (!*end) {
        mult = bare;
    } else {
        for (size_t i = 0; i < n_units; i++)
            if (!strcasecmp(end, units[i].unit)) {
                mult = units[i].mult;
                break;
            }
    }
    if (mult == 0) return KVC_EINVAL;
    /* 1e300 is finite, 1e300 TB/s is not: the product is checked too. */
    const double product = v * mult;
    if (!isfinite(product)) return KVC_EINVAL;
    *out = product;
    return 0;
}

int kvc_plan_parse_bytes(const char *s, uint64_t *out)
{
    /* Units are case-insensitive and always bytes: "gb" is GB, never gigabits. */
    static const unit_t units[] = {
        {"B", 1},
        {"kB", 1e3},
        {"KB", 1e3},
        {"MB", 1e6},
        {"GB", 1e9},
        {"TB", 1e12},
        {"KiB", 1024.0},
        {"MiB", 1048576.0},
        {"GiB", 1073741824.0},
        {"TiB", 1099511627776.0},
    };
    double v;
    if (!out || parse_with_units(s, units, KVC_ARRAY_LEN(units), 1, &v)) return KVC_EINVAL;
    v = floor(v + 0.5);
    if (v >= 9223372036854775808.0) return KVC_EINVAL;
    *out = (uint64_t)v;
    return 0;
}

int kvc_plan_parse_rate(const char *s, double *out)
{
    static const unit_t units[] = {
        {"B/s", 1},           {"kB/s", 1e3},           {"MB/s", 1e6},
        {"GB/s", 1e9},        {"TB/s", 1e12},          {"KiB/s", 1024.0},
        {"MiB/s", 1048576.0}, {"GiB/s", 1073741824.0}, {"TiB/s", 1099511627776.0},
    };
    double v;
    if (!out || parse_with_units(s, units, KVC_ARRAY_LEN(units), 1e9, &v)) return KVC_EINVAL;
    *out = v;
    return 0;
}
