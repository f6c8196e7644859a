// Adding up a stage's replicas.
#include "services/coordinator/replica_stats.h"

#include <algorithm>
#include <map>

namespace localpar {
namespace {

void AddHead(const v1::HeadStatistics& from, v1::HeadStatistics* to) {
  to->set_loss_sum(to->loss_sum() + from.loss_sum());
  to->set_correct(to->correct() + from.correct());
  to->set_count(to->count() + from.count());
}

}  // namespace

v1::StatsResponse MergeReplicaStats(const std::vector<const v1::StatsResponse*>& replicas) {
  v1::StatsResponse out = *replicas.at(0);
  out.set_replica(0);
  out.clear_replica_allreduce_bytes();
  if (replicas.size() > 1) {
    for (const v1::StatsResponse* s : replicas)
      out.add_replica_allreduce_bytes(s->allreduce_bytes());
  }
  std::map<int, int> epoch_at;  // epoch number -> index in out.epochs
  for (int i = 0; i < out.epochs_size(); ++i) epoch_at[out.epochs(i).epoch()] = i;
  for (size_t r = 1; r < replicas.size(); ++r) {
    const v1::StatsResponse& s = *replicas[r];
    // The replicas step together; a step counts once it is everywhere.
    out.set_steps(std::min(out.steps(), s.steps()));
    out.set_examples(out.examples() + s.examples());
    AddHead(s.recent(), out.mutable_recent());
    for (const v1::EpochStatistics& e : s.epochs()) {
      auto it = epoch_at.find(e.epoch());
      if (it == epoch_at.end()) {
        epoch_at[e.epoch()] = out.epochs_size();
        *out.add_epochs() = e;
        continue;
      }
      v1::EpochStatistics* o = out.mutable_epochs(it->second);
      AddHead(e.train(), o->mutable_train());
      AddHead(e.eval(), o->mutable_eval());
      o->set_train_seconds(std::max(o->train_seconds(), e.train_seconds()));
      o->set_resident_bytes(o->resident_bytes() + e.resident_bytes());
    }
    for (const auto& [reason, n] : s.rejected()) (*out.mutable_rejected())[reason] += n;
    out.set_queue_max_depth(std::max(out.queue_max_depth(), s.queue_max_depth()));
    out.set_queue_depth(std::max(out.queue_depth(), s.queue_depth()));
    out.set_resident_bytes(out.resident_bytes() + s.resident_bytes());
    out.set_peak_resident_bytes(out.peak_resident_bytes() + s.peak_resident_bytes());
    out.set_train_cpu_seconds(out.train_cpu_seconds() + s.train_cpu_seconds());
    out.set_compute_cpu_seconds(out.compute_cpu_seconds() + s.compute_cpu_seconds());
    // Bytes add up over the replicas' links; phase times stay replica 0's (they step together).
    out.set_bytes_received(out.bytes_received() + s.bytes_received());
    out.set_bytes_sent(out.bytes_sent() + s.bytes_sent());
    out.set_allreduce_seconds(std::max(out.allreduce_seconds(), s.allreduce_seconds()));
    out.set_allreduce_bytes(out.allreduce_bytes() + s.allreduce_bytes());
  }
  return out;
}

void MergeReplicaScores(const v1::Ack& from, v1::Ack* into) {
  for (const v1::StageScore& f : from.scores()) {
    v1::StageScore* same = nullptr;
    for (v1::StageScore& t : *into->mutable_scores()) {
      if (t.stage() == f.stage()) same = &t;
    }
    if (!same) {
      *into->add_scores() = f;
      continue;
    }
    AddHead(f.eval(), same->mutable_eval());
    AddHead(f.train(), same->mutable_train());
    same->set_train_seconds(std::max(same->train_seconds(), f.train_seconds()));
  }
}

}  // namespace localpar
