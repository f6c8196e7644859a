// data.synthetic: Gaussian clusters around per-class centres, made in memory from a seed.
#include <cmath>

#include "common/job/sources/sources.h"

namespace localpar {
namespace {

class Synthetic final : public DataSource {
 public:
  const char* name() const override { return "synthetic"; }
  void Defaults(v1::Data* d) const override {
    v1::Synthetic* s = d->mutable_synthetic();
    if (s->train_examples() == 0) s->set_train_examples(1024);
    if (s->test_examples() == 0) s->set_test_examples(256);
    if (s->shape().empty()) {
      for (int64_t e : {28, 28, 1}) s->add_shape(e);
    }
    if (s->classes() == 0) s->set_classes(10);
    if (s->noise() == 0.0f) s->set_noise(1.0f);
  }
  absl::Status Validate(const v1::Data& d) const override {
    const v1::Synthetic& s = d.synthetic();
    if (s.train_examples() <= 0)
      return sources::Invalid("data.synthetic.train_examples", "must be > 0");
    if (s.test_examples() <= 0)
      return sources::Invalid("data.synthetic.test_examples", "must be > 0");
    if (s.classes() < 2) return sources::Invalid("data.synthetic.classes", "must be >= 2");
    for (int64_t v : s.shape()) {
      if (v <= 0) return sources::Invalid("data.synthetic.shape", "every extent must be > 0");
    }
    if (!(s.noise() >= 0.0f) || !std::isfinite(s.noise())) {
      return sources::Invalid("data.synthetic.noise", "must be a finite number >= 0");
    }
    return absl::OkStatus();
  }
  Shape InputShape(const v1::Data& d) const override {
    return Shape(d.synthetic().shape().begin(), d.synthetic().shape().end());
  }
  int32_t Classes(const v1::Data& d) const override { return d.synthetic().classes(); }
  double MemoryBytes(const v1::Data& d, const Shape& input) const override {
    const v1::Synthetic& s = d.synthetic();
    double elements = 1;
    for (int64_t e : input) elements *= static_cast<double>(e);
    const double examples =
        static_cast<double>(s.train_examples()) + static_cast<double>(s.test_examples());
    return examples * (elements + 1) * 4;  // float32 values and a label each
  }
  std::string MemoryField(const v1::Data& d) const override {
    return d.synthetic().train_examples() >= d.synthetic().test_examples()
               ? "data.synthetic.train_examples"
               : "data.synthetic.test_examples";
  }
  absl::StatusOr<DataSplit> Load(const v1::Job& job) const override {
    const v1::Synthetic& s = job.data().synthetic();
    SyntheticOptions o;
    o.train_examples = s.train_examples();
    o.test_examples = s.test_examples();
    o.shape.assign(s.shape().begin(), s.shape().end());
    o.classes = s.classes();
    o.seed = s.seed();
    o.noise = s.noise();
    return MakeSynthetic(o);
  }
};

}  // namespace

const DataSource& SyntheticDataSource() {
  static const Synthetic source;
  return source;
}

}  // namespace localpar
