#!/usr/bin/env python3
"""bench/tier/run.py - what a KV tier is worth to `kvcache serve` on a multi-turn workload whose
working set is several times the pool, and the simulator's prediction of it.

    python3 bench/tier/run.py              # the default run (a few minutes)
    python3 bench/tier/run.py --quick      # smoke check

The workload: S chat sessions of T turns each, sent round-robin (turn k of every session,
then turn k+1 of every session), one request at a time, so that by the time a session comes
back its blocks have long been evicted from a pool sized at a fraction of the sessions'
total context.  Turn k's prompt is turn k-1's prompt, its reply and new user tokens (token
ids over streaming completions, return_token_ids: exactly what was generated is resent).

Configurations, each on a fresh server (and a fresh redis-server namespace):
  none         no tier: every evicted block is recomputed;
  host         --tier host:SIZE;
  disk         --tier disk:OUT/tier.bin:SIZE (its file in the page cache: what a recently
               written block costs; the device's own cost is bench_tier's "disk cold");
  redis        --tier redis://127.0.0.1:PORT/... (a redis-server started here);
  2x host      two replicas, each its own host tier; request i goes to replica i mod 2 (the
               simulator's routing), so a session's turns alternate between them;
  2x redis     two replicas sharing one Redis; the same routing.
Per configuration: TTFT p50 / p99, the prompt tokens recomputed (prompt - cached), the
cached tokens by source (usage.prompt_tokens_details.cached_tokens_by_tier) and, unless
--no-sim, `kvcache sim --profile` on the same requests with the same tiers (bandwidth and
round trip from the server's own estimates, /metrics kvcache_tier_*_estimate_*).

python3's standard library only; it reuses bench/serve/run.py's client and workload helpers.
"""
import argparse
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "serve"))
import run as serve_bench  # noqa: E402  (bench/serve/run.py: complete, pct, toks, gguf_config)

log = serve_bench.log
pct = serve_bench.pct


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Redis:
    def __init__(self, out):
        self.port = free_port()
        self.p = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no", "--maxmemory", "2gb"],
                                  stdout=open(os.path.join(out, "redis.log"), "w"),
                                  stderr=subprocess.STDOUT)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("redis-server did not start")

    def stop(self):
        self.p.terminate()
        self.p.wait(10)


def Server(args, extra):
    """bench/serve/run.py's server, this run's deployment (8 running requests, 512 tokens a
    step) and the tier flags."""
    args.max_num_seqs, args.max_num_batched_tokens = 8, 512
    return serve_bench.Server(args, True, extra)


def tier_flags(args, kind, redis, tag):
    if kind == "host":
        return ["--tier", "host:" + args.tier_size]
    if kind == "disk":
        path = os.path.join(args.out, "tier-%s.bin" % tag)
        if os.path.exists(path):
            os.remove(path)
        return ["--tier", "disk:%s:%s" % (path, args.tier_size)]
    if kind == "redis":
        return ["--tier", "redis://127.0.0.1:%d/b%s%d" % (redis.port, tag, os.getpid())]
    return []


def workload(args):
    rng = random.Random(args.seed)
    users = [[[1] + serve_bench.toks(rng, args.user - 1, args.vocab) if k == 0 else
              serve_bench.toks(rng, args.user, args.vocab) for k in range(args.turns)]
             for _ in range(args.sessions)]
    # request i (in the order sent) goes to replica i mod 2, the simulator's routing (--dp 2);
    # with an odd number of sessions a session's turns alternate between the replicas
    route = [[(k * args.sessions + s) % 2 for k in range(args.turns)] for s in range(args.sessions)]
    return users, route


