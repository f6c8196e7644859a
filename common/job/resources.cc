// The memory estimate behind `validate`'s resource check.
#include "common/job/resources.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/data_source.h"
#include "common/job/spec.h"
#include "common/nn/head.h"
#include "common/nn/layer.h"

namespace localpar {
namespace {

constexpr double kFloatBytes = 4;

double Elements(const Shape& s) {
  double n = 1;
  for (int64_t d : s) n *= static_cast<double>(d);
  return n;
}

double OptimizerMoments(const v1::Job& job) {
  if (job.optimizer().has_sgd()) return job.optimizer().sgd().momentum() > 0 ? 1 : 0;
  return 2;  // AdamW's first and second moments
}

// Replicas that synchronise every few steps keep the synchronised weights and the outer
// momentum too.
double OuterCopies(const v1::Job& job) { return job.replica_sync().every() > 1 ? 2 : 0; }

}  // namespace

std::string StageNeeds::RowsString() const {
  return eval_dominates() ? absl::StrFormat("%.0f evaluation rows (eval_batch_size)", eval_rows)
                          : absl::StrFormat("%.0f training rows (batch_size)", rows);
}

const StageNeeds* JobNeeds::largest() const {
  const StageNeeds* best = nullptr;
  for (const StageNeeds& s : stages) {
    if (!best || s.total() > best->total()) best = &s;
  }
  return best;
}

double JobNeeds::whole() const {
  double n = data_bytes;
  for (const StageNeeds& s : stages) n += s.total();
  return n;
}

JobNeeds EstimateJobNeeds(const v1::Job& job, bool per_replica) {
  JobNeeds out;
  const ModelConfig mc = ToModelConfig(job);
  const double batch = static_cast<double>(job.batch_size());
  const double rows = per_replica ? std::ceil(batch / std::max(1, job.replicas())) : batch;
  const double eval_rows = static_cast<double>(job.eval_batch_size());
  const double moments = OptimizerMoments(job);
  Shape cur = mc.input_shape;
  for (size_t k = 0; k < mc.stages.size(); ++k) {
    const StageConfig& st = mc.stages[k];
    StageNeeds n;
    n.label = absl::StrCat("stages[", k, "]", st.name.empty() ? "" : " (" + st.name + ")");
    n.parameters = static_cast<double>(StageParameterCount(st, cur, mc.classes));
    n.state_bytes = n.parameters * (2 + moments + OuterCopies(job)) * kFloatBytes;
    // Per example: the stage's input, and what each layer and head layer keeps for the
    // backward pass (LayerActivationValues).
    double per_example = Elements(cur);
    std::string error;
    auto walk = [&](const std::vector<LayerConfig>& layers, Shape& shape) {
      for (const LayerConfig& l : layers) {
        Shape next;
        if (!InferLayerShape(l, shape, &next, &error)) return;
        per_example += LayerActivationValues(l, shape);
        shape = next;
      }
    };
    walk(st.layers, cur);
    std::vector<LayerConfig> head;
    Shape h = cur;
    if (HeadLayers(st.head, cur, mc.classes, &head, &error)) walk(head, h);
    n.rows = rows;
    n.eval_rows = eval_rows;
    // Training keeps each value and its gradient; evaluation only the values.
    n.activation_bytes = std::max(2 * rows, eval_rows) * per_example * kFloatBytes;
    out.stages.push_back(std::move(n));
  }
  const DataSource& source = DataSourceOf(job.data());
  out.data_bytes = source.MemoryBytes(job.data(), mc.input_shape);
  if (out.data_bytes > 0) out.data_field = source.MemoryField(job.data());
  return out;
}

double MachineMemoryBytes() {
  double bytes =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  // A container's limit (cgroup v2, then v1) where it is the smaller.
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    double limit = 0;
    if (in >> limit && limit > 0) bytes = std::min(bytes, limit);
  }
  return bytes;
}

double MemoryLimitBytes(int64_t memory_limit_mib) {
  return memory_limit_mib > 0 ? static_cast<double>(memory_limit_mib) * (1 << 20)
                              : MachineMemoryBytes();
}

std::string ByteString(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%.0f B", bytes) : absl::StrFormat("%.1f %s", bytes, units[u]);
}

absl::Status CheckJobFits(const v1::Job& job, double limit_bytes, bool in_one_process) {
  const JobNeeds needs = EstimateJobNeeds(job, !in_one_process);
  const std::string limit =
      absl::StrCat(ByteString(limit_bytes), " (--memory_limit_mib; 0: this machine's memory)");
  if (needs.data_bytes > limit_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(needs.data_field, ": the synthetic data set takes about ",
                     ByteString(needs.data_bytes), " in memory; the limit is ", limit));
  }
  const StageNeeds* big = needs.largest();
  const double need = in_one_process ? needs.whole() : big->total();
  if (need <= limit_bytes) return absl::OkStatus();
  // Name the field that drives the larger part.
  const bool activations = big->activation_bytes > big->state_bytes;
  const std::string driver =
      activations ? absl::StrFormat("%s of activations for %s", ByteString(big->activation_bytes),
                                    big->RowsString())
                  : absl::StrFormat(
                        "%s of parameters, gradients and optimizer state (%.3g "
                        "parameters in its layers and head)",
                        ByteString(big->state_bytes), big->parameters);
  return absl::ResourceExhaustedError(absl::StrCat(
      in_one_process ? absl::StrCat("the job needs about ", ByteString(need),
                                    " in one process; its largest stage, ", big->label, ", ")
                     : absl::StrCat(big->label, " needs about ", ByteString(need), ": "),
      in_one_process ? "holds " : "", driver, "; the limit is ", limit));
}

}  // namespace localpar
