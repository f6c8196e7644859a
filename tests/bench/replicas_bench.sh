#!/usr/bin/env bash
# Stage replicas against the reference trainer on the same work, in one run: fashion_mlp
# (its 4 job stages regrouped by --stages) trains for the same steps as K stages x R
# replicas on a local cluster (one worker process per replica, one GEMM thread each):
# 1 x 2 (pure data parallelism), 2 x 1, 2 x 2 and 4 x 1, and in-process with `localpar
# train` (one thread). Throughput is training examples over each run's wall time (both
# include the final evaluation); every cluster's weights are also checked bitwise against
# `localpar train` with the same stages and replicas. `localpar project` predicts each
# layout from measured layer times, the cores, and the gather bandwidth allreduce_bench
# measures on this machine's loopback (its "received per replica" figure). States the cores
# it ran on.
# Usage: tests/bench/replicas_bench.sh [BUILD_DIR] [STEPS] [JOB]
set -euo pipefail
build=${1:-build/ci}
steps=${2:-400}
job=${3:-deploy/jobs/fashion_mlp.textproto}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gbps=$("$build/bench/allreduce_bench" --mib=16 --rounds=10 |
       awk '/mesh allgather/ {print $(NF - 4) * 8}')
echo "replicas_bench: $job, $steps steps, $(nproc) cores, one GEMM thread per worker;" \
     "gather bandwidth on loopback ${gbps} Gbit/s"
layouts=("1 2" "2 1" "2 2" "4 1")
for layout in "${layouts[@]}"; do
  read -r k r <<< "$layout"
  name="k${k}r${r}"
  "$build/localpar" train "$job" --stages="$k" --replicas="$r" --max_steps="$steps" --quiet \
    --threads=1 --out="$work/train-$name" > /dev/null
  "$build/localpar" run "$job" --stages="$k" --replicas="$r" --max_steps="$steps" --quiet \
    --threads=1 --out="$work/run-$name" > /dev/null
  cmp -s "$work/train-$name/weights.pb" "$work/run-$name/weights.pb" ||
    { echo "replicas_bench: $k x $r: the cluster's weights differ from localpar train's"; exit 1; }
  predicted=$("$build/localpar" project "$job" --replicas="$r" --project_stages="$k" \
                --cores="$(nproc)" --link_gbps="$gbps" 2> /dev/null | tail -1 | awk '{print $NF}')
  echo "$k $r $predicted" >> "$work/predicted"
done
"$build/localpar" train "$job" --max_steps="$steps" --quiet --threads=1 --out="$work/reference" \
  > /dev/null
/usr/bin/python3 - "$work" "${layouts[@]}" <<'PY'
import json, sys
work, layouts = sys.argv[1], sys.argv[2:]
def rate(d):
    r = json.load(open(f"{work}/{d}/report.json"))
    return r["train_examples"] / r["wall_seconds"]
predicted = {tuple(l.split()[:2]): float(l.split()[2]) for l in open(f"{work}/predicted")}
ref = rate("reference")
print(f"reference trainer (in-process, 1 thread): {ref:8.0f} examples/s")
print("stages x replicas  workers  examples/s  / reference  projected examples/s  bitwise")
for l in layouts:
    k, r = l.split()
    got = rate(f"run-k{k}r{r}")
    print(f"{k:>6} x {r:<8}  {int(k) * int(r):7d}  {got:10.0f}  {got / ref:11.2f}  "
          f"{predicted[(k, r)]:19.0f}  equal")
PY
