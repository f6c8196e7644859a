// Reading examples for prediction and running a trained model's head on them.
#include "common/model_io/predict.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/idx.h"
#include "common/data/image_folder.h"
#include "common/data/npy.h"
#include "common/io/regular_file.h"

namespace localpar {
namespace {

// Whether `path` starts with PNG's signature (whatever its name).
bool IsPng(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  return in.read(head, 8) && std::memcmp(head, "\x89PNG\r\n\x1a\n", 8) == 0;
}

// One PNG as one example. Its size and channels must be the network's: a colour image for
// a grey network (or the reverse) is refused, not converted, as in an image folder.
absl::Status ReadOnePng(const std::string& path, const Shape& expected, Examples* ex) {
  int64_t height = 0, width = 0;
  int stored = 0;
  absl::StatusOr<std::vector<uint8_t>> px = ReadPng(path, 0, &height, &width, &stored);
  if (!px.ok()) return px.status();
  const int64_t channels = stored <= 2 ? 1 : 3;  // alpha dropped
  const Shape got = {height, width, channels};
  if (expected.size() == 3 && got != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": a ", height, "x", width, channels == 1 ? " grey" : " colour",
                     " image; the network takes ", expected[0], "x", expected[1],
                     expected[2] == 1 ? " grey" : " colour", " images ", ShapeString(expected),
                     ": resize or convert it first"));
  }
  ex->count = 1;
  ex->example_shape = got;
  ex->raw.assign(px->begin(), px->end());
  ex->pixel_bytes = true;
  ex->files = {path};
  return absl::OkStatus();
}

Shape ShapeFromDims(const std::vector<int64_t>& dims) {  // without the count
  if (dims.size() == 3) return {dims[1], dims[2], 1};    // [count, rows, cols]: grey images
  return Shape(dims.begin() + 1, dims.end());
}

absl::Status ReadLabels(const std::string& path, int64_t count, Examples* out) {
  if (absl::EndsWith(path, ".npy")) {
    absl::StatusOr<NpyArray> a = ReadNpyFile(path);
    if (!a.ok()) return a.status();
    if (!a->is_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": labels must be integers, the array holds ", a->dtype));
    }
    if (a->shape.empty() || a->shape[0] != count) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": holds ",
                                                     a->shape.empty() ? 0 : a->shape[0],
                                                     " labels for ", count, " examples"));
    }
    // One class per example: [count] (or [count, 1]), never a table read as a longer list.
    if (a->count() != count) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": its shape is [",
                                                     absl::StrJoin(a->shape, ","),
                                                     "], one label per example is [", count, "]"));
    }
    for (int64_t i = 0; i < a->count(); ++i) {
      double v = a->at(i);
      if (v < 0 || v > 1e9) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": label ", i, " is ", v));
      }
      out->labels.push_back(static_cast<int32_t>(v));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<IdxArray> idx = ReadIdxFile(path);
  if (!idx.ok()) return idx.status();
  if (idx->dims.size() != 1 || idx->dims[0] != count) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": holds ",
                                                   idx->dims.empty() ? 0 : idx->dims[0],
                                                   " labels for ", count, " examples"));
  }
  out->labels.assign(idx->data.begin(), idx->data.end());
  return absl::OkStatus();
}

