// NumPy and image-folder data sets, and holdout splits.
#include "common/data/user_data.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/image_folder.h"
#include "common/data/npy.h"

namespace localpar {
namespace {

absl::StatusOr<Shape> ExampleShapeOf(const NpyArray& a, const std::string& name) {
  if (a.shape.size() == 2) return Shape{a.shape[1]};
  if (a.shape.size() == 3) return Shape{a.shape[1], a.shape[2], 1};
  if (a.shape.size() == 4) return Shape{a.shape[1], a.shape[2], a.shape[3]};
  return absl::InvalidArgumentError(
      absl::StrCat(name,
                   ": inputs must be [count, features], [count, rows, cols] or [count, rows, cols, "
                   "channels], got ",
                   a.shape.size(), " dimensions"));
}

// Fills `d` from inputs x and labels y (named for errors); *pixel_bytes says whether x
// held uint8.
absl::Status ToDataset(const NpyArray& x, const std::string& xname, const NpyArray& y,
                       const std::string& yname, int64_t limit, Dataset* d, bool* pixel_bytes) {
  absl::StatusOr<Shape> shape = ExampleShapeOf(x, xname);
  if (!shape.ok()) return shape.status();
  if (!x.is_float() && x.dtype != "u1") {
    return absl::InvalidArgumentError(absl::StrCat(
        xname, ": inputs must be float32/float64 or uint8, the array holds ", x.dtype));
  }
  if (!y.is_integer()) {
    return absl::InvalidArgumentError(
        absl::StrCat(yname, ": labels must be integers, the array holds ", y.dtype));
  }
  if (y.shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(yname, ": labels must be [count], got ", y.shape.size(), " dimensions"));
  }
  if (y.shape[0] != x.shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat(xname, " holds ", x.shape[0], " examples but ",
                                                   yname, " holds ", y.shape[0], " labels"));
  }
  *pixel_bytes = x.dtype == "u1";
  d->example_shape = *shape;
  int64_t n = x.shape[0];
  if (limit > 0 && limit < n) n = limit;
  const int64_t per = NumElements(*shape);
  d->x.resize(static_cast<size_t>(n * per));
  for (int64_t i = 0; i < n * per; ++i) {
    const float v = static_cast<float>(x.at(i));
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(xname, ": example ", i / per, " holds a non-finite value"));
    }
    d->x[i] = *pixel_bytes ? v * (1.0f / 255.0f) : v;
  }
  d->y.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double v = y.at(i);
    if (v < 0 || v > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat(yname, ": label ", i, " is ", v, "; labels are class numbers 0, 1, ..."));
    }
    d->y[i] = static_cast<int32_t>(v);
  }
  return absl::OkStatus();
}

int32_t MaxLabel(const Dataset& d) {
  int32_t m = -1;
  for (int32_t v : d.y) m = std::max(m, v);
  return m;
}

absl::StatusOr<DataSplit> Finish(DataSplit s, const std::string& what) {
  if (!s.test.y.empty() && s.test.example_shape != s.train.example_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the test examples have shape ", ShapeString(s.test.example_shape),
                     ", the training examples ", ShapeString(s.train.example_shape)));
  }
  s.test.example_shape = s.train.example_shape;
  const int32_t classes = std::max(MaxLabel(s.train), MaxLabel(s.test)) + 1;
  if (classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": every label is 0; a classifier needs at least 2 classes"));
  }
  s.train.classes = s.test.classes = classes;
  return s;
}

}  // namespace