def run_config(args, name, kind, replicas, users, route, redis):
    tag = re.sub(r"[^a-z0-9]", "", name)
    shared = tier_flags(args, kind, redis, tag) if kind == "redis" else None
    # redis replicas share one key prefix (the point of a shared tier); local tiers are each
    # replica's own
    srvs = [Server(args, shared if shared else tier_flags(args, kind, redis, tag + str(r)))
            for r in range(replicas)]
    res, trace, ids_all = [], [], {}
    t0 = time.monotonic()
    try:
        prompts = [[] for _ in range(args.sessions)]
        for k in range(args.turns):
            for s in range(args.sessions):
                prompts[s] = prompts[s] + users[s][k]
                srv = srvs[route[s][k] if replicas > 1 else 0]
                m, ids = serve_bench.complete(srv.port, prompts[s], args.output, t0)
                res.append(m)
                ids_all[(s, k)] = ids
                trace.append({"arrival_s": m["send_s"], "tokens": list(prompts[s]),
                              "output_tokens": ids, "conversation": s + 1, "turn": k,
                              "think_s": 0.0, "max_output": args.output,
                              "replica": route[s][k] if replicas > 1 else 0})
                prompts[s] = prompts[s] + ids
        mets = [srv.metrics() for srv in srvs]
    finally:
        for srv in srvs:
            srv.stop()
    n_prompt = sum(r["n_prompt"] for r in res)
    cached = sum(r["cached"] for r in res)
    ttft = [r["ttft_ms"] for r in res if r["ttft_ms"] is not None]
    # later turns only: turn 0 is recomputed everywhere and only dilutes the difference
    later = [r["ttft_ms"] for r, t in zip(res, trace) if t["turn"] > 0 and r["ttft_ms"] is not None]
    by_src = {}
    est = {}
    for mt in mets:
        for key, v in mt.items():
            m = re.match(r'kvcache_tier_fetched_blocks_total\{tier="([^"]+)"\}', key)
            if m:
                by_src[m.group(1)] = by_src.get(m.group(1), 0) + v * args.block_size
            m = re.match(r'kvcache_tier_(bandwidth_estimate_bytes_per_second|fetch_latency_estimate_seconds)\{tier="([^"]+)"\}', key)
            if m:
                est.setdefault(m.group(2), {}).setdefault(m.group(1), []).append(v)
    row = {"config": name, "tier": kind, "replicas": replicas, "requests": len(res),
           "prompt_tokens": n_prompt, "cached_tokens": cached,
           "recompute_tokens": n_prompt - cached, "fetched_tokens_by_tier": by_src,
           "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
           "later_ttft_p50_ms": pct(later, 50), "later_ttft_p99_ms": pct(later, 99),
           "estimates": {t: {k: sorted(v)[len(v) // 2] for k, v in d.items()} for t, d in est.items()},
           "outputs": [ids_all[(s, k)] for s in range(args.sessions) for k in range(args.turns)]}
    if args.profile and not args.no_sim:
        row["sim"] = sim(args, row, trace, kind, replicas, tag)
    log("%-9s TTFT p50 %7.2f p99 %7.2f ms (later turns p50 %7.2f)  recomputed %6d of %6d prompt tokens  fetched %s%s" % (
        name, row["ttft_p50_ms"], row["ttft_p99_ms"], row["later_ttft_p50_ms"], row["recompute_tokens"],
        n_prompt, by_src or "-", ("  | sim TTFT p50 %.2f recomputed %s" % (row["sim"]["ttft_p50_ms"], row["sim"]["recompute_tokens"]))
        if row.get("sim") else ""))
    return row


def sim(args, row, trace, kind, replicas, tag):
    """`kvcache sim --profile` on the same requests, the tier modelled with the bandwidth and
    round trip the server estimated as it ran."""
    path = os.path.join(args.out, "trace-%s.jsonl" % tag)
    t_first = min(r["arrival_s"] for r in trace)
    with open(path, "w") as f:
        f.write(json.dumps({"kvcache_workload": 1}) + "\n")
        for r in sorted(trace, key=lambda r: r["arrival_s"]):
            rec = {k: v for k, v in r.items() if k != "replica"}
            rec["arrival_s"] = round(r["arrival_s"] - t_first, 6)
            rec["output"] = len(r["output_tokens"])
            f.write(json.dumps(rec) + "\n")
    blocks = int(args.kv_blocks)
    cmd = [args.kvcache, "sim", "--model", args.model_config, "--gpu", "h100-sxm", "--quiet",
           "--json", "--workload", path, "--profile", args.profile, "--num-blocks", str(blocks),
           "--block-size", str(args.block_size), "--max-num-seqs", "8", "--max-model-len",
           str(max(args.ctx, 2048)), "--seed", "1", "--hold-shared-prefix"]  # open loop: the real run's send times
    if replicas > 1:
        cmd += ["--dp", str(replicas)]
    if kind != "none":
        e = row["estimates"].get(kind, {})
        bw = e.get("bandwidth_estimate_bytes_per_second") or 1e9
        rtt = e.get("fetch_latency_estimate_seconds") or 1e-4
        spec = {"host": "host:" + args.tier_size, "disk": "disk:sim.bin:" + args.tier_size,
                "redis": "redis://sim:6379"}[kind]
        cmd += ["--tier", "%s,bw=%.6gB/s,rtt=%.6gs" % (spec, bw, rtt)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        log("kvcache sim failed (%s): %s" % (" ".join(cmd), out.stderr.strip()[:300]))
        return None
    r = json.loads(out.stdout)
    fetched = sum(t.get("fetched_tokens", 0) for t in r.get("tiers") or [])
    return {"ttft_p50_ms": r["ttft_ms"]["p50"], "ttft_p99_ms": r["ttft_ms"].get("p99"),
            "prefix_hit_rate": r["prefix_hit_rate"], "fetched_tokens": fetched,
            "recompute_tokens": r["prompt_tokens"] - r["hit_tokens"], "cmd": " ".join(cmd)}


def table(rows):
    f = lambda x: "-" if x is None else ("%.1f" % x if x >= 10 else "%.2f" % x)
    L = ["| configuration | replicas | TTFT p50 / p99 (ms) | later turns TTFT p50 / p99 (ms) | prompt tokens recomputed | cached from the pool / tiers | sim: TTFT p50 / p99 (ms) | sim: recomputed / from tiers |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        tiers = sum(r["fetched_tokens_by_tier"].values())
        s = r.get("sim") or {}
        L.append("| %s | %d | %s / %s | %s / %s | %d of %d (%.0f%%) | %d / %d | %s / %s | %s / %s |" % (
            r["config"], r["replicas"], f(r["ttft_p50_ms"]), f(r["ttft_p99_ms"]),
            f(r["later_ttft_p50_ms"]), f(r["later_ttft_p99_ms"]), r["recompute_tokens"],
            r["prompt_tokens"], 100.0 * r["recompute_tokens"] / r["prompt_tokens"],
            max(0, r["cached_tokens"] - tiers), tiers, f(s.get("ttft_p50_ms")),
            f(s.get("ttft_p99_ms")), s.get("recompute_tokens", "-"), s.get("fetched_tokens", "-")))
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvcache", default=os.path.join(ROOT, "build", "kvcache"))
    ap.add_argument("--bench-profile", default=os.path.join(ROOT, "build", "bench_profile"))
    ap.add_argument("--model", help="a GGUF (default: the 58M bench model, written if missing)")
    ap.add_argument("--profile", help="a profile JSON for the simulator (default: measure one)")
    ap.add_argument("--no-sim", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.environ.get("KVC_BENCH_DIR", "/tmp/kvc-bench"), "tier"))
    ap.add_argument("--configs", default="none,host,disk,redis,2x host,2x redis")
    ap.add_argument("--sessions", type=int, default=9, help="odd: turns alternate replicas")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--user", type=int, default=96, help="new user tokens per turn")
    ap.add_argument("--output", type=int, default=16, help="output tokens per turn")
    ap.add_argument("--kv-memory", default="6MiB", help="the pool (a fraction of the working set)")
    ap.add_argument("--tier-size", default="512MiB")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--table", metavar="JSON", help="only print the table of a finished run")
    args = ap.parse_args()
    if args.table:
        print(table(json.load(open(args.table))["rows"]), end="")
        return
    if args.quick:
        args.sessions, args.turns, args.configs = 5, 3, "none,host,2x redis"
    os.makedirs(args.out, exist_ok=True)
    if not args.model:
        args.model = os.path.join(args.out, "llama-58M-q8_0.gguf")
        if not os.path.exists(args.model):
            subprocess.run([args.kvcache, "model", "synth", "--arch", "llama", "--vocab",
                            serve_bench.VOCAB_MODEL, "-o", args.model, "--dim", "512", "--layers",
                            "8", "--heads", "8", "--kv-heads", "4", "--ff", "1536", "--ctx", "4096",
                            "--dtype", "q8_0", "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    info = subprocess.run([args.kvcache, "model", "info", args.model], capture_output=True, text=True).stdout
    m = re.search(r"vocab (\d+)", info)
    args.vocab = int(m.group(1)) if m else 512
    # the simulator checks its deployment's typical request (1200 tokens) against the
    # context: give the config at least 2048 (the requests themselves stay under --ctx)
    cfg_args = argparse.Namespace(**vars(args))
    cfg_args.ctx = max(args.ctx, 2048)
    args.model_config = serve_bench.gguf_config(cfg_args)
    if not args.profile and not args.no_sim:
        args.profile = os.path.join(args.out, "profile.json")
        if not os.path.exists(args.profile):
            log("measuring the profile (bench_profile) ...")
            subprocess.run([args.bench_profile, "--model", args.model, "--threads", str(args.threads),
                            "--block-size", str(args.block_size), "--max-num-seqs", "16",
                            "--max-num-batched-tokens", "512", "--ctx", "2048", "--tokens",
                            "1,2,4,8,16,32,64,128,256,512", "--context", "16,64,256,1024",
                            "--reps", "3", "-o", args.profile], check=True)
    users, route = workload(args)
    redis = Redis(args.out) if shutil.which("redis-server") else None
    rows = []
    try:
        for name in args.configs.split(","):
            replicas = 2 if name.startswith("2x") else 1
            kind = name.split()[-1]
            if kind == "redis" and not redis:
                log("skipping %s: redis-server is not installed" % name)
                continue
            if not rows:  # the pool's size in blocks, from the first server, for the simulator
                probe = Server(args, [])
                args.kv_blocks = probe.metrics().get("kvcache_kv_blocks_total", 0)
                probe.stop()
            rows.append(run_config(args, name, kind, replicas, users, route, redis))
    finally:
        if redis:
            redis.stop()
    base = rows[0]["outputs"] if rows else None
    for r in rows:  # batch invariance: every configuration generates the same tokens
        r["outputs_identical"] = r["outputs"] == base
        if not r["outputs_identical"]:
            log("WARNING: %s generated other tokens than %s" % (r["config"], rows[0]["config"]))
    for r in rows:
        del r["outputs"]
    res = {"argv": sys.argv[1:], "model": args.model, "profile": args.profile,
           "kv_blocks": args.kv_blocks, "rows": rows, "load_average": os.getloadavg()}
    with open(os.path.join(args.out, "tier-bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = table(rows)
    with open(os.path.join(args.out, "tier-bench.md"), "w") as f:
        f.write(md)
    print(md)
    print("Load average during the run: %.1f, %.1f, %.1f" % tuple(res["load_average"]))


if __name__ == "__main__":
    main()
