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
  bool pixel_bytes = false;              // the values were bytes 0..255 (IDX, PNG, uint8 arrays)
  std::vector<std::string> files;        // an image folder's: each example's file
  std::vector<std::string> label_names;  // an image folder's: label i is its folder name
};

// Reads examples from `input`: an .npy array [count, ...] (float or integer), an IDX images
// file (gzipped or not), or an image folder (one subfolder of PNGs per class, labels from
// the folder names in sorted order), or a flat folder of PNGs (no labels). `labels` (optional)
// names an .npy integer array or an IDX labels file. Errors name the file and, for arrays, the
// index. `expected` (the network's per-example shape; empty: any) is checked against an IDX header
// or each PNG's header before anything is decoded.
absl::StatusOr<Examples> ReadExamples(const std::string& input, const std::string& labels,
                                      const Shape& expected = {});

// An image folder's labels follow its own sorted folder names; a model that knows its
// classes' names gets them renumbered by name (a folder holding some of the classes only, or
// named in another order, still scores right). A folder name the model does not know is an
// error naming it. Nothing changes for a model without names or examples without folders.
absl::Status MatchClassNames(const TrainedModel& model, Examples* examples);

// A class name as a folder may hold it: every character but letters, digits, '-' and '.'
// becomes '_' ("T-shirt/top" -> "T-shirt_top").
std::string SafeClassName(const std::string& name);

// Channels-first images ([C, H, W] per example, PyTorch's and ONNX's layout) for a network
// that takes [H, W, C]: transposed in place, returning what was done ("" when nothing was).
// The order is unambiguous: [C, H, W] is not [H, W, C] unless both are the same shape.
std::string ToChannelsLast(const Shape& want, Examples* examples);

// Label i's name: the model's own, or "class i" when it was trained without names.
std::string ClassName(const TrainedModel& model, int64_t i);

// Checks the examples' labels against the model's class count.
absl::Status CheckLabels(const TrainedModel& model, const Examples& examples);

// Checks `examples` against the model's input shape and applies its input transform.
// Returns the network's inputs. A model trained on pixel bytes scales them by 1/255 itself:
// it takes raw values 0..255, or, with `scaled`, values already in [0, 1]. Values that
// contradict that (all within [0, 1] without `scaled`, any outside it with) are refused:
// either way the predictions would be garbage. A language model's inputs must be token ids
// below its vocabulary.
absl::StatusOr<std::vector<float>> PrepareInputs(const TrainedModel& model,
                                                 const Examples& examples, bool scaled = false);

// Logits of stage `stage`'s head for every example, evaluated `batch` at a time:
// [count, classes] (or [count, positions, classes]) in *shape.
std::vector<float> PredictLogits(TrainedModel& model, int stage, const std::vector<float>& inputs,
                                 int64_t count, int64_t batch, Shape* shape);

// Softmax over the last dimension, in place.
void SoftmaxRows(std::vector<float>* values, int64_t classes);

}  // namespace localpar
