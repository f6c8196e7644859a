// data.image_folder: PNG images, one subfolder per class (its name the class's).
#include "common/data/user_data.h"
#include "common/job/sources/sources.h"

namespace localpar {
namespace {

class ImageFolder final : public DataSource {
 public:
  const char* name() const override { return "image_folder"; }
  absl::Status Validate(const v1::Data& d) const override {
    if (d.image_folder().train_dir().empty()) {
      return sources::Invalid("data.image_folder.train_dir",
                              "required: one subfolder of PNGs per class");
    }
    if (d.image_folder().test_dir().empty() && d.holdout_fraction() == 0) {
      return sources::Invalid(
          "data.image_folder.test_dir",
          "required unless data.holdout_fraction holds some training images out");
    }
    return absl::OkStatus();
  }
  void Paths(v1::Data* d,
             const std::function<void(const std::string&, std::string*)>& visit) const override {
    visit("data.image_folder.train_dir", d->mutable_image_folder()->mutable_train_dir());
    visit("data.image_folder.test_dir", d->mutable_image_folder()->mutable_test_dir());
  }
  absl::Status ResolveShape(const v1::Job&, v1::Data* d) const override {
    absl::StatusOr<DataSplit> s =
        LoadImageFolders(d->image_folder().train_dir(), d->image_folder().test_dir(), 0, 0);
    if (!s.ok()) return s.status();
    return sources::ResolveFrom(*s, "data.image_folder", d->image_folder().train_dir(),
                                d->mutable_image_folder());
  }
  Shape InputShape(const v1::Data& d) const override {
    return Shape(d.image_folder().shape().begin(), d.image_folder().shape().end());
  }
  int32_t Classes(const v1::Data& d) const override { return d.image_folder().classes(); }
  absl::StatusOr<DataSplit> Load(const v1::Job& job) const override {
    const v1::Data& d = job.data();
    return LoadImageFolders(d.image_folder().train_dir(), d.image_folder().test_dir(),
                            d.train_limit(), d.test_limit());
  }
};

}  // namespace

const DataSource& ImageFolderDataSource() {
  static const ImageFolder source;
  return source;
}

}  // namespace localpar
