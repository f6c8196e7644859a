#!/usr/bin/env bash
# Auto-partitioning against the naive equal-layer-count split, measured: `localpar plan`
# profiles every layer and proposes the split that minimises the slowest stage; both splits
# then train on a local cluster (one worker per stage, one GEMM thread each) and the
# examples/s of the two runs are compared. Prints the predicted and the measured ratio.
# Usage: tests/bench/plan_bench.sh [BUILD_DIR] [STAGES] [JOB]
set -euo pipefail
build=${1:-build/ci}
stages=${2:-2}
job=${3:-tests/bench/unbalanced_mlp.textproto}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$build/localpar" plan "$job" --stages="$stages" > "$work/balanced.textproto" 2> "$work/plan.txt"
"$build/localpar" plan "$job" --stages="$stages" --naive > "$work/equal.textproto" 2> /dev/null
cat "$work/plan.txt"
for split in balanced equal; do
  "$build/localpar" run "$work/$split.textproto" --quiet --threads=1 --out="$work/$split"
done
python3 - "$work" <<'PY'
import json, sys
rate = {s: json.load(open(f"{sys.argv[1]}/{s}/report.json"))["examples_per_second"]
        for s in ("balanced", "equal")}
print(f"measured examples/s: balanced {rate['balanced']:.0f}, equal {rate['equal']:.0f}")
print(f"plan_bench: measured throughput, balanced / equal split: "
      f"{rate['balanced'] / rate['equal']:.2f}")
PY
