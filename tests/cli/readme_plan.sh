#!/usr/bin/env bash
# readme_plan.sh - README.md's `kvcache plan` examples are the program's real output: every
# line pasted under a "$ ./build/kvcache plan ..." command (4-space indented, up to the next
# blank line; "..." lines skip) must appear, whole, in what that command prints now, so the
# README cannot drift from the code (docs/plan.md's examples: plan_docs.sh).
# usage: bash readme_plan.sh <kvcache binary> <source dir> <test data dir>
set -u
KVC=$1
SRC=$2
cd "$SRC" || exit 1
python3 - "$KVC" README.md <<'PY'
import shlex, subprocess, sys
kvc, readme = sys.argv[1], sys.argv[2]
lines = open(readme).read().split("\n")
fails = n = 0
i = 0
while i < len(lines):
    l = lines[i]
    if not l.startswith("    $ ./build/kvcache plan "):
        i += 1
        continue
    cmd = l[6:]
    while cmd.endswith("\\"):
        i += 1
        cmd = cmd[:-1] + " " + lines[i].strip()
    i += 1
    want = []
    while i < len(lines) and lines[i].startswith("    ") and not lines[i].startswith("    $ "):
        want.append(lines[i][4:])
        i += 1
    argv = shlex.split(cmd)
    argv[0] = kvc
    out = subprocess.run(argv, capture_output=True, text=True).stdout.split("\n")
    got = set(out)
    n += 1
    for w in want:
        if w.strip() == "..." or w in got:
            continue
        fails += 1
        print("FAIL: README: `%s`: the line\n    %s\nis not in its output" % (cmd, w))
if n == 0:
    print("FAIL: no `./build/kvcache plan` example found in README.md")
    fails += 1
print("readme_plan: %d examples, %d lines missing" % (n, fails))
sys.exit(1 if fails else 0)
PY
