// Image folders in torchvision's ImageFolder layout: one subfolder per class, named after
// it, holding PNG files. Classes are numbered in the sorted order of their folder names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace localpar {

struct ImageFolder {
  std::vector<std::string> classes;  // folder names, sorted: label i is classes[i]
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;        // count * height * width * channels, NHWC
  std::vector<int32_t> labels;        // one per image (none in a flat folder)
  std::vector<std::string> files;     // one per image, its path
  std::vector<std::string> warnings;  // files skipped (not PNG), one line per class folder
  int64_t count() const { return static_cast<int64_t>(files.size()); }
};

// Reads every *.png under dir/<class>/ (files in name order). The first image fixes the
// size and the channels (1 for grey, 3 for colour; alpha is dropped); every other image must
// match (a colour image in a grey folder is refused, not converted). A class folder without
// PNGs is refused; other files are skipped with a warning. `classes`, when given, must be
// exactly the folder names found (a test folder must have the training folder's classes).
// Errors name the file.
// `expect_height`/`expect_width` (0: any) are checked against each file's header before it
// is decoded, as is a bound of 2^26 pixels per image.
absl::StatusOr<ImageFolder> ReadImageFolder(const std::string& dir,
                                            const std::vector<std::string>& classes = {},
                                            int64_t expect_height = 0, int64_t expect_width = 0);

// A flat folder of unlabelled images: every *.png directly in `dir` (name order), checked as
// ReadImageFolder checks them; `classes` and `labels` stay empty.
absl::StatusOr<ImageFolder> ReadFlatImageFolder(const std::string& dir, int64_t expect_height = 0,
                                                int64_t expect_width = 0);

// Decodes one PNG to `channels` channels (1 or 3; 0: as stored, alpha dropped); refuses
// more than 2^26 pixels from the header, before decoding.
// *stored_channels (optional) receives what the file holds: 1 grey, 2 grey and alpha, 3 RGB,
// 4 RGBA.
absl::StatusOr<std::vector<uint8_t>> ReadPng(const std::string& path, int channels, int64_t* height,
                                             int64_t* width, int* stored_channels = nullptr);

}  // namespace localpar
