// data.cifar10: the CIFAR-10 binary version's files, NHWC [32, 32, 3] images of 10 classes.
#include <filesystem>

#include "common/job/sources/sources.h"

namespace localpar {
namespace {

class Cifar10 final : public DataSource {
 public:
  const char* name() const override { return "cifar10"; }
  absl::Status Validate(const v1::Data& d) const override {
    if (d.cifar10().dir().empty()) {
      return sources::Invalid("data.cifar10.dir",
                              "required: the directory holding data_batch_1.bin etc.");
    }
    return absl::OkStatus();
  }
  void Paths(v1::Data* d,
             const std::function<void(const std::string&, std::string*)>& visit) const override {
    visit("data.cifar10.dir", d->mutable_cifar10()->mutable_dir());
  }
  absl::Status ResolveShape(const v1::Job&, v1::Data* d) const override {
    for (const char* f : {"data_batch_1.bin", "test_batch.bin"}) {
      const std::string path = absl::StrCat(d->cifar10().dir(), "/", f);
      if (!std::filesystem::exists(path)) {
        return absl::NotFoundError(absl::StrCat(
            "data.cifar10.dir: ", path, ": no such file (the CIFAR-10 binary version's files)"));
      }
    }
    return absl::OkStatus();
  }
  Shape InputShape(const v1::Data&) const override { return {32, 32, 3}; }
  int32_t Classes(const v1::Data&) const override { return 10; }
  absl::StatusOr<DataSplit> Load(const v1::Job& job) const override {
    const v1::Data& d = job.data();
    return LoadCifar10(d.cifar10().dir(), d.train_limit(), d.test_limit());
  }
};

}  // namespace

const DataSource& Cifar10DataSource() {
  static const Cifar10 source;
  return source;
}

}  // namespace localpar
