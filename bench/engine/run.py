#!/usr/bin/env python3
"""The engine benchmark: `kvcache run` against llama.cpp, side by side, in one run.

    python3 bench/engine/run.py            the table (about 20-25 minutes on a 2-core machine)
    python3 bench/engine/run.py --quick    smoke check: 58M q8_0 only, one repetition

What it does (bench/engine/README.md has the details and the definitions):
  1. builds kvcache (release: build/kvcache, build/bench_bw) and installs the comparator,
     llama.cpp's prebuilt CPU build through node-llama-cpp 3.21.1 (bench/llamacpp, `npm ci`);
  2. writes the random-weight Llama models with `kvcache model synth` (58M and 0.5B parameters,
     f32 / f16 / q8_0 / q4_0 / q4_K) into $KVC_BENCH_DIR (default /tmp/kvc-bench), reused;
  3. measures the machine's read bandwidth (bench_bw), then every row for both sides,
     alternating them (which side goes first alternates too), repetitions outermost so that a
     run cut short by --budget-min still has every row once;
  4. writes JSON (every measurement, raw) and a markdown table (medians, the ratio
     kvcache / llama.cpp, the weight-streaming bound and the share of it reached).

Token ids, never text: both sides get the same ids (random ids of the vocabulary from a fixed
seed, BOS first), so both process exactly the same tokens.  The kvcache side is `kvcache run
... --json`; where it is missing or fails, its cells say n/a and the error is in the JSON.
"""

import argparse
import datetime
import json
import os
import platform
import random
import re
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LLAMACPP = os.path.join(ROOT, "bench", "llamacpp")
VOCAB = os.path.join(ROOT, "tests", "data", "models", "vocab", "ggml-vocab-llama-spm.gguf")
NLC_VERSION = "3.21.1"

