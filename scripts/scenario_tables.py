#!/usr/bin/env python3
"""Render `kvcache sim --scenario FILE --json` output as the Markdown tables in docs/sim.md.

usage: scripts/scenario_tables.py KVCACHE SCENARIO.json...

Runs each scenario, prints its question, the command and one row per variant.  Units follow
the metric's name: *_ms in ms (in s from 10 s up), hit rates in percent, *_bytes in GB,
counts with thousands separators, everything else with one decimal.
"""
import json
import subprocess
import sys


def cell(name, v):
    leaf = name.split(".")[-1] if "." in name else name
    if name.endswith("_ms") or "_ms." in name:
        return f"{v / 1000:.2f} s" if v >= 10000 else f"{v:.1f} ms"
    if "hit_rate" in name:
        return f"{100 * v:.1f}%"
    if "bytes" in name and "stranded" not in name:
        return f"{v / 1e9:.2f} GB"
    if float(v).is_integer() and leaf not in ("throughput_tokens_per_s", "simulated_seconds"):
        return f"{int(v):,}"
    return f"{v:.1f}"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2])
    kvc = sys.argv[1]
    for path in sys.argv[2:]:
        out = subprocess.run([kvc, "sim", "--scenario", path, "--json"], check=True,
                             capture_output=True, text=True).stdout
        sc = json.loads(out)
        names = list(sc["variants"][0]["metrics"])
        print(f"**{sc['question']}** (`kvcache sim --scenario {path}`)\n")
        print("| variant | " + " | ".join(f"`{n}`" for n in names) + " |")
        print("|---" * (len(names) + 1) + "|")
        for v in sc["variants"]:
            print(f"| {v['name']} | " + " | ".join(cell(n, v["metrics"][n]) for n in names) + " |")
        print()


if __name__ == "__main__":
    main()
