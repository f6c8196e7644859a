#!/usr/bin/env bash
# Soak benchmark: a local cluster trains for DURATION seconds (default 600) with a checkpoint
# every 20 s, and one worker is killed with SIGKILL half-way. Reads every process's /metrics
# and reports steps completed, checkpoints committed, the recovery time (kill to the first
# training step after the rollback) and each worker's resident memory early and at the end.
#   tests/bench/soak.sh [DURATION_SECONDS]      (uses build/ci; BIN=dir to change)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/ci}
DURATION=${1:-600}
dir=$(mktemp -d /tmp/localpar_soak.XXXXXX)
cat > "$dir/job.textproto" <<'JOB'
name: "soak" rule: GREEDY batch_size: 128 epochs: 1000000 seed: 1
data { synthetic { train_examples: 6400 test_examples: 256 shape: [784] classes: 10 seed: 1 } }
stages { layers { linear { out_features: 512 } } layers { relu {} } }
stages { layers { linear { out_features: 512 } } layers { relu {} } }
stages { layers { linear { out_features: 512 } } layers { relu {} } }
stages { layers { linear { out_features: 512 } } layers { relu {} } }
JOB
"$BIN/localpar" run "$dir/job.textproto" --quiet --checkpoint_dir="$dir/ckpt" \
  --checkpoint_every_seconds=20 --metrics_targets="$dir/targets.json" > "$dir/log" 2>&1 &
launcher=$!
trap 'kill -INT $launcher 2>/dev/null || true; wait $launcher 2>/dev/null || true' EXIT
while [ ! -s "$dir/targets.json" ]; do sleep 0.2; done

# metric NAME: the value of the first sample of NAME from every target, one per line.
metric() {
  for t in $(grep -o '127.0.0.1:[0-9]*' "$dir/targets.json"); do
    curl -s --max-time 2 "http://$t/metrics" | awk -v m="$1" '$1 ~ "^"m"({|$)" {print $2; exit}'
  done
}
now() { date +%s.%N; }

sleep 15
rss_start=$(metric localpar_resident_memory_bytes | tr '\n' ' ')
sleep $((DURATION / 2 - 15))
victim=$(pgrep -P "$launcher" | sed -n 2p)   # the worker for stage 1
steps_before=$(metric localpar_steps_total | head -1)
t_kill=$(now)
kill -9 "$victim"
until grep -q "rolling every stage back" "$dir/log"; do sleep 0.1; done
until [ "$(metric localpar_steps_total | head -1)" != "$steps_before" ]; do sleep 0.1; done
t_back=$(now)
sleep $((DURATION - DURATION / 2))
steps=$(metric localpar_steps_total | tail -n +1 | sort -n | tail -1)
rss_end=$(metric localpar_resident_memory_bytes | tr '\n' ' ')
checkpoints=$(metric localpar_checkpoints_total | tail -1)
echo "soak: ${DURATION} s, 4 workers, checkpoint every 20 s, worker 1 killed at $((DURATION / 2)) s"
echo "  steps completed (stage 0 counter):   $steps"
echo "  checkpoints committed:               $checkpoints"
echo "  recovery time (kill to next step):   $(echo "$t_back - $t_kill" | bc) s"
echo "  resident memory, workers 0..3, at 15 s (bytes):   $rss_start"
echo "  resident memory, workers 0..3, at end (bytes):    $rss_end"
echo "  (worker 1 is the restarted process at the end)"