MODELS = {
    "58M": ["--dim", "512", "--layers", "8", "--heads", "8", "--kv-heads", "4", "--ff", "1536"],
    "0.5B": ["--dim", "1280", "--layers", "24", "--heads", "20", "--kv-heads", "4", "--ff", "3584"],
}
TYPES = ["f32", "f16", "q8_0", "q4_0", "q4_K"]
SYNTH_CTX = 32768  # the models' context: room for the 16K row and more
SEED = 1
BOS = 1


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("+", " ".join(shlex.quote(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kw)


# ---- setup ---------------------------------------------------------------------------------


def build(build_dir):
    run(["cmake", "--log-level=WARNING", "-S", ROOT, "-B", build_dir,
         "-DCMAKE_BUILD_TYPE=Release"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", build_dir, "-j%d" % (os.cpu_count() or 1), "--target",
         "kvcache_cli", "bench_bw"], stdout=subprocess.DEVNULL)


def install_comparator():
    pkg = os.path.join(LLAMACPP, "node_modules", "node-llama-cpp", "package.json")
    try:
        with open(pkg) as f:
            if json.load(f).get("version") == NLC_VERSION:
                return
    except (OSError, ValueError):
        pass
    # The lock file pins every package; --prefer-offline uses npm's cache where it can.
    run(["npm", "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=LLAMACPP)


def synth(kvcache, cache_dir, size, dtype):
    path = os.path.join(cache_dir, "llama-%s-%s-ctx%d-seed%d.gguf" % (size, dtype, SYNTH_CTX, SEED))
    if not os.path.exists(path):
        tmp = path + ".part"
        run([kvcache, "model", "synth", "--arch", "llama"] + MODELS[size] +
            ["--vocab", VOCAB, "--dtype", dtype, "--ctx", str(SYNTH_CTX), "--seed", str(SEED),
             "-o", tmp], stdout=subprocess.DEVNULL)
        os.replace(tmp, path)
    return path


TENSOR_RE = re.compile(r"^\s+(\S+)\s+(\S+)\s+\[([0-9, ]+)\]\s+(\d+) bytes\s*$")
KV_RE = re.compile(r"KV cache\s+(\d+) bytes per token in 16 bits")


def model_info(kvcache, path):
    """Weight bytes a generated token reads: every tensor once, except the token embedding
    table, of which only one row is read (unless it is also the output matrix: tied)."""
    out = subprocess.run([kvcache, "model", "info", path, "--tensors"], check=True,
                         capture_output=True, text=True).stdout
    tensors = {}
    for line in out.splitlines():
        m = TENSOR_RE.match(line)
        if m:
            shape = [int(x) for x in m.group(3).split(",")]
            tensors[m.group(1)] = {"type": m.group(2), "shape": shape, "bytes": int(m.group(4))}
    kv = KV_RE.search(out)
    if not tensors or not kv:
        raise RuntimeError("kvcache model info %s: no tensor list or KV line" % path)
    total = sum(t["bytes"] for t in tensors.values())
    emb = tensors.get("token_embd.weight")
    tied = "output.weight" not in tensors
    per_token = total
    if emb and not tied:
        per_token = total - emb["bytes"] + emb["bytes"] // emb["shape"][-1]
    vocab = emb["shape"][-1] if emb else None
    params = sum(_prod(t["shape"]) for t in tensors.values())
    return {"tensor_bytes": total, "weight_bytes_per_token": per_token, "tied": tied,
            "kv_bytes_per_token_16bit": int(kv.group(1)), "vocab": vocab, "params": params}


def _prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def bandwidth(bench_bw, quick):
    out = subprocess.run([bench_bw] + (["--quick"] if quick else []), check=True,
                         capture_output=True, text=True).stdout
    res = json.loads(out)
    res["by_threads"] = {r["threads"]: r["gb_s"] * 1e9 for r in res["results"]}
    return res


# ---- the rows --------------------------------------------------------------------------------


def ids(rng, n, vocab):
    return [BOS] + [rng.randrange(3, vocab) for _ in range(n - 1)]


def make_rows(args, vocab, big):
    """Every (row, threads) measured on one model; each row has the prompts both sides get."""
    rng = random.Random(SEED)
    rows = []
    pp = ids(rng, 512, vocab)
    short = ids(rng, 8, vocab)
    threads = args.big_threads if (big and args.big_threads) else args.threads
    for t in threads:
        rows.append({"row": "pp512", "kind": "pp", "threads": t, "ids": pp, "n": 1})
    for t in threads:
        rows.append({"row": "tg128", "kind": "tg", "threads": t, "ids": short, "n": args.tg})
    return rows, rng


def detail_rows(args, vocab, rng, big):
    t = args.detail_threads or max(args.threads)
    rows = []
    for c in args.contexts:
        if big and c > args.big_ctx_max:
            continue
        # filling a long context is the expensive part: once per run
        rows.append({"row": "tg @%dK" % (c // 1024), "kind": "ctx", "threads": t,
                     "ids": ids(rng, c, vocab), "n": 32,
                     "max_reps": 1 if (big or c >= 16384) else None})
    for p in args.concurrent:
        prompts = [ids(rng, 8, vocab) for _ in range(p)]
        rows.append({"row": "agg x%d" % p, "kind": "agg", "threads": t, "prompts": prompts,
                     "n": args.agg_n_big if big else args.agg_n})
    if not big:
        common = ids(rng, 1024, vocab)
        rows.append({"row": "shared 8x1024+32", "kind": "shared", "threads": t,
                     "prompts": [common] * 8, "n": 32})
        for c in args.nocache:
            rows.append({"row": "no-cache @%d" % c, "kind": "nocache", "threads": t,
                         "ids": ids(rng, c, vocab), "n": 8})
    return rows


# ---- llama.cpp's side: one node process per model, jobs as JSON lines ----------------------


class Llama:
    """One node worker per model; a job that takes longer than the timeout kills the worker
    (the next job starts another)."""

    def __init__(self, model, timeout):
        self.model, self.timeout, self.p = model, timeout, None

    def _start(self):
        self.p = subprocess.Popen(["node", "bench.mjs", "--serve", self.model], cwd=LLAMACPP,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def job(self, job):
        if self.p is None or self.p.poll() is not None:
            self._start()
        self.p.stdin.write(json.dumps(job) + "\n")
        self.p.stdin.flush()
        ready, _, _ = select.select([self.p.stdout], [], [], self.timeout)
        if not ready:
            self.p.kill()
            self.p.wait()
            self.p = None
            return {"error": "timeout after %d s" % self.timeout}
        line = self.p.stdout.readline()
        if not line:
            return {"error": "node exited (%s)" % self.p.poll()}
        return json.loads(line)

    def close(self):
        if self.p is None:
            return
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a hung worker must not stop the run
            self.p.kill()


def llama_measure(ll, row, fa):
    k = row["kind"]
    base = {"threads": row["threads"], "flash_attention": fa}
    if k == "pp":
        r = ll.job(dict(base, mode="pp", ids=row["ids"]))
        return r, r.get("tok_s")
    if k in ("tg", "ctx"):
        r = ll.job(dict(base, mode=k, ids=row["ids"], n=row["n"]))
        return r, r.get("tok_s")
    if k == "agg":
        r = ll.job(dict(base, mode="agg", prompts=row["prompts"], n=row["n"]))
        return r, r.get("decode_tok_s")
    if k == "shared":
        r = ll.job(dict(base, mode="shared", prompts=row["prompts"], n=row["n"], share=False))
        return r, r.get("wall_s")
    return None, None


def llama_decode_only(ll, row, fa):
    """llama.cpp's batched decode of the same shape with no sampling (llama-bench's tg): what
    its side would reach if node-llama-cpp's per-token sampling round trip cost nothing."""
    prompts = row["prompts"] if "prompts" in row else [row["ids"]]
    r = ll.job({"threads": row["threads"], "flash_attention": fa, "mode": "agg_decode",
                "prompts": prompts, "n": row["n"]})
    return r, r.get("decode_tok_s")


def llama_shared_copy(ll, row, fa):
    r = ll.job({"threads": row["threads"], "flash_attention": fa, "mode": "shared",
                "prompts": row["prompts"], "n": row["n"], "share": True})
    return r, r.get("wall_s")


# ---- kvcache's side: `kvcache run --json` ----------------------------------------------------


def kvcache_available(kvcache):
    try:
        r = subprocess.run([kvcache, "run", "--help"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        return False, str(e)
    if r.returncode != 0:
        last = (r.stderr or r.stdout).strip().splitlines()[-1:]
        return False, last[0] if last else "exit %d" % r.returncode
    return True, None


def kvcache_run(kvcache, model, row, workdir, timeout, no_cache=False):
    k = row["kind"]
    t = row["threads"]
    # --ignore-eos: llama.cpp's side does not stop at the end-of-sequence token either
    cmd = [kvcache, "run", "--model", model, "--threads", str(t), "--json", "--ignore-eos"]
    if k in ("pp", "tg", "nocache"):
        ctx = len(row["ids"]) + row["n"] + 16
        cmd += ["--prompt-ids", " ".join(map(str, row["ids"])), "-n", str(row["n"])]
    else:
        prompts = row["prompts"] if "prompts" in row else [row["ids"]]
        path = os.path.join(workdir, "prompts-%s.jsonl" % re.sub(r"\W+", "_", row["row"]))
        with open(path, "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt_ids": p, "n": row["n"]}) + "\n")
        # --ctx is per request (prompt + output); the pool defaults to room for them all
        ctx = max(len(p) for p in prompts) + row["n"] + 16
        cmd += ["--prompts", path, "-n", str(row["n"])]
    cmd += ["--ctx", str(ctx)]
    if no_cache:
        cmd.append("--no-kv-cache")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timeout after %d s" % timeout, "cmd": _show(cmd)}, None
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        return {"error": "exit %d: %s" % (p.returncode, p.stderr.strip()[-500:]),
                "cmd": _show(cmd)}, None
    reqs, summary = [], None
    for line in p.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            o = json.loads(line)
        except ValueError:
            continue
        if o.get("summary") is True:
            summary = o
        else:
            reqs.append(o)
    r = {"process_wall_s": wall, "requests": reqs, "summary": summary, "cmd": _show(cmd)}
    if not reqs:
        r["error"] = "no request objects in the --json output"
        return r, None
    short = [q.get("completion_tokens") for q in reqs
             if (q.get("completion_tokens") or 0) < row["n"]]
    if short:  # stopped early (an end-of-sequence token): fewer tokens timed than asked
        r["short"] = short
    if k == "pp":
        v = (summary or {}).get("prefill_tokens_per_s")
        if v is None and reqs[0].get("ttft_ms"):
            v = reqs[0]["prompt_tokens"] / (reqs[0]["ttft_ms"] / 1000)
        return r, v
    if k in ("tg", "ctx", "nocache"):
        tp = reqs[0].get("tpot_ms")
        return r, (1000.0 / tp) if tp else None
    if k == "agg":
        return r, (summary or {}).get("decode_tokens_per_s")
    if k == "shared":
        # the engine's own wall time (the summary's wall_s); failing that, all requests arrive
        # at once: the last one's first token plus its decode
        ends = [q["ttft_ms"] + q["tpot_ms"] * max(0, q["completion_tokens"] - 1)
                for q in reqs if q.get("ttft_ms") is not None and q.get("tpot_ms") is not None]
        r["json_wall_s"] = max(ends) / 1000 if len(ends) == len(reqs) else None
        v = (summary or {}).get("wall_s")
        return r, v if v is not None else (r["json_wall_s"] or wall)
    return r, None


def _show(cmd):
    # the id lists make the commands long: show them shortened
    return " ".join(shlex.quote(c if len(c) < 120 else c[:60] + "...") for c in cmd)


# ---- bounds and the table -----------------------------------------------------------------


def context_of(row):
    """Mean number of tokens in the context while the row's tokens are generated."""
    if row["kind"] in ("tg", "ctx"):
        return len(row["ids"]) + row["n"] / 2
    if row["kind"] == "agg":
        return len(row["prompts"][0]) + row["n"] / 2
    return None


def bound(row, info, bw):
    """Weight-streaming bound, tokens/s: a step reads every weight once (one embedding row per
    token) and each sequence's keys and values (16-bit) once, at the machine's read bandwidth
    for the row's thread count.  For N concurrent sequences a step yields N tokens."""
    if row["kind"] not in ("tg", "ctx", "agg") or bw is None:
        return None, None
    seqs = len(row["prompts"]) if row["kind"] == "agg" else 1
    kv = info["kv_bytes_per_token_16bit"] * context_of(row) * seqs
    w = info["weight_bytes_per_token"]
    return seqs * bw / (w + kv), seqs * bw / w


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(v, digits=1):
    if v is None:
        return "n/a"
    if v >= 100:
        return "%.0f" % v
    if v >= 10:
        return "%.1f" % v
    return "%.*f" % (max(digits, 2), v)


def agree(a, b):
    """How many leading output ids two greedy runs share."""
    n = 0
    for x, y in zip(a or [], b or []):
        if x != y:
            break
        n += 1
    return n


def table(results, bw, command):
    head = ("| model | type | row | threads | kvcache | llama.cpp | ratio | bound | % of bound "
            "| llama.cpp decode only |\n"
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
    lines = []
    for c in results["cells"]:
        row = c["row"]
        kv, ll = median(c["kvcache"]), median(c["llama"])
        if c["kind"] == "shared_copy":  # kvcache's side is the shared row's (no flag to share)
            kv = median(next(d for d in results["cells"] if d["model"] == c["model"] and
                             d["type"] == c["type"] and d["kind"] == "shared")["kvcache"])
        time_row = row in ("shared 8x1024+32", "shared 8x1024+32 (llama.cpp state copy)")
        unit = " (s)" if time_row else ""
        ratio = None
        if kv and ll:
            ratio = ll / kv if time_row else kv / ll
        b = c.get("bound")
        pct = "%.0f%%" % (100 * kv / b) if (kv and b) else ("n/a" if b else "")
        no_llama = c["kind"] in ("nocache", "cached")
        llcol = "-" if no_llama else fmt(ll)
        short = any(r.get("short") for r in c["kvcache_runs"])
        c["kvcache_median"], c["llama_median"], c["ratio"] = kv, ll, ratio
        c["kvcache_pct_of_bound"] = 100 * kv / b if (kv and b) else None
        c["llama_pct_of_bound"] = 100 * ll / b if (ll and b) else None
        do = median(c["decode_only"]) if c.get("decode_only") else None
        c["llama_decode_only_median"] = do
        lines.append("| %s | %s | %s%s | %d | %s | %s | %s | %s | %s | %s |" % (
            c["model"], c["type"], row, unit, c["threads"], fmt(kv) + ("*" if short else ""), llcol,
            ("%.2fx" % ratio) if ratio else ("-" if no_llama else "n/a"),
            fmt(b) if b else "", pct if b else "", fmt(do) if do else ""))
    bws = ", ".join("%d thread%s %.1f GB/s" % (t, "s" if t > 1 else "", v / 1e9)
                    for t, v in sorted(bw["by_threads"].items()))
    notes = [
        "",
        "Tokens/s unless marked (s); ratio = kvcache / llama.cpp tokens/s (for rows in seconds, "
        "llama.cpp time / kvcache time), so above 1.00x kvcache is faster.  Medians of %s "
        "alternating runs (the JSON has every run).  Bound: the weight-streaming bound, read "
        "bandwidth / (weight bytes + 16-bit KV bytes read per generated token); read bandwidth "
        "(bench_bw, the higher of its runs at the start and the end): %s." % (
            results["reps_done"] or "1 (a repetition still running)", bws),
        "",
        "Load average (1 min) while measuring: %s; the machine's other work shares its cores, "
        "which hurts the 2-thread rows most." % _load_range(results),
        "",
        "llama.cpp decode only (%s rows): llama.cpp's batched decode of the same shape with no "
        "sampling, as llama-bench times it; node-llama-cpp samples each token through an async "
        "round trip (a thread hop each way), which the llama.cpp column includes, as kvcache's "
        "includes its sampling." % "/".join(sorted(set(c["type"] for c in results["cells"]
                                                       if c.get("decode_only") is not None)) or "no"),
        "",
        "Reproduce: `%s`" % command,
    ]
    agreed = ["%s %s %s t%d: %d/%d" % (c["model"], c["type"], c["row"], c["threads"],
                                        c["greedy_ids_agree"], c["greedy_ids_of"])
              for c in results["cells"] if "greedy_ids_agree" in c]
    if agreed:
        notes[-1:-1] = ["Greedy output ids, kvcache against llama.cpp on the same tokens (leading "
                        "ids that agree / generated): %s." % "; ".join(agreed), ""]
    if any(r.get("short") for c in results["cells"] for r in c["kvcache_runs"]):
        notes[-1:-1] = ["\\* kvcache stopped some requests early (an end-of-sequence token), so "
                        "fewer tokens were timed than asked (the JSON has the counts).", ""]
    if results.get("skipped"):
        notes[-1:-1] = ["Not measured (past --deadline-min): %s." % "; ".join(results["skipped"]),
                        ""]
    if not results.get("kvcache_available"):
        notes[-1:-1] = ["kvcache's side: n/a (`kvcache run` is not available: %s)." %
                        results.get("kvcache_error"), ""]
    return head + "\n".join(lines) + "\n" + "\n".join(notes) + "\n"


# ---- main ----------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke check: 58M q8_0 only, one repetition, no 16K row, no x32 row")
    ap.add_argument("--models", help="default 58M,0.5B")
    ap.add_argument("--types", help="default " + ",".join(TYPES))
    ap.add_argument("--detail-types",
                    help="types that get the context, concurrency, shared-prefix and no-cache "
                         "rows (default q8_0)")
    ap.add_argument("--reps", type=int, help="default 3")
    ap.add_argument("--budget-min", type=float, default=25.0,
                    help="start no further repetition once the run has taken this long")
    ap.add_argument("--rows", help="only the rows whose name matches this regular expression")
    ap.add_argument("--deadline-min", type=float,
                    help="measure nothing more after this many minutes (default budget + 10); "
                         "the cells left out are listed in the JSON")
    ap.add_argument("--list", action="store_true", help="print the cells and exit")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--big-threads", help="thread counts of the 0.5B model's pp and tg rows "
                                          "(default: --threads)")
    ap.add_argument("--detail-threads", type=int,
                    help="threads of the context, concurrency, shared and no-cache rows "
                         "(default: the most of --threads)")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--contexts", help="default 4096,16384")
    ap.add_argument("--big-ctx-max", type=int, default=4096,
                    help="longest context row for the 0.5B model (default 4096: 16K takes too long)")
    ap.add_argument("--concurrent", help="default 8,32")
    ap.add_argument("--agg-n", type=int, default=64)
    ap.add_argument("--agg-n-big", type=int, default=16,
                    help="tokens per sequence in the 0.5B model's concurrency rows")
    ap.add_argument("--nocache", default="64,128,256,512")
    ap.add_argument("--no-big-detail", action="store_true",
                    help="no context or concurrency rows for the 0.5B model")
    ap.add_argument("--flash-attention", default="true", choices=["true", "false", "auto"],
                    help="llama.cpp's flash attention (default true)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per measurement of either side")
    ap.add_argument("--dir", default=os.environ.get("KVC_BENCH_DIR", "/tmp/kvc-bench"))
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--kvcache-run", help="the binary whose `run` is measured (default: the "
                                          "build's kvcache; synth and info always use it)")
    ap.add_argument("--out", help="output prefix (default DIR/results/engine-TIMESTAMP)")
    args = ap.parse_args()

    defaults = {"models": "58M,0.5B", "types": ",".join(TYPES), "detail_types": "q8_0",
                "reps": 3, "contexts": "4096,16384", "concurrent": "8,32"}
    if args.quick:
        defaults.update(models="58M", types="q8_0", reps=1, contexts="4096", concurrent="8")
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.models = args.models.split(",")
    args.types = args.types.split(",")
    args.detail_types = args.detail_types.split(",")
    args.threads = [int(x) for x in args.threads.split(",")]
    args.big_threads = [int(x) for x in args.big_threads.split(",")] if args.big_threads else None
    args.contexts = [int(x) for x in args.contexts.split(",") if x]
    args.concurrent = [int(x) for x in args.concurrent.split(",") if x]
    args.nocache = [int(x) for x in args.nocache.split(",") if x]
    fa = {"true": True, "false": False, "auto": "auto"}[args.flash_attention]
    command = "python3 bench/engine/run.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    start = time.time()
    os.makedirs(args.dir, exist_ok=True)
    if not args.no_build:
        build(args.build_dir)
    install_comparator()
    kvcache = os.path.join(args.build_dir, "kvcache")
    kvrun = args.kvcache_run or kvcache
    kv_ok, kv_why = kvcache_available(kvrun)
    if not kv_ok:
        log("kvcache run is not available (%s): its cells will say n/a" % kv_why)

    models = []
    for size in args.models:
        for dtype in args.types:
            path = synth(kvcache, args.dir, size, dtype)
            models.append({"model": size, "type": dtype, "path": path,
                           "info": model_info(kvcache, path)})

    bw = ({"by_threads": {}} if args.list else
          bandwidth(os.path.join(args.build_dir, "bench_bw"), args.quick))
    log("read bandwidth:", {t: "%.1f GB/s" % (v / 1e9) for t, v in bw["by_threads"].items()})

    # every cell: one (model, type, row, threads), with a list of measurements per side
    cells = []
    plans = []
    for m in models:
        vocab = m["info"]["vocab"]
        big = m["model"] != "58M"
        rows, rng = make_rows(args, vocab, big)
        if m["type"] in args.detail_types and not (big and args.no_big_detail):
            rows += detail_rows(args, vocab, rng, big)
        if args.rows:
            rows = [r for r in rows if re.search(args.rows, r["row"])]
        mc = []
        for r in rows:
            b, bw_only = bound(r, m["info"], bw["by_threads"].get(r["threads"]))
            c = {"model": m["model"], "type": m["type"], "row": r["row"], "kind": r["kind"],
                 "threads": r["threads"], "bound": b, "bound_weights_only": bw_only,
                 "kvcache": [], "llama": [], "kvcache_runs": [], "llama_runs": []}
            if r["kind"] in ("tg", "agg") and m["type"] in args.detail_types:
                c["decode_only"], c["decode_only_runs"] = [], []
            cells.append(c)
            mc.append((r, c))
            if r["kind"] == "shared":
                c2 = dict(c, row=r["row"] + " (llama.cpp state copy)", kind="shared_copy",
                          kvcache=[], llama=[], kvcache_runs=[], llama_runs=[])
                cells.append(c2)
                mc.append((dict(r, kind="shared_copy"), c2))
            if r["kind"] == "nocache":
                c2 = dict(c, row=r["row"].replace("no-cache", "with cache"), kind="cached",
                          kvcache=[], llama=[], kvcache_runs=[], llama_runs=[])
                cells.append(c2)
                mc.append((dict(r, kind="cached"), c2))
        plans.append((m, mc))

    if args.list:
        for c in cells:
            print("%-5s %-5s %-45s t%d" % (c["model"], c["type"], c["row"], c["threads"]))
        print("%d cells" % len(cells))
        return
    results = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": command, "machine": {"cpu": _cpu(), "cores": os.cpu_count(),
                                               "platform": platform.platform()},
               "kvcache_rev": _git_rev(), "kvcache_available": kv_ok, "kvcache_error": kv_why,
               "bandwidth": bw, "models": models, "cells": cells, "reps_done": 0,
               "flash_attention": fa}
    out = args.out or os.path.join(args.dir, "results", "engine-" +
                                   datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)

    workdir = tempfile.mkdtemp(prefix="kvc-bench-")
    try:
        _measure_all(args, plans, results, out, bw, command, start, fa, kvrun, kv_ok, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    md = _write(out, results, bw, command)
    print(md)
    log("wrote %s.json and %s.md" % (out, out))


def _measure_all(args, plans, results, out, bw, command, start, fa, kvrun, kv_ok, workdir):
    # Phases: the repetitions of the ordinary rows, then the rows measured once (long contexts:
    # filling the context is most of their time), so that every repetition costs the same and
    # the budget can stop between them.
    phases = [(rep, False) for rep in range(args.reps)] + [(0, True)]
    rep_times = []
    deadline = start + 60 * (args.deadline_min or args.budget_min + 10)
    results["skipped"] = []
    for rep, once in phases:
        t_rep = time.time()
        elapsed = (t_rep - start) / 60
        if not once and rep and elapsed + rep_times[-1] / 60 > args.budget_min:
            log("budget: %.1f min used, a repetition takes %.1f: no repetition %d" %
                (elapsed, rep_times[-1] / 60, rep + 1))
            continue
        for m, mc in plans:
            todo = [(i, r, c) for i, (r, c) in enumerate(mc) if bool(r.get("max_reps")) == once]
            if not todo:
                continue
            ll = Llama(m["path"], args.timeout)
            if "llama_info" not in results:
                results["llama_info"] = ll.job({"threads": 1, "mode": "info"})
            try:
                for i, r, c in todo:
                    if time.time() > deadline:
                        results["skipped"].append("%s %s %s t%d rep %d" % (
                            m["model"], m["type"], c["row"], r["threads"], rep + 1))
                        continue
                    measure(m, r, c, rep, i, ll, fa, kvrun, kv_ok, workdir, args.timeout)
                    _write(out, results, bw, command)  # a run cut short keeps what it has
            finally:
                ll.close()
            _write(out, results, bw, command)
        if not once:
            rep_times.append(time.time() - t_rep)
            results["reps_done"] = rep + 1
    if results["skipped"]:
        log("past the deadline, not measured:", "; ".join(results["skipped"]))
    # the bandwidth again: other work on the machine lowers a measurement, never raises it, so
    # the bounds use the higher of the two
    bw2 = bandwidth(os.path.join(args.build_dir, "bench_bw"), args.quick)
    bw["end"] = bw2
    bw["by_threads"] = {t: max(v, bw2["by_threads"].get(t, 0)) for t, v in bw["by_threads"].items()}
    for m, mc in plans:
        for r, c in mc:
            c["bound"], c["bound_weights_only"] = bound(r, m["info"],
                                                         bw["by_threads"].get(r["threads"]))
    log("read bandwidth at the end:",
        {t: "%.1f GB/s" % (v / 1e9) for t, v in bw2["by_threads"].items()})
    results["wall_min"] = (time.time() - start) / 60


def measure(m, r, c, rep, i, ll, fa, kvrun, kv_ok, workdir, timeout):
    """One repetition of one cell: both sides, the first one alternating."""
    llama_first = (rep + i) % 2 == 0
    for side in (("llama", "kvcache") if llama_first else ("kvcache", "llama")):
        la = os.getloadavg()[0]
        if side == "llama":
            if r["kind"] in ("nocache", "cached"):
                continue
            if r["kind"] == "shared_copy":
                raw, v = llama_shared_copy(ll, r, fa)
            else:
                raw, v = llama_measure(ll, r, fa)
            if c.get("decode_only") is not None:
                raw2, v2 = llama_decode_only(ll, r, fa)
                c["decode_only"].append(v2)
                c["decode_only_runs"].append(dict(raw2, rep=rep))
        else:
            if r["kind"] == "shared_copy" or not kv_ok:
                continue
            kind = "tg" if r["kind"] == "cached" else r["kind"]
            raw, v = kvcache_run(kvrun, m["path"], dict(r, kind=kind), workdir, timeout,
                                 no_cache=r["kind"] == "nocache")
        raw = dict(raw or {}, rep=rep, loadavg=la)
        c[side].append(v)
        c[side + "_runs"].append(raw)
        log("%s %s %-28s t%d %-7s %s%s" % (
            m["model"], m["type"], c["row"], r["threads"], side, fmt(v),
            ("  (" + raw["error"][:200] + ")") if raw.get("error") else ""))
    _agreement(c)


def _agreement(c):
    """Greedy ids of the two sides on the same tokens: how many leading ids agree."""
    if c["kind"] not in ("tg", "ctx") or not c["llama_runs"] or not c["kvcache_runs"]:
        return
    ll = c["llama_runs"][-1].get("output_ids")
    reqs = c["kvcache_runs"][-1].get("requests") or [{}]
    kv = reqs[0].get("output_ids")
    if ll is not None and kv is not None:
        c["greedy_ids_agree"] = agree(ll, kv)
        c["greedy_ids_of"] = min(len(ll), len(kv))


def _load_range(results):
    la = [r.get("loadavg") for c in results["cells"] for side in ("kvcache_runs", "llama_runs")
          for r in c[side] if r.get("loadavg") is not None]
    return "%.1f to %.1f (median %.1f)" % (min(la), max(la), statistics.median(la)) if la else "n/a"


def _write(out, results, bw, command):
    with open(out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    md = table(results, bw, command)
    with open(out + ".md", "w") as f:
        f.write(md)
    return md


def _cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _git_rev():
    try:
        return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return None


if __name__ == "__main__":
    main()
