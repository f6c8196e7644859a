// PNG folders through libpng's simplified API.
#include "common/data/image_folder.h"

#include <png.h>

#include <algorithm>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/regular_file.h"

namespace localpar {

namespace {

// Opens a PNG and reads its header; the size is known from here, nothing is decoded yet.
// Refuses more than 2^26 pixels: a few kilobytes of PNG can describe gigabytes of them.
absl::Status OpenPng(const std::string& path, png_image* image) {
  *image = png_image{};
  if (absl::Status s = CheckRegularFile(path); !s.ok()) return s;
  image->version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(image, path.c_str())) {
    std::string why = image->message;
    png_image_free(image);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a readable PNG (", why, ")"));
  }
  constexpr int64_t kMaxPixels = int64_t{1} << 26;
  if (int64_t{image->height} * image->width > kMaxPixels) {
    png_image_free(image);
    return absl::InvalidArgumentError(absl::StrCat(path, ": is ", image->height, "x", image->width,
                                                   ", over the ", kMaxPixels,
                                                   " pixels an example may have"));
  }
  return absl::OkStatus();
}

// Decodes an opened PNG to `channels` channels (0: as stored); frees `image` either way.
absl::StatusOr<std::vector<uint8_t>> DecodePng(const std::string& path, png_image* image,
                                               int channels, int* stored_channels) {
  const bool colour = (image->format & PNG_FORMAT_FLAG_COLOR) != 0;
  if (stored_channels) {
    *stored_channels = (colour ? 3 : 1) + ((image->format & PNG_FORMAT_FLAG_ALPHA) ? 1 : 0);
  }
  if (channels == 0) channels = colour ? 3 : 1;
  image->format = channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  std::vector<uint8_t> pixels(PNG_IMAGE_SIZE(*image));
  // Transparent pixels are composed over black, so alpha adds nothing the network sees.
  png_color black{0, 0, 0};
  if (!png_image_finish_read(image, &black, pixels.data(), 0, nullptr)) {
    std::string why = image->message;
    png_image_free(image);
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot decode the PNG (", why, ")"));
  }
  return pixels;
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> ReadPng(const std::string& path, int channels, int64_t* height,
                                             int64_t* width, int* stored_channels) {
  png_image image;
  if (absl::Status s = OpenPng(path, &image); !s.ok()) return s;
  *height = image.height;
  *width = image.width;
  return DecodePng(path, &image, channels, stored_channels);
}

namespace {

// The .png files directly in `folder`, sorted (other files in *others).
std::vector<std::string> PngFiles(const std::filesystem::path& folder,
                                  std::vector<std::string>* others) {
  std::error_code ec;
  std::vector<std::string> files;
  for (const std::filesystem::directory_entry& e :
       std::filesystem::directory_iterator(folder, ec)) {
    if (!e.is_regular_file()) continue;
    if (absl::EndsWithIgnoreCase(e.path().string(), ".png")) {
      files.push_back(e.path().string());
    } else if (e.path().filename().string()[0] != '.') {  // hidden files are no one's images
      others->push_back(e.path().filename().string());
    }
  }
  std::sort(files.begin(), files.end());
  std::sort(others->begin(), others->end());
  return files;
}

// Decodes `files` into `f`, each labelled `label` (< 0: no label), checking every size and
// channel count against the first image's and the network's before it is decoded.
absl::Status AddPngs(const std::vector<std::string>& files, int32_t label, int64_t expect_height,
                     int64_t expect_width, ImageFolder* f) {
  const char* kStored[] = {"", "grey", "grey with alpha", "colour (RGB)",
                           "colour with alpha (RGBA)"};
  for (const std::string& path : files) {
    int stored = 0;
    // The header first: a size that cannot fit is refused before anything is decoded.
    png_image image;
    if (absl::Status s = OpenPng(path, &image); !s.ok()) return s;
    const int64_t h = image.height, w = image.width;
    std::string wrong;
    if (expect_height > 0 && (h != expect_height || w != expect_width)) {
      wrong = absl::StrCat(", the network takes ", expect_height, "x", expect_width, " images");
    } else if (f->channels != 0 && (h != f->height || w != f->width)) {
      wrong = absl::StrCat(", but ", f->files[0], " is ", f->height, "x", f->width,
                           "; every image must have the same size");
    }
    if (!wrong.empty()) {
      png_image_free(&image);
      return absl::InvalidArgumentError(absl::StrCat(path, ": is ", h, "x", w, wrong));
    }
    absl::StatusOr<std::vector<uint8_t>> px =
        DecodePng(path, &image, static_cast<int>(f->channels), &stored);
    if (!px.ok()) return px.status();
    if (f->channels == 0) {
      f->height = h;
      f->width = w;
      f->channels = static_cast<int64_t>(px->size()) / (h * w);
    } else if ((stored >= 3) != (f->channels == 3)) {
      // Colour in a grey folder (or grey in a colour one) would be converted silently.
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": is ", kStored[stored], ", but ", f->files[0], " is ",
          f->channels == 3 ? "colour" : "grey", "; every image must have the same channels"));
    }
    f->pixels.insert(f->pixels.end(), px->begin(), px->end());
    if (label >= 0) f->labels.push_back(label);
    f->files.push_back(path);
  }
  return absl::OkStatus();
}

void WarnSkipped(const std::string& folder, const std::vector<std::string>& others,
                 ImageFolder* f) {
  if (others.empty()) return;
  f->warnings.push_back(absl::StrCat(folder, ": skipped ", others.size(),
                                     " file(s) that are not .png (", others[0],
                                     others.size() > 1 ? ", ..." : "", ")"));
}

}  // namespace

absl::StatusOr<ImageFolder> ReadImageFolder(const std::string& dir,
                                            const std::vector<std::string>& classes,
                                            int64_t expect_height, int64_t expect_width) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  }
  ImageFolder f;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_directory()) f.classes.push_back(e.path().filename().string());
  }
  std::sort(f.classes.begin(), f.classes.end());
  if (f.classes.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, ": needs one subfolder per class (at least 2), found ", f.classes.size()));
  }
  if (!classes.empty() && classes != f.classes) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": classes [", absl::StrJoin(f.classes, ","),
                     "] differ from the training folder's [", absl::StrJoin(classes, ","), "]"));
  }
  for (size_t c = 0; c < f.classes.size(); ++c) {
    const fs::path folder = fs::path(dir) / f.classes[c];
    std::vector<std::string> others;
    const std::vector<std::string> files = PngFiles(folder, &others);
    if (files.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          folder.string(), ": class folder holds no .png files (every class needs examples)"));
    }
    WarnSkipped(folder.string(), others, &f);
    if (absl::Status s = AddPngs(files, static_cast<int32_t>(c), expect_height, expect_width, &f);
        !s.ok()) {
      return s;
    }
  }
  if (f.files.empty())
    return absl::InvalidArgumentError(absl::StrCat(dir, ": holds no .png files"));
  return f;
}

absl::StatusOr<ImageFolder> ReadFlatImageFolder(const std::string& dir, int64_t expect_height,
                                                int64_t expect_width) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  }
  ImageFolder f;
  std::vector<std::string> others;
  const std::vector<std::string> files = PngFiles(dir, &others);
  if (files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": holds no .png files and no class folders"));
  }
  WarnSkipped(dir, others, &f);
  if (absl::Status s = AddPngs(files, -1, expect_height, expect_width, &f); !s.ok()) return s;
  return f;
}

}  // namespace localpar