// See PrepareInputs.
absl::Status CheckInputRange(const InputNormalization& norm, const Examples& ex, bool scaled) {
  const bool takes_pixels = norm.scale != 1.0f;
  if (!takes_pixels) {
    if (scaled) {
      return absl::InvalidArgumentError(
          "--input_scaled: this model was not trained on pixel bytes; it takes its inputs as "
          "the training files held them");
    }
    return absl::OkStatus();
  }
  if (ex.raw.empty()) return absl::OkStatus();
  const auto [lo, hi] = std::minmax_element(ex.raw.begin(), ex.raw.end());
  if (scaled) {
    if (*lo < 0.0f || *hi > 1.0f) {
      const float* bad = *lo < 0.0f ? &*lo : &*hi;
      return absl::InvalidArgumentError(absl::StrCat(
          "element ", bad - ex.raw.data(), " is ", *bad,
          ", outside [0, 1]: --input_scaled says the pixels are already scaled to [0, 1]"));
    }
    return absl::OkStatus();
  }
  if (!ex.pixel_bytes && *hi <= 1.0f && *hi > 0.0f && *lo >= 0.0f) {
    return absl::InvalidArgumentError(
        "every value lies within [0, 1], but this model takes raw pixel values 0..255, as its "
        "training files held them (it scales them by 1/255 itself); if the examples are "
        "already scaled (torchvision's ToTensor() does that), pass --input_scaled");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Examples> ReadExamples(const std::string& input, const std::string& labels,
                                      const Shape& expected) {
  Examples ex;
  std::error_code ec;
  const bool image = expected.size() == 3;
  if (std::filesystem::is_directory(input, ec)) {
    // Class folders (labels from their names), or a flat folder of unlabelled images.
    bool folders = false;
    for (const auto& e : std::filesystem::directory_iterator(input, ec)) {
      folders = folders || e.is_directory();
    }
    const int64_t h = image ? expected[0] : 0, w = image ? expected[1] : 0;
    absl::StatusOr<ImageFolder> f =
        folders ? ReadImageFolder(input, {}, h, w) : ReadFlatImageFolder(input, h, w);
    if (!f.ok()) return f.status();
    ex.example_shape = {f->height, f->width, f->channels};
    ex.raw.assign(f->pixels.begin(), f->pixels.end());
    ex.labels = f->labels;
    ex.count = f->count();
    ex.pixel_bytes = true;
    ex.files = f->files;
    ex.label_names = f->classes;
  } else if (CheckRegularFile(input).ok() && IsPng(input)) {
    if (absl::Status s = ReadOnePng(input, expected, &ex); !s.ok()) return s;
  } else if (absl::EndsWith(input, ".npy")) {
    absl::StatusOr<NpyArray> a = ReadNpyFile(input);
    if (!a.ok()) return a.status();
    if (a->shape.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          input, ": expected [count, ...] with at least 2 dimensions, got ", a->shape.size()));
    }
    ex.count = a->shape[0];
    ex.example_shape = ShapeFromDims(a->shape);
    ex.raw.resize(static_cast<size_t>(a->count()));
    for (int64_t i = 0; i < a->count(); ++i) {
      ex.raw[i] = static_cast<float>(a->at(i));
      if (!std::isfinite(ex.raw[i])) {
        return absl::InvalidArgumentError(absl::StrCat(input, ": element ", i, " is not finite"));
      }
    }
    ex.pixel_bytes = a->dtype == "u1";
  } else {
    if (!expected.empty()) {
      // The header first: [count, rows, cols(, channels)] against the network's input.
      absl::StatusOr<std::vector<int64_t>> dims = ReadIdxDims(input);
      if (!dims.ok()) return dims.status();
      int64_t per = 1;
      for (size_t i = 1; i < dims->size(); ++i) {
        const int64_t d = (*dims)[i];
        per = d > 0 && per <= (int64_t{1} << 40) / d ? per * d : -1;  // -1: absurd, refused
        if (per < 0) break;
      }
      if (dims->size() < 2 || per != NumElements(expected)) {
        return absl::InvalidArgumentError(absl::StrCat(
            input, ": its header says examples of ",
            dims->size() < 2 ? std::string("no") : (per < 0 ? "over 2^40" : absl::StrCat(per)),
            " values each, the network takes ", ShapeString(expected), " (", NumElements(expected),
            " values); nothing was decoded"));
      }
    }
    absl::StatusOr<IdxArray> idx = ReadIdxFile(input);
    if (!idx.ok()) return idx.status();
    if (idx->dims.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(input, ": an IDX images file has at least 2 dimensions"));
    }
    ex.count = idx->dims[0];
    ex.example_shape = ShapeFromDims(idx->dims);
    ex.raw.assign(idx->data.begin(), idx->data.end());
    ex.pixel_bytes = true;
  }
  if (ex.count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(input,
                                                   ": holds no examples (its first "
                                                   "dimension is 0); nothing to predict"));
  }
  if (!labels.empty()) {
    ex.labels.clear();
    if (absl::Status s = ReadLabels(labels, ex.count, &ex); !s.ok()) return s;
  }
  return ex;
}

std::string SafeClassName(const std::string& name) {
  std::string out = name;
  for (char& ch : out) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '.') ch = '_';
  }
  return out;
}

absl::Status MatchClassNames(const TrainedModel& model, Examples* ex) {
  const auto& names = model.weights.class_names();
  if (ex->label_names.empty() || names.empty()) return absl::OkStatus();
  std::vector<int32_t> to_model(ex->label_names.size());
  for (size_t c = 0; c < ex->label_names.size(); ++c) {
    // The name itself, its safe form (T-shirt/top as T-shirt_top), or the class's number.
    const std::string& folder = ex->label_names[c];
    int found = -1;
    for (int k = 0; k < names.size() && found < 0; ++k) {
      if (folder == names[k] || folder == SafeClassName(names[k]) || folder == absl::StrCat(k)) {
        found = k;
      }
    }
    if (found < 0) {
      std::vector<std::string> safe;
      for (const std::string& n : names) safe.push_back(SafeClassName(n));
      return absl::InvalidArgumentError(absl::StrCat(
          "class folder ", folder, " is not one of the model's classes (",
          absl::StrJoin(safe, ", "), "; or the class's number 0..", names.size() - 1, ")"));
    }
    to_model[c] = found;
  }
  for (int32_t& l : ex->labels) l = to_model[l];
  ex->label_names.assign(names.begin(), names.end());
  return absl::OkStatus();
}

std::string ClassName(const TrainedModel& model, int64_t i) {
  if (i < model.weights.class_names_size()) return model.weights.class_names(static_cast<int>(i));
  return absl::StrCat("class ", i);
}

