#!/usr/bin/env python3
"""bench/serve/run.py - a load generator for `kvcache serve` in the spirit of `vllm bench
serve`, and the simulator's check against it.

    python3 bench/serve/run.py                 # the default sweep (a few minutes)
    python3 bench/serve/run.py --quick         # smoke check (under a minute)

What it does, all on 127.0.0.1, no network, python3's standard library only:
  1. writes the bench model (`kvcache model synth`, random weights, the stories260K
     vocabulary) unless --model names one;
  2. measures this machine's hardware profile for the engine (build/bench_profile: the
     engine's real step time per batch tokens and mean context, the JSON `kvcache sim
     --profile` reads), unless --profile names one;
  3. for each workload (a multi-turn chat: sessions whose later turns resend the earlier
     turns and replies; a shared system prompt: every request starts with the same prefix),
     each prefix-cache setting (on, off: the server's --no-prefix-cache) and each request
     rate (Poisson arrivals; "inf": all at once), starts `kvcache serve` on an ephemeral
     port, sends the requests as token ids over streaming completions (return_token_ids, so
     a chat's next turn resends exactly what was generated), and measures TTFT (send to the
     first token), TPOT ((last token - first token) / (tokens - 1)), end-to-end latency,
     their p50 / p90 / p99, throughput (requests/s, output tokens/s), and the prefix hit rate
     (usage.prompt_tokens_details.cached_tokens, and /metrics' counters);
  4. writes the same requests, as sent (arrival times, token ids, the replies' token ids),
     as a kvcache JSONL trace and runs `kvcache sim --profile` on it with the server's
     pool, block size and limits; reports the simulator's TTFT p50, TPOT p50 and throughput
     beside the measured ones, with the difference in %;
  5. writes everything to OUT/serve-bench.json and a markdown table OUT/serve-bench.md.

Token ids, never text: both the server and the simulator see exactly the same tokens.
"""
import argparse
import http.client
import json
import math
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VOCAB_MODEL = os.path.join(ROOT, "tests", "data", "models", "stories260K.gguf")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def pct_rank(v, p):
    """The simulator's percentile (src/sim/report.c, kvc_percentile_sorted): the nearest rank,
    the ceil(p/100 * n)-th smallest value.  The comparison with the simulator uses it: the
    chat workload's latencies come in clusters (one per turn), and there the interpolated p50
    of 32 values lies between two clusters where the nearest rank is the top of the lower one:
    up to 15% apart in the chat rows of the 2026-12-02 runs, a gap that is only the
    definition."""
    if not v:
        return None
    s = sorted(v)
    return s[min(len(s), max(1, math.ceil(p * len(s) / 100.0))) - 1]


def pct(v, p):
    if not v:
        return None
    s = sorted(v)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


# ---- the server ---------------------------------------------------------------------------
class Server:
    """`kvcache serve` on an ephemeral port with args' deployment, plus `extra` flags (the
    tiers of bench/tier/run.py)."""

    def __init__(self, args, prefix_cache, extra=()):
        cmd = [args.kvcache, "serve", "--model", args.model, "--port", "0", "--threads",
               str(args.threads), "--max-num-seqs", str(args.max_num_seqs),
               "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--kv-memory",
               args.kv_memory, "--ctx", str(args.ctx), "--block-size", str(args.block_size),
               "--max-queued", "4096", "--served-model-name", "bench"] + list(extra)
        if not prefix_cache:
            cmd.append("--no-prefix-cache")
        self.p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = self.p.stderr.readline()
        m = re.search(r":(\d+)", line)
        if not m:
            self.p.kill()
            raise SystemExit("kvcache serve did not start: " + line)
        self.port = int(m.group(1))
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        for _ in range(200):
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise SystemExit("kvcache serve is not healthy")

    def _drain_stderr(self):
        for _ in self.p.stderr:  # one log line per request: not needed here
            pass

    def get(self, path):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", path)
        r = c.getresponse()
        body = r.read().decode()
        c.close()
        return r.status, body

    def metrics(self):
        out = {}
        for line in self.get("/metrics")[1].splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
        return out

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()


