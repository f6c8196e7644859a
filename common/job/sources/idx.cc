// data.fashion_mnist: IDX files in the Fashion-MNIST layout (train- and t10k-,
// images-idx3-ubyte and labels-idx1-ubyte), any image size; the packaged data set by default.
#include "common/job/sources/sources.h"

namespace localpar {
namespace {

class IdxSource final : public DataSource {
 public:
  const char* name() const override { return "fashion_mnist"; }
  void Defaults(v1::Data* d) const override {
    if (d->fashion_mnist().dir().empty())
      d->mutable_fashion_mnist()->set_dir(kDefaultFashionMnistDir);
  }
  void Paths(v1::Data* d,
             const std::function<void(const std::string&, std::string*)>& visit) const override {
    visit("data.fashion_mnist.dir", d->mutable_fashion_mnist()->mutable_dir());
  }
  absl::Status ResolveShape(const v1::Job&, v1::Data* d) const override {
    v1::FashionMnist* f = d->mutable_fashion_mnist();
    absl::StatusOr<IdxDataShape> read = ReadFashionMnistShape(f->dir());
    if (!read.ok()) return read.status();
    const std::string files = absl::StrCat("the IDX files in ", f->dir());
    if (!f->shape().empty() &&
        !std::equal(f->shape().begin(), f->shape().end(), read->example_shape.begin(),
                    read->example_shape.end())) {
      return sources::Invalid(
          "data.fashion_mnist.shape",
          absl::StrCat("[", absl::StrJoin(f->shape(), ","), "], but ", files,
                       " hold examples of shape [", absl::StrJoin(read->example_shape, ","), "]"));
    }
    if (f->classes() > 0 && f->classes() != read->classes) {
      return sources::Invalid(
          "data.fashion_mnist.classes",
          absl::StrCat(f->classes(), ", but ", files, " have labels 0..", read->classes - 1));
    }
    f->clear_shape();
    for (int64_t e : read->example_shape) f->add_shape(e);
    f->set_classes(read->classes);
    return absl::OkStatus();
  }
  Shape InputShape(const v1::Data& d) const override {
    const auto& s = d.fashion_mnist().shape();
    if (s.empty()) return {28, 28, 1};  // Fashion-MNIST's, until the files have been read
    return Shape(s.begin(), s.end());
  }
  int32_t Classes(const v1::Data& d) const override {
    return d.fashion_mnist().classes() > 0 ? d.fashion_mnist().classes() : 10;
  }
  absl::StatusOr<DataSplit> Load(const v1::Job& job) const override {
    const v1::Data& d = job.data();
    absl::StatusOr<DataSplit> split =
        LoadFashionMnist(d.fashion_mnist().dir(), d.train_limit(), d.test_limit());
    if (!split.ok()) return split.status();
    // The packaged Fashion-MNIST: its classes have names (another IDX folder's may not).
    if (d.fashion_mnist().dir() == kDefaultFashionMnistDir && split->train.classes == 10 &&
        split->class_names.empty()) {
      split->class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                            "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    }
    return split;
  }
};

}  // namespace

const DataSource& FashionMnistDataSource() {
  static const IdxSource source;
  return source;
}

}  // namespace localpar
