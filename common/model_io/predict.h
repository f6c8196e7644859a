// Prediction with a trained model: examples read from a user's files, the training input
// transform applied, and one stage's head run on them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/model_file.h"

namespace localpar {

// Raw examples and, when known, their labels.
struct Examples {
  Shape example_shape;          // per example
  std::vector<float> raw;       // count * NumElements(example_shape), as the files hold them
  std::vector<int32_t> labels;  // empty, or count (per-position labels: count * positions)
  int64_t count = 0;
  bool pixel_bytes = false;  // the values were bytes 0..255 (IDX, PNG, uint8 arrays)
};

// Reads examples from `input`: an .npy array [count, ...] (float or integer), an IDX images
// file (gzipped or not), or an image folder (one subfolder of PNGs per class, labels from
// the folder names in sorted order). `labels` (optional) names an .npy integer array or an
// IDX labels file. Errors name the file and, for arrays, the index.
absl::StatusOr<Examples> ReadExamples(const std::string& input, const std::string& labels);

// Checks `examples` against the model (shape, label range) and applies its input transform.
// Returns the network's inputs.
absl::StatusOr<std::vector<float>> PrepareInputs(const TrainedModel& model,
                                                 const Examples& examples);

// Logits of stage `stage`'s head for every example, evaluated `batch` at a time:
// [count, classes] (or [count, positions, classes]) in *shape.
std::vector<float> PredictLogits(TrainedModel& model, int stage, const std::vector<float>& inputs,
                                 int64_t count, int64_t batch, Shape* shape);

// Softmax over the last dimension, in place.
void SoftmaxRows(std::vector<float>* values, int64_t classes);

}  // namespace localpar