absl::StatusOr<DataSplit> LoadNumpy(const NumpySource& src, int64_t train_limit,
                                    int64_t test_limit) {
  std::map<std::string, NpyArray> arrays;
  std::map<std::string, std::string> names;
  if (!src.npz.empty()) {
    absl::StatusOr<std::map<std::string, NpyArray>> z = ReadNpzFile(src.npz);
    if (!z.ok()) return z.status();
    arrays = *std::move(z);
    for (const char* k : {"x_train", "y_train", "x_test", "y_test"}) {
      names[k] = absl::StrCat(src.npz, ":", k, ".npy");
    }
    for (const char* k : {"x_train", "y_train"}) {
      if (!arrays.count(k)) {
        return absl::InvalidArgumentError(
            absl::StrCat(src.npz, ": has no array ", k,
                         " (an .npz needs x_train and y_train, and may have "
                         "x_test and y_test)"));
      }
    }
  } else {
    const std::pair<const char*, const std::string*> files[] = {{"x_train", &src.x_train},
                                                                {"y_train", &src.y_train},
                                                                {"x_test", &src.x_test},
                                                                {"y_test", &src.y_test}};
    for (const auto& [key, path] : files) {
      if (path->empty()) continue;
      absl::StatusOr<NpyArray> a = ReadNpyFile(*path);
      if (!a.ok()) return a.status();
      arrays[key] = *std::move(a);
      names[key] = *path;
    }
    if (!arrays.count("x_train") || !arrays.count("y_train")) {
      return absl::InvalidArgumentError(
          "data.numpy: set npz, or x_train and y_train (and optionally x_test and y_test)");
    }
  }
  if (arrays.count("x_test") != arrays.count("y_test")) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.numpy: x_test and y_test come together (",
                     arrays.count("x_test") ? names["x_test"] : names["y_test"], " has no pair)"));
  }
  DataSplit s;
  bool train_bytes = false, test_bytes = false;
  if (absl::Status st = ToDataset(arrays["x_train"], names["x_train"], arrays["y_train"],
                                  names["y_train"], train_limit, &s.train, &train_bytes);
      !st.ok()) {
    return st;
  }
  if (arrays.count("x_test")) {
    if (absl::Status st = ToDataset(arrays["x_test"], names["x_test"], arrays["y_test"],
                                    names["y_test"], test_limit, &s.test, &test_bytes);
        !st.ok()) {
      return st;
    }
    if (test_bytes != train_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(names["x_test"], " holds ", arrays["x_test"].dtype, " but ",
                       names["x_train"], " holds ", arrays["x_train"].dtype));
    }
  }
  s.normalization.scale = train_bytes ? 1.0f / 255.0f : 1.0f;
  return Finish(std::move(s), src.npz.empty() ? src.x_train : src.npz);
}

absl::StatusOr<DataSplit> LoadImageFolders(const std::string& train_dir,
                                           const std::string& test_dir, int64_t train_limit,
                                           int64_t test_limit) {
  DataSplit s;
  s.normalization.scale = 1.0f / 255.0f;
  absl::StatusOr<ImageFolder> train = ReadImageFolder(train_dir);
  if (!train.ok()) return train.status();
  // Folders are read class by class, so a limit takes an even spread (every n/limit-th
  // image) rather than the first classes only.
  auto fill = [](const ImageFolder& f, int64_t limit, Dataset* d) {
    d->example_shape = {f.height, f.width, f.channels};
    const int64_t all = f.count();
    const int64_t n = limit > 0 && limit < all ? limit : all;
    const int64_t per = f.height * f.width * f.channels;
    d->x.resize(static_cast<size_t>(n * per));
    d->y.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t src = i * all / n;
      for (int64_t j = 0; j < per; ++j)
        d->x[i * per + j] = f.pixels[src * per + j] * (1.0f / 255.0f);
      d->y[i] = f.labels[src];
    }
  };
  fill(*train, train_limit, &s.train);
  if (!test_dir.empty()) {
    absl::StatusOr<ImageFolder> test = ReadImageFolder(test_dir, train->classes);
    if (!test.ok()) return test.status();
    if (test->height != train->height || test->width != train->width ||
        test->channels != train->channels) {
      return absl::InvalidArgumentError(absl::StrCat(
          test->files[0], ": is ", test->height, "x", test->width, "x", test->channels,
          ", the training images are ", train->height, "x", train->width, "x", train->channels));
    }
    fill(*test, test_limit, &s.test);
    s.warnings.insert(s.warnings.end(), test->warnings.begin(), test->warnings.end());
  }
  s.class_names = train->classes;
  s.warnings.insert(s.warnings.begin(), train->warnings.begin(), train->warnings.end());
  return Finish(std::move(s), train_dir);
}

void HoldOut(DataSplit& split, float fraction) {
  Dataset& train = split.train;
  const int64_t n = train.size();
  const int64_t held = std::clamp<int64_t>(std::llround(fraction * static_cast<double>(n)), 1,
                                           std::max<int64_t>(1, n - 1));
  // A fixed permutation: the split does not move when the job's seed does.
  std::vector<int64_t> order = EpochOrder(n, 0x401d0417ull, 0);
  std::vector<bool> is_held(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < held; ++i) is_held[order[i]] = true;
  Dataset kept, val;
  for (Dataset* d : {&kept, &val}) {
    d->example_shape = train.example_shape;
    d->classes = train.classes;
    d->label_size = train.label_size;
  }
  const int64_t per = train.example_size();
  for (int64_t i = 0; i < n; ++i) {  // in the original order within each part
    Dataset& to = is_held[i] ? val : kept;
    to.x.insert(to.x.end(), train.x.begin() + i * per, train.x.begin() + (i + 1) * per);
    to.y.insert(to.y.end(), train.y.begin() + i * train.label_size,
                train.y.begin() + (i + 1) * train.label_size);
  }
  split.train = std::move(kept);
  split.test = std::move(val);
}

}  // namespace localpar
