#!/usr/bin/env bash
# Checks `localpar project` on a slow link: runs a 2-stage cluster in a private network
# namespace whose loopback is rate-limited with tc (token bucket), and compares measured
# examples/s with the projection for the same job at that bandwidth. netem (delay) is not
# available on this kernel; tbf (rate) is. Needs root (or user namespaces) for `unshare -n`.
#
# On one loopback every stream shares the limit: the coordinator's input batches and the
# activations between the two stages. The projection models each inter-stage hop as its own
# link, so it is given the share of the rate that the inter-stage hop gets: rate x (hop
# bytes / all bytes a batch sends).
# Usage: tests/bench/project_shaped.sh [BUILD_DIR] [RATE_MBIT] [STEPS]
set -euo pipefail
build=$(cd "${1:-build/ci}" && pwd)
rate_mbit=${2:-200}
steps=${3:-150}
if ! unshare -n true 2>/dev/null || ! command -v tc >/dev/null; then
  echo "project_shaped: needs unshare -n and tc; skipped"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
job="$work/job.textproto"
cat > "$job" <<JOB
name: "shaped"
rule: GREEDY
batch_size: 128
seed: 1
data { synthetic { train_examples: $((steps * 128)) test_examples: 128 shape: [1024] classes: 10 } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } layers { linear { out_features: 1024 } } layers { relu {} } }
stages { layers { linear { out_features: 1024 } } layers { relu {} } layers { linear { out_features: 1024 } } layers { relu {} } }
JOB
# Per batch: 128 x 1024 floats in from the coordinator, 128 x 1024 between the stages (and
# 128 labels each way, a rounding error): the inter-stage hop gets half the rate.
hop_gbps=$(python3 -c "print($rate_mbit / 1000 / 2)")
"$build/localpar" project "$job" --project_stages=2 --cores="$(nproc)" --link_gbps="$hop_gbps" \
  --latency_us=50 | tee "$work/project.txt"
unshare -n bash -c "
  ip link set lo up
  tc qdisc add dev lo root tbf rate ${rate_mbit}mbit burst 1mb latency 1s
  '$build/localpar' run '$job' --quiet --threads=1 --out='$work/run'
"
python3 - "$work" "$rate_mbit" <<'PY'
import json, sys
work, rate = sys.argv[1], sys.argv[2]
pred = None
for line in open(f"{work}/project.txt"):
    f = line.split()
    if len(f) == 4 and f[0] == "2":
        pred = float(f[3])
measured = json.load(open(f"{work}/run/report.json"))["examples_per_second"]
print(f"loopback limited to {rate} Mbit/s, 2 stages: predicted {pred:.0f} ex/s, "
      f"measured {measured:.0f} ex/s, measured / predicted {measured / pred:.2f}")
PY