absl::Status CheckLabels(const TrainedModel& model, const Examples& ex) {
  const int64_t per = ex.labels.size() / std::max<int64_t>(1, ex.count);
  for (size_t i = 0; i < ex.labels.size(); ++i) {
    if (ex.labels[i] >= model.config.classes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", i / per, " is ", ex.labels[i],
                                                     ", but the network has ", model.config.classes,
                                                     " classes"));
    }
  }
  return absl::OkStatus();
}

std::string ToChannelsLast(const Shape& want, Examples* ex) {
  const Shape got = ex->example_shape;  // a copy: replaced below
  if (want.size() != 3 || got.size() != 3 || got == want) return "";
  if (got != Shape{want[2], want[0], want[1]}) return "";
  const int64_t c = want[2], hw = want[0] * want[1], per = c * hw;
  std::vector<float> x(ex->raw.size());
  for (int64_t n = 0; n < ex->count; ++n) {
    const float* from = ex->raw.data() + n * per;
    float* to = x.data() + n * per;
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t p = 0; p < hw; ++p) to[p * c + k] = from[k * hw + p];
    }
  }
  ex->raw = std::move(x);
  ex->example_shape = want;
  return absl::StrCat("read [N, ", got[0], ", ", got[1], ", ", got[2],
                      "] as channels first (PyTorch's NCHW) and transposed to the network's [N, ",
                      want[0], ", ", want[1], ", ", want[2], "]");
}

absl::StatusOr<std::vector<float>> PrepareInputs(const TrainedModel& model, const Examples& ex,
                                                 bool scaled) {
  const Shape& want = model.config.input_shape;
  Shape got = ex.example_shape;
  // A sequence model's [count, positions] arrays arrive as [positions]; grey images as
  // [h, w, 1]. Accept [h, w] input for an [h, w, 1] network and the reverse.
  if (got != want && NumElements(got) == NumElements(want) && want.size() + 1 == got.size() &&
      got.back() == 1) {
    got = want;
  }
  if (got != want) {
    std::string hint;
    if (got.size() == want.size() && NumElements(got) == NumElements(want)) {
      hint = "; the same values in another order: transpose them to the network's";
    }
    return absl::InvalidArgumentError(
        absl::StrCat("the examples have shape ", ShapeString(ex.example_shape),
                     ", the network takes ", ShapeString(want), hint));
  }
  std::vector<float> x = ex.raw;
  if (const int64_t vocab = model.model->stage(0).token_vocab(); vocab > 0) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (!(x[i] >= 0 && x[i] < static_cast<float>(vocab)) || x[i] != std::floor(x[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("element ", i, " is ", x[i], ", not a token id 0..", vocab - 1));
      }
    }
    return x;
  }
  InputNormalization norm = model.normalization;
  if (absl::Status s = CheckInputRange(norm, ex, scaled); !s.ok()) return s;
  if (scaled) norm.scale = 1.0f;
  ApplyNormalization(norm, x.data(), static_cast<int64_t>(x.size()));
  return x;
}

std::vector<float> PredictLogits(TrainedModel& model, int stage, const std::vector<float>& inputs,
                                 int64_t count, int64_t batch, Shape* shape) {
  Backend& be = *model.backend;
  const int64_t per = NumElements(model.config.input_shape);
  std::vector<float> out;
  ForwardContext ctx;
  ctx.train = false;
  for (int64_t begin = 0; begin < count; begin += batch) {
    const int64_t n = std::min(batch, count - begin);
    Shape xs{n};
    xs.insert(xs.end(), model.config.input_shape.begin(), model.config.input_shape.end());
    Tensor x;
    if (model.model->stage(0).input_dtype() == DType::kI32) {  // token ids, checked whole
      const float* from = inputs.data() + begin * per;
      x = Tensor::FromHostI32(be, xs, std::vector<int32_t>(from, from + n * per));
    } else {
      x = Tensor::FromHost(be, xs, inputs.data() + begin * per);
    }
    const Tensor* cur = &x;
    for (int k = 0; k <= stage; ++k) cur = &model.model->stage(k).Forward(*cur, 0, ctx);
    const Tensor& logits = model.model->stage(stage).HeadLogits(0, ctx);
    std::vector<float> host = logits.ToHost();
    out.insert(out.end(), host.begin(), host.end());
    *shape = logits.shape();
  }
  (*shape)[0] = count;
  return out;
}

void SoftmaxRows(std::vector<float>* values, int64_t classes) {
  for (size_t r = 0; r + classes <= values->size(); r += classes) {
    float* v = values->data() + r;
    float mx = *std::max_element(v, v + classes);
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(v[c] - mx));
    for (int64_t c = 0; c < classes; ++c) {
      v[c] = static_cast<float>(std::exp(static_cast<double>(v[c] - mx)) / sum);
    }
  }
}

}  // namespace localpar
