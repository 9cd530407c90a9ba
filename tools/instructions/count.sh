#!/usr/bin/env bash
# Machine instructions per pod of one shard's timed section in `shoal loadtest`, counted
# by callgrind. Unlike CPU seconds the count hardly moves with the machine's load, so
# two commits can be compared on a busy machine (about 50 times slower than a plain run).
#
# usage: tools/instructions/count.sh [CHECKOUT] [NODES] [PODS] [TEMPLATES]
#   CHECKOUT: a directory holding the code to count (default: this checkout), e.g.
#   `git archive COMMIT | tar -x -C /tmp/old`; NODES 5000, PODS 6000 by default.
#   TEMPLATES: the workload of `shoal loadtest scale --shards 0 --templates TEMPLATES`
#   (mixed nodes, that many pod templates); without, `shoal loadtest`'s.
#   CALLGRIND_OUT: a file to keep the timed section's callgrind profile in (for
#   callgrind_annotate), if set.
#   PYTHON: the interpreter with shoal's dependencies (default: .venv/bin/python here).
source "$(dirname "$0")/setup.sh"
nodes=${2:-5000}
pods=${3:-6000}
templates=${4:-}
if ! (cd "$out" && PYTHONHASHSEED=0 PYTHONPATH="$code" valgrind --tool=callgrind \
    --dump-before=time_process_time_ns --callgrind-out-file="$out/cg.%p" \
    "$python" "$here/count.py" "$nodes" "$pods" $templates >"$out/log" 2>&1); then
  tail -20 "$out/log" >&2
  exit 1
fi
timed=$(ls "$out"/cg.*.2 | head -1)
total=$(awk '/^summary/ {print $2}' "$timed")
if [ -n "${CALLGRIND_OUT:-}" ]; then cp "$timed" "$CALLGRIND_OUT"; fi
echo "$(( total / pods )) instructions per pod ($code, $nodes nodes, $pods pods${templates:+, $templates templates})"
