// data.numpy: NumPy arrays (.npy files, or one .npz), examples [count, ...] and labels.
#include "common/data/user_data.h"
#include "common/job/sources/sources.h"

namespace localpar {
namespace {

localpar::NumpySource Files(const v1::Numpy& n) {
  localpar::NumpySource s;
  s.npz = n.npz();
  s.x_train = n.x_train();
  s.y_train = n.y_train();
  s.x_test = n.x_test();
  s.y_test = n.y_test();
  return s;
}

class Numpy final : public DataSource {
 public:
  const char* name() const override { return "numpy"; }
  absl::Status Validate(const v1::Data& d) const override {
    const v1::Numpy& n = d.numpy();
    if (n.npz().empty() && (n.x_train().empty() || n.y_train().empty())) {
      return sources::Invalid("data.numpy", "set npz, or x_train and y_train");
    }
    if (!n.npz().empty() &&
        !(n.x_train().empty() && n.y_train().empty() && n.x_test().empty() && n.y_test().empty())) {
      return sources::Invalid("data.numpy", "set npz or the .npy files, not both");
    }
    if (n.x_test().empty() != n.y_test().empty()) {
      return sources::Invalid("data.numpy", "x_test and y_test come together");
    }
    return absl::OkStatus();
  }
  void Paths(v1::Data* d,
             const std::function<void(const std::string&, std::string*)>& visit) const override {
    v1::Numpy* n = d->mutable_numpy();
    visit("data.numpy.npz", n->mutable_npz());
    visit("data.numpy.x_train", n->mutable_x_train());
    visit("data.numpy.y_train", n->mutable_y_train());
    visit("data.numpy.x_test", n->mutable_x_test());
    visit("data.numpy.y_test", n->mutable_y_test());
  }
  absl::Status ResolveShape(const v1::Job&, v1::Data* d) const override {
    absl::StatusOr<DataSplit> s = LoadNumpy(Files(d->numpy()), 0, 0);
    if (!s.ok()) return s.status();
    const std::string what = d->numpy().npz().empty() ? d->numpy().x_train() : d->numpy().npz();
    return sources::ResolveFrom(*s, "data.numpy", what, d->mutable_numpy());
  }
  Shape InputShape(const v1::Data& d) const override {
    return Shape(d.numpy().shape().begin(), d.numpy().shape().end());
  }
  int32_t Classes(const v1::Data& d) const override { return d.numpy().classes(); }
  absl::StatusOr<DataSplit> Load(const v1::Job& job) const override {
    const v1::Data& d = job.data();
    absl::StatusOr<DataSplit> split = LoadNumpy(Files(d.numpy()), d.train_limit(), d.test_limit());
    if (split.ok() && split->test.y.empty() && d.holdout_fraction() == 0) {
      return absl::InvalidArgumentError(
          "data.numpy: there are no x_test/y_test arrays; set data.holdout_fraction to score "
          "epochs on held-out training examples");
    }
    return split;
  }
};

}  // namespace

const DataSource& NumpyDataSource() {
  static const Numpy source;
  return source;
}

}  // namespace localpar