def complete(port, prompt, max_tokens, t0):
    """One streaming completion on its own connection; returns its measurements and its output
    token ids.  A bare socket, not http.client: a token's time is when the recv() that brought
    it returned, before any parsing, so that the client's own costs (http.client's header
    parsing, a json.loads per event: 1 to 3 ms a request on this machine in the first runs)
    stay out of TTFT.  The events are parsed after the stream ends."""
    body = json.dumps({"model": "bench", "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "return_token_ids": True, "stream_options": {"include_usage": True}}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)) + body
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(600)
    sent = time.monotonic()
    s.connect(("127.0.0.1", port))
    s.sendall(req)
    raw, pos, head, chunked, done = b"", 0, None, False, False
    body_buf, events = b"", []  # (recv time, event bytes)
    while not done:
        data = s.recv(65536)
        t = time.monotonic()
        if not data:
            break
        raw += data
        if head is None:
            k = raw.find(b"\r\n\r\n")
            if k < 0:
                continue
            head, pos = raw[:k].decode("latin-1"), k + 4
            if not head.startswith("HTTP/1.1 200"):
                raise RuntimeError("%s: %s" % (head.splitlines()[0], raw[pos:pos + 200]))
            chunked = "transfer-encoding: chunked" in head.lower()
        while pos < len(raw):  # whole chunks into body_buf
            if not chunked:
                body_buf += raw[pos:]
                pos = len(raw)
                break
            e = raw.find(b"\r\n", pos)
            if e < 0:
                break
            n = int(raw[pos:e].split(b";")[0], 16)
            if e + 2 + n + 2 > len(raw):
                break
            body_buf += raw[e + 2:e + 2 + n]
            pos = e + 2 + n + 2
            if n == 0:
                done = True
                break
        while b"\n\n" in body_buf:
            ev, body_buf = body_buf.split(b"\n\n", 1)
            if ev.startswith(b"data: {"):
                events.append((t, ev[6:]))
    done_t = time.monotonic()
    s.close()
    ids, times, usage = [], [], None
    for t, ev in events:
        o = json.loads(ev)
        if o.get("usage"):
            usage = o["usage"]
        for ch in o.get("choices", []):
            tk = ch.get("token_ids") or []
            ids.extend(tk)
            times.extend([t] * len(tk))
    n = len(ids)
    return {"send_s": sent - t0, "ttft_ms": (times[0] - sent) * 1e3 if n else None,
            "tpot_ms": (times[-1] - times[0]) / (n - 1) * 1e3 if n > 1 else None,
            "e2e_ms": (done_t - sent) * 1e3, "done_s": done_t - t0, "n_prompt": len(prompt),
            "n_output": n, "cached": (usage or {}).get("prompt_tokens_details", {}).get(
                "cached_tokens", 0), "server": (usage or {}).get("kvcache_timings", {})}, ids


# ---- workloads ----------------------------------------------------------------------------
def arrivals(rng, n, rate):
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        if rate != math.inf:
            t += rng.expovariate(rate)
    return out


def toks(rng, n, vocab):
    return [rng.randrange(3, vocab) for _ in range(n)]


def run_chat(args, srv, rate, rng):
    """Sessions arrive as a Poisson process (rate / turns sessions per second, so that about
    `rate` requests arrive per second); each session sends its turns one after another, turn k
    resending turn k-1's prompt and reply plus new user tokens."""
    n_sess = max(1, args.requests // args.turns)
    starts = arrivals(rng, n_sess, rate / args.turns if rate != math.inf else math.inf)
    users = [[[1] + toks(rng, args.chat_user, args.vocab) if k == 0 else toks(rng, args.chat_user, args.vocab)
              for k in range(args.turns)] for _ in range(n_sess)]
    results, trace = [], []
    lock = threading.Lock()
    t0 = time.monotonic()

    def session(i):
        delay = starts[i] - (time.monotonic() - t0)
        if delay > 0:
            time.sleep(delay)
        prompt = []
        for k in range(args.turns):
            prompt = prompt + users[i][k]
            m, ids = complete(srv.port, prompt, args.output, t0)
            with lock:
                results.append(m)
                trace.append({"arrival_s": m["send_s"], "tokens": list(prompt),
                              "output_tokens": ids, "conversation": i + 1, "turn": k,
                              "think_s": 0.0, "max_output": args.output})
            prompt = prompt + ids

    th = [threading.Thread(target=session, args=(i,)) for i in range(n_sess)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return results, trace


def run_system(args, srv, rate, rng):
    """Every request: the same system prompt, then its own user tokens."""
    system = [1] + toks(rng, args.system_tokens - 1, args.vocab)
    n = args.requests
    at = arrivals(rng, n, rate)
    prompts = [system + toks(rng, args.system_user, args.vocab) for _ in range(n)]
    results, trace = [], []
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(i):
        delay = at[i] - (time.monotonic() - t0)
        if delay > 0:
            time.sleep(delay)
        m, ids = complete(srv.port, prompts[i], args.output, t0)
        with lock:
            results.append(m)
            trace.append({"arrival_s": m["send_s"], "tokens": prompts[i], "output_tokens": ids,
                          "max_output": args.output})

    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return results, trace


# ---- the simulator ------------------------------------------------------------------------
def sim(args, trace, blocks, prefix_cache, chat, path, profile):
    trace = sorted(trace, key=lambda r: r["arrival_s"])
    t_first = trace[0]["arrival_s"]
    with open(path, "w") as f:
        f.write(json.dumps({"kvcache_workload": 1}) + "\n")
        for r in trace:
            rec = dict(r)
            rec["arrival_s"] = round(r["arrival_s"] - t_first, 6)
            rec["output"] = len(r["output_tokens"])
            f.write(json.dumps(rec) + "\n")
    cmd = [args.kvcache, "sim", "--model", args.model_config, "--gpu", "h100-sxm", "--quiet",
           "--json", "--workload", path, "--profile", profile, "--num-blocks", str(blocks),
           "--block-size", str(args.block_size), "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--max-model-len",
           str(args.ctx), "--seed", "1"]
    if chat:
        cmd.append("--closed-loop")  # a turn is sent when the previous one finished
    if not prefix_cache:
        cmd.append("--no-prefix-caching")
    else:
        cmd.append("--hold-shared-prefix")  # the engine's admission
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit("kvcache sim failed: " + out.stderr)
    r = json.loads(out.stdout)
    return {"ttft_p50_ms": r["ttft_ms"]["p50"], "tpot_p50_ms": r["tpot_ms"]["p50"],
            "e2e_p50_ms": r["e2e_ms"]["p50"], "duration_s": r["simulated_seconds"],
            "output_tok_s": r["output_tokens"] / r["simulated_seconds"],
            "prefix_hit_rate": r["prefix_hit_rate"], "steps": r["steps"],
            "cmd": " ".join(cmd)}


# ---- one run ------------------------------------------------------------------------------
def one_run(args, workload, prefix_cache, rate, seed):
    rng = random.Random(seed)
    srv = Server(args, prefix_cache)
    try:
        m0 = srv.metrics()
        res, trace = (run_chat if workload == "chat" else run_system)(args, srv, rate, rng)
        time.sleep(0.1)
        m1 = srv.metrics()
    finally:
        srv.stop()
    t_first = min(r["send_s"] for r in res)
    t_last = max(r["done_s"] for r in res)
    dur = t_last - t_first
    n_out = sum(r["n_output"] for r in res)
    n_prompt = sum(r["n_prompt"] for r in res)

    def d(k):
        return m1.get(k, 0) - m0.get(k, 0)

    row = {"workload": workload, "prefix_cache": prefix_cache,
           "rate": "inf" if rate == math.inf else rate, "requests": len(res),
           "duration_s": dur, "req_s": len(res) / dur, "output_tok_s": n_out / dur,
           "prefix_hit_rate": sum(r["cached"] for r in res) / n_prompt,
           "metrics_hit_rate": d("kvcache_prefix_hit_tokens_total") / max(1, d("kvcache_prompt_tokens_total")),
           "server_first_token_p50_ms": pct([r["server"].get("first_token_ms", 0) for r in res], 50),
           "server_tpot_p50_ms": pct([r["server"].get("decode_ms", 0) / (r["n_output"] - 1)
                                      for r in res if r["n_output"] > 1], 50),
           "server_queue_p50_ms": pct([r["server"].get("queue_ms", 0) for r in res], 50),
           "server_prefill_p50_ms": pct([r["server"].get("prefill_ms", 0) for r in res], 50),
           "blocks": int(m1.get("kvcache_kv_blocks_total", 0)),
           "server_steps": d("kvcache_engine_steps_total"),
           "server_step_ms_mean": 1e3 * d("kvcache_engine_step_seconds_total") / max(1, d("kvcache_engine_steps_total"))}
    for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
        v = [r[k] for r in res if r[k] is not None]
        for p in (50, 90, 99):
            row["%s_p%d" % (k, p)] = pct(v, p)
        row["%s_p50_rank" % k] = pct_rank(v, 50)
        row["%s_all" % k] = v
    os.makedirs(args.out, exist_ok=True)
    tag = "%s-%s-%s" % (workload, "pc" if prefix_cache else "nopc", row["rate"])
    if args.profile:
        path = os.path.join(args.out, "trace-%s.jsonl" % tag)
        row["sim"] = sim(args, trace, row["blocks"], prefix_cache, workload == "chat", path,
                         args.profile)
        if args.profile_grid:  # the same profile without its fixed costs: the simulator before
            row["sim_grid"] = sim(args, trace, row["blocks"], prefix_cache, workload == "chat",
                                  path, args.profile_grid)
    log("%-6s %-5s rate %-4s  %3d req in %6.2f s  TTFT p50 %7.2f ms (server %.2f)  TPOT p50 %6.2f ms (server %.2f)  hit %.2f%s" % (
        workload, "on" if prefix_cache else "off", row["rate"], len(res), dur, row["ttft_ms_p50"],
        row["server_first_token_p50_ms"], row["tpot_ms_p50"] or 0, row["server_tpot_p50_ms"] or 0,
        row["prefix_hit_rate"],
        ("  | sim TTFT %7.2f TPOT %6.2f" % (row["sim"]["ttft_p50_ms"], row["sim"]["tpot_p50_ms"]))
        if "sim" in row else ""))
    return row


def calibrate(args):
    """A cross-check of the profile's step_overhead_ms, from outside (the simulator does not use
    it): one request at a time decoding 64 tokens, three times; the server's own time per
    output token minus the engine's mean step (both from the server: usage.kvcache_timings and
    /metrics, the mean including the prefill step)."""
    rng = random.Random(99)
    srv = Server(args, True)
    try:
        per_tok, eng = [], []
        for _ in range(3):
            m0 = srv.metrics()
            m, _ids = complete(srv.port, [1] + toks(rng, 63, args.vocab), 64, time.monotonic())
            m1 = srv.metrics()
            steps = m1["kvcache_engine_steps_total"] - m0["kvcache_engine_steps_total"]
            eng.append(1e3 * (m1["kvcache_engine_step_seconds_total"] - m0["kvcache_engine_step_seconds_total"]) / steps)
            per_tok.append(m["server"]["decode_ms"] / (m["n_output"] - 1))
    finally:
        srv.stop()
    tpot, step = statistics.median(per_tok), statistics.median(eng)
    log("calibration: server time per output token %.3f ms, engine step %.3f ms: loop overhead %.3f ms" % (tpot, step, tpot - step))
    return {"server_tpot_ms": tpot, "engine_step_ms": step, "loop_overhead_ms": max(0.0, tpot - step)}


def diff(sim_v, meas):
    return None if not meas or sim_v is None else (sim_v - meas) / meas * 100


def table(rows, args):
    L = ["| workload | prefix cache | rate (req/s) | requests | req/s | output tok/s | TTFT p50 / p90 / p99 (ms) | TPOT p50 / p90 / p99 (ms) | E2E p50 / p90 / p99 (ms) | prefix hit rate (usage / metrics) |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    f = lambda x: "-" if x is None else ("%.1f" % x if x >= 10 else "%.2f" % x)
    for r in rows:
        L.append("| %s | %s | %s | %d | %.2f | %.1f | %s / %s / %s | %s / %s / %s | %s / %s / %s | %.1f%% / %.1f%% |" % (
            r["workload"], "on" if r["prefix_cache"] else "off", r["rate"], r["requests"], r["req_s"],
            r["output_tok_s"], f(r["ttft_ms_p50"]), f(r["ttft_ms_p90"]), f(r["ttft_ms_p99"]),
            f(r["tpot_ms_p50"]), f(r["tpot_ms_p90"]), f(r["tpot_ms_p99"]), f(r["e2e_ms_p50"]),
            f(r["e2e_ms_p90"]), f(r["e2e_ms_p99"]), 100 * r["prefix_hit_rate"], 100 * r["metrics_hit_rate"]))
    L.append("")
    if any("sim" in r for r in rows):
        L.append("The simulator (`kvcache sim --profile`, the same requests) beside the measured run (p50: the nearest rank, as the simulator reports it; the first table interpolates):")
        L.append("")
        L.append("| workload | prefix cache | rate | saturated | TTFT p50 measured / sim (ms) | diff | server-side first token p50 (ms) | TPOT p50 measured / sim (ms) | diff | output tok/s measured / sim | diff | hit rate measured / sim | sim, grid only (no fixed costs): TTFT / TPOT (ms), diff | steps measured / sim | engine step mean (ms) |")
        L.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            s = r.get("sim")
            if not s:
                continue
            sat = r["rate"] == "inf" or r["req_s"] < 0.9 * float(r["rate"])
            dd = lambda a, b: "-" if diff(a, b) is None else "%+.1f%%" % diff(a, b)
            s0 = r.get("sim_grid") or r.get("sim_overhead") or {"ttft_p50_ms": None, "tpot_p50_ms": None}
            mt = r.get("ttft_ms_p50_rank", r["ttft_ms_p50"])
            mp = r.get("tpot_ms_p50_rank", r["tpot_ms_p50"])
            L.append("| %s | %s | %s | %s | %s / %s | %s | %s | %s / %s | %s | %.1f / %.1f | %s | %.1f%% / %.1f%% | %s | %d / %d | %s |" % (
                r["workload"], "on" if r["prefix_cache"] else "off", r["rate"], "yes" if sat else "no",
                f(mt), f(s["ttft_p50_ms"]), dd(s["ttft_p50_ms"], mt),
                f(r["server_first_token_p50_ms"]), f(mp), f(s["tpot_p50_ms"]),
                dd(s["tpot_p50_ms"], mp), r["output_tok_s"], s["output_tok_s"],
                dd(s["output_tok_s"], r["output_tok_s"]), 100 * r["prefix_hit_rate"], 100 * s["prefix_hit_rate"],
                "%s / %s, %s / %s" % (f(s0["ttft_p50_ms"]), f(s0["tpot_p50_ms"]),
                                      dd(s0["ttft_p50_ms"], mt),
                                      dd(s0["tpot_p50_ms"], mp)),
                r["server_steps"], s["steps"],
                f(r["server_step_ms_mean"])))
    return "\n".join(L) + "\n"


def gguf_config(args):
    """The bench model's hyperparameters as a Hugging Face config.json, for the simulator's
    deployment options (its pool is given in blocks; the profile gives the step times)."""
    info = subprocess.run([args.kvcache, "model", "info", args.model], capture_output=True,
                          text=True).stdout
    def num(pat, default=None):
        m = re.search(pat, info)
        return int(m.group(1)) if m else default
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": num(r"hidden (\d+)"),
           "num_hidden_layers": num(r"layers (\d+)"),
           "num_attention_heads": num(r" heads (\d+)"),
           "num_key_value_heads": num(r"KV heads (\d+)"),
           "intermediate_size": num(r"FFN (\d+)"),
           "vocab_size": args.vocab, "max_position_embeddings": args.ctx,
           "torch_dtype": "float16"}
    path = os.path.join(args.out, "model-config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvcache", default=os.path.join(ROOT, "build", "kvcache"))
    ap.add_argument("--bench-profile", default=os.path.join(ROOT, "build", "bench_profile"))
    ap.add_argument("--model", help="a GGUF (default: write the bench model)")
    ap.add_argument("--profile", help="a profile JSON (default: measure one); 'none': no sim")
    ap.add_argument("--out", default=os.path.join(os.environ.get("KVC_BENCH_DIR", "/tmp/kvc-bench"), "serve"))
    ap.add_argument("--workloads", default="chat,system")
    ap.add_argument("--rates", default="2,4,8,inf")
    ap.add_argument("--prefix-cache", default="on,off")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--chat-user", type=int, default=48, help="user tokens per turn")
    ap.add_argument("--system-tokens", type=int, default=384)
    ap.add_argument("--system-user", type=int, default=32)
    ap.add_argument("--output", type=int, default=24, help="output tokens per request")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--kv-memory", default="32MiB")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--profile-tokens", default="1,2,3,4,6,8,12,16,32,64,128,256,512",
                    help="the profile's batch-token grid (bench_profile --tokens)")
    ap.add_argument("--profile-reps", type=int, default=5)
    ap.add_argument("--profile-passes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="one workload pass at two rates")
    ap.add_argument("--table", metavar="JSON", help="only print the tables of a finished run")
    args = ap.parse_args()
    if args.table:
        res = json.load(open(args.table))
        for r in res["rows"]:  # runs written before the columns were swapped
            if "sim_profile_only" in r:
                r["sim_overhead"], r["sim"] = r["sim"], r.pop("sim_profile_only")
        print(table(res["rows"], args), end="")
        if res.get("calibration"):
            print("\nCalibration (one request at a time): %(server_tpot_ms).3f ms per output token in "
                  "the server, %(engine_step_ms).3f ms per engine step: a loop overhead of "
                  "%(loop_overhead_ms).3f ms per step." % res["calibration"])
        fx = res.get("fixed_costs") or {}
        if fx.get("request_ms") is not None:
            print("The profile's fixed costs (bench_profile, through the server's API): request_ms "
                  "%.3f, step_overhead_ms %.3f." % (fx["request_ms"], fx["step_overhead_ms"]))
        if res.get("load_average_start"):
            print("Load average at the start: %.1f, %.1f, %.1f" % tuple(res["load_average_start"]))
        print("Load average at the end: %.1f, %.1f, %.1f" % tuple(res["load_average"]))
        return
    if args.quick:
        args.rates, args.requests = "4,inf", 12
    os.makedirs(args.out, exist_ok=True)
    load0 = os.getloadavg()
    log("load average at the start: %.2f, %.2f, %.2f" % load0)
    if not args.model:
        args.model = os.path.join(args.out, "bench-256x4.gguf")
        if not os.path.exists(args.model):
            subprocess.run([args.kvcache, "model", "synth", "--arch", "llama", "--vocab", VOCAB_MODEL,
                            "-o", args.model, "--dim", "256", "--layers", "4", "--heads", "4",
                            "--kv-heads", "2", "--ff", "768", "--ctx", "4096", "--dtype", "q8_0",
                            "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    info = subprocess.run([args.kvcache, "model", "info", args.model], capture_output=True, text=True).stdout
    m = re.search(r"vocab (\d+)", info)
    args.vocab = int(m.group(1)) if m else 512
    args.model_config = gguf_config(args)
    if args.profile == "none":
        args.profile = None
    elif not args.profile:
        args.profile = os.path.join(args.out, "profile.json")
        log("measuring the profile (bench_profile) ...")
        subprocess.run([args.bench_profile, "--model", args.model, "--threads", str(args.threads),
                        "--block-size", str(args.block_size), "--max-num-seqs", str(args.max_num_seqs),
                        "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--ctx",
                        str(args.ctx), "--tokens", args.profile_tokens, "--context", "16,64,256,1024",
                        "--reps", str(args.profile_reps), "--passes", str(args.profile_passes),
                        "-o", args.profile], check=True)
    cal, fixed = None, None
    args.profile_grid = None
    if args.profile:
        cal = calibrate(args)
        prof = json.load(open(args.profile))
        fixed = {k: prof.get(k) for k in ("request_ms", "step_overhead_ms", "fixed_costs")}
        if prof.get("request_ms") is not None or prof.get("step_overhead_ms") is not None:
            for k in ("request_ms", "step_overhead_ms"):
                prof.pop(k, None)
            args.profile_grid = os.path.join(args.out, "profile-grid-only.json")
            with open(args.profile_grid, "w") as f:
                json.dump(prof, f)
    rows = []
    rates = [math.inf if r == "inf" else float(r) for r in args.rates.split(",")]
    for wl in args.workloads.split(","):
        for pc in args.prefix_cache.split(","):
            for rate in rates:
                rows.append(one_run(args, wl, pc == "on", rate, args.seed))
    res = {"argv": sys.argv[1:], "model": args.model, "profile": args.profile, "rows": rows,
           "calibration": cal, "fixed_costs": fixed, "load_average_start": load0,
           "load_average": os.getloadavg()}
    with open(os.path.join(args.out, "serve-bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = table(rows, args)
    with open(os.path.join(args.out, "serve-bench.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
