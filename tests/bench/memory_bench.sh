#!/usr/bin/env bash
# Worker memory against the computed minimum, and its growth over a long run. Trains a
# 4-stage fashion_mlp-sized model on synthetic data on a local cluster for STEPS steps
# (10 epochs), then prints, per stage: resident memory before the stage existed (gRPC,
# OpenBLAS and the C++ runtime), the computed minimum (parameters + gradients + optimizer
# state, plus one batch's activations in flight), the bounded queues' worst case, the
# measured resident memory, and its growth from the end of epoch 1 to the end.
# Usage: tests/bench/memory_bench.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build/ci}
steps=${2:-10000}
batch=128
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/job.textproto" <<JOB
name: "memory"
rule: GREEDY
batch_size: $batch
epochs: 10
seed: 1
data { synthetic { train_examples: $((steps / 10 * batch)) test_examples: 512 shape: [784] classes: 10 } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } }
JOB
"$build/localpar" run "$work/job.textproto" --quiet --threads=1 --out="$work/out"
python3 - "$work/out/report.json" "$batch" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
batch = int(sys.argv[2])
mib = lambda b: b / 2**20
print(f"memory_bench: {r['steps']} steps, batch {batch}")
print("stage  baseline  minimum  queues<=  resident  over minimum  growth epoch1->end")
worst = 0.0
for s in r["stage_reports"]:
    minimum = s["state_bytes"] + s["activation_bytes_per_example"] * batch
    # Each bounded queue (in and out) holds at most queue_capacity batches of the stage's
    # input or output; the stage's input is the first term of activation_bytes_per_example.
    queues = 2 * s["queue_capacity"] * 1024 * 4 * batch
    used = s["resident_bytes"] - s["baseline_bytes"]
    growth = s["resident_bytes"] - s["resident_bytes_first_epoch"]
    worst = max(worst, used / minimum)
    print(f"{s['stage']:5d}  {mib(s['baseline_bytes']):6.1f}M  {mib(minimum):6.1f}M  "
          f"{mib(queues):6.1f}M  {mib(s['resident_bytes']):7.1f}M  {mib(used - minimum):+10.1f}M  "
          f"{mib(growth):+8.1f}M")
print(f"memory_bench: (resident - baseline) / computed minimum, worst stage: {worst:.2f}")
print("resident MiB at the end of each epoch:")
for s in r["stage_reports"]:
    print(f"  stage {s['stage']}: " + " ".join(f"{mib(b):.1f}" for b in s["resident_bytes_by_epoch"]))
PY
