#!/usr/bin/env python3
"""A/B of kvcache binaries on one model's generation (tg128), for a loaded, shared machine.

    python3 bench/engine/ab_tg.py --model M.gguf --threads 1 --reps 3 OLD_BINARY NEW_BINARY

Copy the binaries somewhere first (/tmp): each repetition runs every binary in turn, the
order reversed every other repetition.  A run is `kvcache run --json --ignore-eos` on a fixed
8-id prompt, -n 128 (tokens/s = 1000 / tpot_ms, as bench/engine/run.py's tg128 row), then
the same with -n 8; on one thread it also reports decode tokens per CPU second,
120 / (CPU(n=128) - CPU(n=8)), which leaves out the load, the packing, the prompt and the
time the scheduler gave other processes (on more threads the pool's spinning counts as CPU,
so only the wall figure is printed).  Prints the medians, every run, the load average and
whether every binary gave the same greedy ids.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

IDS = "1 4231 877 12021 305 9977 2113 650"


def run(binary, model, threads, n):
    cmd = [binary, "run", "--model", model, "--threads", str(threads), "--json",
           "--ignore-eos", "--prompt-ids", IDS, "-n", str(n), "--ctx", "160"]
    t0 = os.times()
    p = subprocess.run(cmd, capture_output=True, text=True)
    t1 = os.times()
    if p.returncode:
        sys.exit("%s: exit %d: %s" % (binary, p.returncode, p.stderr.strip()[-300:]))
    req = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")][0]
    cpu = (t1.children_user - t0.children_user) + (t1.children_system - t0.children_system)
    return req, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()
    res = {b: {"wall": [], "cpu": [], "load": [], "ids": None} for b in a.binaries}
    for r in range(a.reps):
        for b in (a.binaries if r % 2 == 0 else a.binaries[::-1]):
            req, c128 = run(b, a.model, a.threads, 128)
            d = res[b]
            d["wall"].append(1000.0 / req["tpot_ms"])
            if a.threads == 1:
                _, c8 = run(b, a.model, a.threads, 8)
                d["cpu"].append(120.0 / (c128 - c8))
            d["load"].append(os.getloadavg()[0])
            d["ids"] = req["output_ids"]
    for b in a.binaries:
        d = res[b]
        line = "%s t%d: wall %.2f tok/s (%s)" % (b, a.threads, statistics.median(d["wall"]),
                                                " ".join("%.2f" % x for x in d["wall"]))
        if d["cpu"]:
            line += "; per CPU-s %.2f (%s)" % (statistics.median(d["cpu"]),
                                               " ".join("%.2f" % x for x in d["cpu"]))
        print(line + "; load %s" % " ".join("%.1f" % x for x in d["load"]))
    same = all(res[b]["ids"] == res[a.binaries[0]]["ids"] for b in a.binaries)
    print("greedy ids identical:", same)


if __name__ == "__main__":
    main()
