// Sampling from a trained language model: the window, the key-value cache and the choice.
#include "common/model_io/sample.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/core/rng.h"
#include "common/model_io/predict.h"

namespace localpar {
namespace {

absl::Status CheckSampling(const TrainedModel& m, Model& model, const SampleOptions& o) {
  const int64_t vocab = model.stage(0).token_vocab();
  if (vocab <= 0 || m.config.input_shape.size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sampling needs a language model (token ids [positions] into an embedding); this "
        "network takes ",
        ShapeString(m.config.input_shape), vocab > 0 ? " token ids" : " values"));
  }
  if (m.config.classes > vocab) {
    return absl::FailedPreconditionError(
        absl::StrCat("the network predicts ", m.config.classes, " classes but its embedding reads ",
                     vocab, " token ids: a sampled token could not be fed back"));
  }
  if (o.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (size_t i = 0; i < o.prompt.size(); ++i) {
    if (o.prompt[i] < 0 || o.prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", o.prompt[i],
                                                     ", outside the vocabulary 0..", vocab - 1));
    }
  }
  if (o.tokens < 0) return absl::InvalidArgumentError("tokens must be >= 0");
  if (!std::isfinite(o.temperature) || o.temperature < 0) {
    return absl::InvalidArgumentError("temperature must be a finite number >= 0");
  }
  if (o.top_k < 0) return absl::InvalidArgumentError("top_k must be >= 0");
  return absl::OkStatus();
}

// The logits of the window's last position: predict's whole forward pass over the window
// [start, end) of `seq`, padded to the context (causal attention never looks right).
std::vector<float> WholeWindow(TrainedModel& m, const std::vector<int32_t>& seq, int64_t start,
                               int64_t context) {
  std::vector<float> window(static_cast<size_t>(context), 0.0f);
  std::copy(seq.begin() + start, seq.end(), window.begin());
  Shape shape;
  std::vector<float> all = PredictLogits(m, m.model->num_stages() - 1, window, 1, 1, &shape);
  const int64_t classes = m.config.classes, row = static_cast<int64_t>(seq.size()) - 1 - start;
  return {all.begin() + row * classes, all.begin() + (row + 1) * classes};
}

// The logits of positions [from, end) of `seq` through every stage's decoding form, the
// window starting at `start`; empty when some layer has none.
std::vector<float> Decoded(TrainedModel& m, const std::vector<int32_t>& seq, int64_t from,
                           int64_t start, std::vector<std::vector<DecodeCache>>* caches) {
  Model& model = *m.model;
  const int64_t count = static_cast<int64_t>(seq.size()) - from;
  Tensor x =
      Tensor::FromHostI32(*m.backend, {count}, std::vector<int32_t>(seq.begin() + from, seq.end()));
  const Tensor* cur = &x;
  const int last = model.num_stages() - 1;
  for (int k = 0; k <= last && cur != nullptr; ++k) {
    cur = model.stage(k).DecodePositions(*cur, from - start, k == last, &(*caches)[k]);
  }
  if (cur == nullptr) return {};
  std::vector<float> all = cur->ToHost();
  const int64_t classes = m.config.classes;
  return {all.end() - classes, all.end()};
}

}  // namespace

int32_t ChooseToken(const std::vector<float>& logits, double temperature, int64_t top_k, double u) {
  const int64_t n = static_cast<int64_t>(logits.size());
  const int64_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (temperature == 0.0) return static_cast<int32_t>(best);
  float threshold = -INFINITY;
  if (top_k > 0 && top_k < n) {
    std::vector<float> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                     std::greater<float>());
    threshold = sorted[top_k - 1];
  }
  std::vector<double> w(static_cast<size_t>(n), 0.0);
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (logits[j] < threshold) continue;
    w[j] = std::exp((static_cast<double>(logits[j]) - logits[best]) / temperature);
    sum += w[j];
  }
  const double target = u * sum;
  double cumulative = 0.0;
  int64_t chosen = best;
  for (int64_t j = 0; j < n; ++j) {
    if (w[j] == 0.0) continue;
    cumulative += w[j];
    chosen = j;
    if (cumulative > target) break;
  }
  return static_cast<int32_t>(chosen);
}

absl::StatusOr<SampleStats> SampleTokens(TrainedModel& m, const SampleOptions& o,
                                         const std::function<void(int32_t)>& emit) {
  Model& model = *m.model;
  if (absl::Status s = CheckSampling(m, model, o); !s.ok()) return s;
  const int64_t context = m.config.input_shape[0], keep = std::max<int64_t>(1, context / 2);
  std::vector<int32_t> seq = o.prompt;
  int64_t start = std::max<int64_t>(0, static_cast<int64_t>(seq.size()) - context);
  std::vector<std::vector<DecodeCache>> caches(static_cast<size_t>(model.num_stages()));
  bool valid = false;  // the caches hold positions [start, seq.size() - 1)
  Rng rng(o.seed);
  SampleStats stats;
  stats.cached = o.cache;
  const auto began = std::chrono::steady_clock::now();
  while (stats.tokens < o.tokens) {
    const int64_t end = static_cast<int64_t>(seq.size());
    if (end - start > context) {
      start = end - keep;
      valid = false;
      ++stats.window_restarts;
    }
    std::vector<float> row;
    if (stats.cached) {
      const int64_t from = valid ? end - 1 : start;
      row = Decoded(m, seq, from, start, &caches);
      if (row.empty()) {
        stats.cached = false;
        stats.note = "a layer of this network has no decoding form: every token runs the window";
        continue;
      }
      stats.positions_run += end - from;
      valid = true;
    } else {
      row = WholeWindow(m, seq, start, context);
      stats.positions_run += context;
    }
    for (float v : row) {
      if (!std::isfinite(v)) {
        return absl::InternalError(absl::StrCat("the network's logits are not finite at new token ",
                                                stats.tokens, " (are the weights trained?)"));
      }
    }
    const double u = static_cast<double>(rng.NextU64() >> 11) * 0x1.0p-53;
    const int32_t next = ChooseToken(row, o.temperature, o.top_k, u);
    seq.push_back(next);
    ++stats.tokens;
    emit(next);
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return stats;
}

}  // namespace localpar
