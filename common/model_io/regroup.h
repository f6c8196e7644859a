// Resuming a checkpoint with another layout of the same network: another stage split
// (--stages, or a job that groups the same layers otherwise), another replica count, or
// another update rule.
// Every layer's parameters and optimizer state carry over exactly, and so does each head
// whose boundary both layouts have; a head at a new boundary starts from the job's seeded
// initialisation. Anything else about the job (its layers, data, rule, optimizer, schedule,
// seed, ...) cannot change on resume and is refused, naming what differs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/checkpoint.h"
#include "common/model_io/stage_snapshot.h"
#include "common/nn/model.h"
#include "proto/checkpoint.pb.h"
#include "proto/job.pb.h"
#include "proto/report.pb.h"

namespace localpar {

// Where `localpar run` keeps a worker's storage under its checkpoint directory: root/stage-K,
// or root/stage-K-replica-R when the job has replicas.
std::string LocalSnapshotDir(const std::string& root, int stage, int replica, int replicas);

// What resuming a checkpoint as another job's layout (and perhaps rule) does.
struct RegroupPlan {
  int from_stages = 0, from_replicas = 1, to_stages = 0, to_replicas = 1;
  std::string from_rule, to_rule;  // UpdateRule names (with micro-batches when they differ)
  int64_t step = 0;                // the checkpoint's
  int sync_every = 0;  // replica_sync.every of a checkpoint whose replicas synchronise rarely
  std::vector<std::string> kept_heads;    // both layouts have their boundary ("heads.7")
  std::vector<std::string> fresh_heads;   // the job's heads the checkpoint has none for
  std::vector<std::string> unused_heads;  // the checkpoint's heads the job has no place for
  std::vector<std::string> head_notes;    // why a head at a kept boundary starts fresh
};

// The job a checkpoint was written for (CheckpointManifest.job_spec); FAILED_PRECONDITION for
// a checkpoint written before manifests recorded it, naming `where`.
absl::StatusOr<v1::Job> CheckpointJob(const v1::CheckpointManifest& m, const std::string& where);

// What differs between two jobs besides their layout, one phrase per field ("the rule (the
// checkpoint's GREEDY, this job's BACKPROP)"); empty when only the layout differs.
std::vector<std::string> NetworkDifferences(const v1::Job& checkpoint, const v1::Job& job);

// The plan for resuming checkpoint `m` (in directory `where`) as `job`; INVALID_ARGUMENT
// naming every field that cannot change.
absl::StatusOr<RegroupPlan> PlanRegroup(const v1::CheckpointManifest& m, const std::string& where,
                                        const v1::Job& job);
// "4 stages x 1 replica".
std::string LayoutName(int stages, int replicas);
// One line for the console: what carries over and what starts fresh.
std::string DescribeRegroup(const RegroupPlan& plan);
// The same as the report records it.
v1::Regroup RegroupRecord(const RegroupPlan& plan);

// Where the checkpoint's snapshot of replica `replica` of stage `stage` is kept.
using SnapshotRoots = std::function<std::string(int stage, int replica)>;

// Reads every stage of checkpoint `m` (each snapshot checked against the manifest: size,
// checksum, run) and puts its state into `model`, built from `job`: every layer's
// parameters and optimizer moments, the heads both layouts have, and the optimizer's step
// count. Fresh heads keep the model's seeded values and start with zero moments. The
// checkpoint's stages are read one at a time, so this holds `model` and one of them (and
// two float copies of its parameters for replicas that synchronise every few steps). On an
// error `model` may be partly written: discard it.
// `progress` receives, per stage of `model`, the epoch's training figures so far: a kept
// head's, summed over the checkpoint's replicas (zero for a fresh head).
// Replicas that synchronise every few steps (replica_sync.every > 1) are synchronised first:
// if any replica's weights differ from the synchronised ones (a checkpoint between
// synchronisations), their pseudo-gradients drive one outer step (OuterSync, as after a
// run's last step), so `model` receives the synchronised weights (as its parameters and as
// Param::outer), the outer momentum, the running statistics' mean over the replicas, and
// replica 0's optimizer moments. `synchronise` false skips that and gives `model` replica 0's
// state as it is: for a resume in the checkpoint's own layout, where every replica then reads
// its own snapshots.
absl::Status LoadCheckpointInto(const v1::CheckpointManifest& m, const std::string& where,
                                const SnapshotRoots& roots, const v1::Job& job, Model& model,
                                std::vector<EpochProgress>* progress, bool synchronise = true);

// Whether `p` changes anything: the stages, the replicas, the rule or the heads.
bool ChangesLayout(const RegroupPlan& p);

// Regroups checkpoint `from` for `job`: writes every stage's snapshot, for every replica, to
// `to_roots`, then its manifest as checkpoint `id` under `root` (the same step and data
// cursor, `fingerprint` and `network`, the report's history with this regroup added).
// Returns the checkpoint written; the original is left as it was.
absl::StatusOr<FoundCheckpoint> WriteRegroupedCheckpoint(
    const FoundCheckpoint& from, const SnapshotRoots& from_roots, const v1::Job& job,
    const std::string& fingerprint, const std::string& network, const SnapshotRoots& to_roots,
    const std::string& root, uint64_t id);

// The checkpoint a resume of `job` continues: the newest committed one under `root` that is
// this run's (`fingerprint`) or the same network's in another layout (`network`). When there
// is none, the error says why the newest other one does not fit.
// `only`: that checkpoint id alone (--resume=DIR/ckpt-N), 0: the newest that fits.
absl::StatusOr<FoundCheckpoint> FindCheckpointToResume(const std::string& root,
                                                       const std::string& fingerprint,
                                                       const std::string& network,
                                                       const v1::Job& job, uint64_t only = 0);

}  // namespace localpar
