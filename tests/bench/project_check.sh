#!/usr/bin/env bash
# Checks `localpar project` against measured clusters: predicts examples/s for K = 1, 2, 4
# stages of a job from its measured per-layer times (this machine's cores and loopback
# link), then runs the same job cut into K stages with `localpar run --stages=K` and prints
# predicted, measured and their ratio.
# The job is fashion_mlp's network on synthetic data with a tiny test set, so the measured
# rate is training throughput (the report's examples/s is over wall time, start-up and
# evaluation included).
# Usage: tests/bench/project_check.sh [BUILD_DIR] [STEPS] [LINK_GBPS] [LATENCY_US]
set -euo pipefail
build=${1:-build/ci}
steps=${2:-400}
gbps=${3:-9.2}        # one loopback stream, from transport_bench
latency=${4:-50}
cores=$(nproc)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job="$work/job.textproto"
cat > "$job" <<JOB
name: "fashion_mlp_synthetic"
rule: GREEDY
batch_size: 128
seed: 1
data { synthetic { train_examples: $((steps * 128)) test_examples: 128 shape: [28, 28, 1] classes: 10 } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
JOB
"$build/localpar" project "$job" --project_stages=1,2,4 --cores="$cores" --link_gbps="$gbps" \
  --latency_us="$latency" | tee "$work/project.txt"
for k in 1 2 4; do
  "$build/localpar" plan "$job" --stages=$k > "$work/plan$k.textproto" 2> /dev/null
  "$build/localpar" run "$work/plan$k.textproto" --quiet --threads=1 --out="$work/run$k"
done
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
pred = {}
for line in open(f"{work}/project.txt"):
    f = line.split()
    if len(f) == 4 and f[0].isdigit():
        pred[int(f[0])] = float(f[3])
print("stages  predicted ex/s  measured ex/s  measured / predicted")
for k in (1, 2, 4):
    measured = json.load(open(f"{work}/run{k}/report.json"))["examples_per_second"]
    print(f"{k:6d}  {pred[k]:14.0f}  {measured:13.0f}  {measured / pred[k]:20.2f}")
PY
