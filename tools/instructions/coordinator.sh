#!/usr/bin/env bash
# Machine instructions per plain pod of the coordinator's fold and passes (no log), counted
# by callgrind: coordinator.py run with PODS pods and with none, the difference divided by
# PODS. Unlike CPU seconds the count hardly moves with the machine's load, so two commits
# can be compared on a busy machine (about 50 times slower than a plain run).
#
# usage: tools/instructions/coordinator.sh [CHECKOUT] [NODES] [PODS]
#   CHECKOUT: a directory holding the code to count (default: this checkout), e.g.
#   `git worktree add /tmp/old COMMIT`; NODES 2000, PODS 6000 by default.
#   PYTHON: the interpreter with shoal's dependencies (default: .venv/bin/python here).
source "$(dirname "$0")/setup.sh"
nodes=${2:-2000}
pods=${3:-6000}
count() {
  (cd "$out" && PYTHONHASHSEED=0 PYTHONPATH="$code" valgrind --tool=callgrind \
    --callgrind-out-file="$out/cg.$1" "$python" "$here/coordinator.py" "$nodes" "$1" \
    >"$out/log.$1" 2>&1) || { tail -20 "$out/log.$1" >&2; exit 1; }
  awk '/^summary/ {print $2}' "$out/cg.$1"
}
none=$(count 0)
some=$(count "$pods")
echo "$(( (some - none) / pods )) instructions per plain pod ($code, $nodes nodes, $pods pods, 2 shards)"
