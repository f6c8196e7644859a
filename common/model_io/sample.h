// Sampling from a trained language model, one token at a time, with a key-value cache.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/model_file.h"

namespace localpar {

struct SampleOptions {
  std::vector<int32_t> prompt;  // token ids below the model's vocabulary; at least one
  int64_t tokens = 200;         // new tokens to sample
  double temperature = 1.0;     // divides the logits; 0: always the likeliest token
  int64_t top_k = 0;            // sample among the k likeliest only; 0: all
  uint64_t seed = 1;
  bool cache = true;  // keep keys and values; false: the whole window for every token
};

struct SampleStats {
  int64_t tokens = 0;
  double seconds = 0;           // wall time for all of them, the prompt's first pass included
  int64_t positions_run = 0;    // positions the network computed, over all tokens
  int64_t window_restarts = 0;  // times the sequence outgrew the context
  bool cached = false;          // the key-value cache was used
  std::string note;             // why it was not, where it was asked for
};

// Samples `options.tokens` new tokens after the prompt from the last stage's head, passing
// each to `emit` as it is chosen. The network sees at most its context (its input positions):
// a longer prompt is cut to its last `context` tokens, and a sequence that outgrows the
// context goes on from its last half (learned positions cannot shift inside a key-value
// cache, so the cache starts again there). Without the cache every token runs that same
// window whole, so both give the same tokens up to rounding. The same options, weights and
// backend give the same tokens. Errors: not a language model, a prompt token outside the
// vocabulary, a bad option, logits that are not finite.
absl::StatusOr<SampleStats> SampleTokens(TrainedModel& model, const SampleOptions& options,
                                         const std::function<void(int32_t)>& emit);

// One token from a row of logits: the likeliest at temperature 0; otherwise drawn from
// softmax(logits / temperature) over the top_k likeliest (ties at the k-th all kept), with
// `u` in [0, 1) choosing by the cumulative probability.
int32_t ChooseToken(const std::vector<float>& logits, double temperature, int64_t top_k, double u);

}  // namespace localpar
