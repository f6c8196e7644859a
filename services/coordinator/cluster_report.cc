// Cluster reports.
#include "services/coordinator/cluster_report.h"

#include <algorithm>

namespace localpar {
namespace {

v1::StageFigures StageFiguresOf(int k, const v1::StatsResponse& s) {
  v1::StageFigures f;
  f.set_stage(k);
  double busy = 0;
  for (const auto& e : s.epochs()) busy += e.train_seconds();
  f.set_examples_per_second(busy > 0 ? s.examples() / busy : 0);
  f.set_resident_bytes(static_cast<double>(s.resident_bytes()));
  f.set_peak_resident_bytes(static_cast<double>(s.peak_resident_bytes()));
  f.set_cpu_seconds(s.train_cpu_seconds());
  f.set_compute_cpu_seconds(s.compute_cpu_seconds());
  if (s.epochs_size() > 0) {
    f.set_resident_bytes_first_epoch(static_cast<double>(s.epochs(0).resident_bytes()));
  }
  f.set_queue_max_depth(static_cast<int32_t>(s.queue_max_depth()));
  f.set_queue_capacity(static_cast<int32_t>(s.queue_capacity()));
  f.set_overlap_max_delay(static_cast<int32_t>(s.overlap_max_delay_seen()));
  f.set_overlap_mean_delay(s.overlap_mean_delay());
  int64_t rejected = 0;
  for (const auto& [reason, n] : s.rejected()) rejected += n;
  f.set_rejected(static_cast<double>(rejected));
  f.set_baseline_bytes(static_cast<double>(s.baseline_bytes()));
  f.set_state_bytes(static_cast<double>(s.state_bytes()));
  f.set_activation_bytes_per_example(static_cast<double>(s.activation_bytes_per_example()));
  for (const auto& e : s.epochs())
    f.add_resident_bytes_by_epoch(static_cast<double>(e.resident_bytes()));
  *f.mutable_phase_seconds() = s.phase_seconds();
  f.set_bytes_received(static_cast<double>(s.bytes_received()));
  f.set_bytes_sent(static_cast<double>(s.bytes_sent()));
  for (int64_t b : s.replica_allreduce_bytes()) {
    f.add_replica_exchange_bytes_sent(static_cast<double>(b));
  }
  f.set_exchange_bytes_sent(static_cast<double>(s.allreduce_bytes()));
  return f;
}

}  // namespace

void AddStageReports(const std::vector<v1::StatsResponse>& stats, v1::RunReport* report) {
  for (size_t k = 0; k < stats.size(); ++k) {
    *report->add_stage_reports() = StageFiguresOf(static_cast<int>(k), stats[k]);
  }
}

v1::Trace ClusterTrace(const std::vector<v1::StatsResponse>& stats) {
  v1::Trace trace;
  for (size_t k = 0; k < stats.size(); ++k) {
    v1::StageTrace* st = trace.add_stages();
    st->set_stage(static_cast<int>(k));
    for (const v1::Interval& iv : stats[k].intervals()) {
      v1::TraceInterval* t = st->add_intervals();
      t->set_seq(static_cast<double>(iv.seq()));
      t->set_start_ns(static_cast<double>(iv.start_ns()));
      t->set_end_ns(static_cast<double>(iv.end_ns()));
    }
  }
  return trace;
}

}  // namespace localpar
