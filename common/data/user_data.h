// Users' own data sets: NumPy arrays and image folders, read into a DataSplit; and a
// validation split held out of the training data.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"

namespace localpar {

struct NumpySource {
  std::string npz;  // an .npz holding x_train, y_train and (optionally) x_test, y_test
  std::string x_train, y_train, x_test, y_test;  // or .npy files (test ones optional)
};
// Inputs [count, rows, cols] (grey images: [rows, cols, 1]), [count, rows, cols, channels]
// or [count, features]; uint8 (pixel bytes, scaled to [0, 1]) or float. Labels: integers
// [count]. The class count is the largest label plus one. Errors name the file (and for
// labels, the index). The test split may be empty (then a holdout_fraction is needed).
absl::StatusOr<DataSplit> LoadNumpy(const NumpySource& source, int64_t train_limit = 0,
                                    int64_t test_limit = 0);

// torchvision's ImageFolder layout (image_folder.h) for each split; test_dir may be empty.
absl::StatusOr<DataSplit> LoadImageFolders(const std::string& train_dir,
                                           const std::string& test_dir, int64_t train_limit = 0,
                                           int64_t test_limit = 0);

// Moves round(fraction * n) training examples, chosen by a fixed permutation (the same for
// every seed), into the test split, replacing it: epochs are then scored on data the run
// never trained on, and the real test split is left alone.
void HoldOut(DataSplit& split, float fraction);

}  // namespace localpar
