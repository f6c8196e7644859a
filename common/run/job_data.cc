// A job's data loaded and standardised, and batches assembled from it in host memory.
#include "common/run/job_data.h"

namespace localpar {

BatchAssembler::BatchAssembler(const Dataset& data, int64_t max_rows)
    : data_(data),
      x_(static_cast<size_t>(max_rows * data.example_size())),
      y_(static_cast<size_t>(max_rows * data.label_size)) {}

void BatchAssembler::Gather(const std::vector<int64_t>& order, int64_t begin, int64_t rows,
                            int64_t epoch) {
  rows_ = rows;
  GatherBatch(data_, order, begin, rows, x_.data(), y_.data(), epoch);
}

Shape BatchAssembler::y_shape() const {
  if (data_.label_size == 1) return {rows_};
  return {rows_, data_.label_size};
}

Shape BatchAssembler::x_shape() const {
  Shape s{rows_};
  s.insert(s.end(), data_.example_shape.begin(), data_.example_shape.end());
  return s;
}

absl::StatusOr<DataSplit> LoadJobData(const v1::Job& job) {
  const v1::Data& d = job.data();
  DataSplit split;
  if (d.has_synthetic()) {
    const v1::Synthetic& s = d.synthetic();
    SyntheticOptions o;
    o.train_examples = s.train_examples();
    o.test_examples = s.test_examples();
    o.shape.assign(s.shape().begin(), s.shape().end());
    o.classes = s.classes();
    o.seed = s.seed();
    o.noise = s.noise();
    split = MakeSynthetic(o);
  } else if (d.has_text()) {
    absl::StatusOr<DataSplit> t =
        LoadTextCorpus(ToTextCorpusOptions(job), d.train_limit(), d.test_limit());
    if (!t.ok()) return MarkDataError(t.status());
    return *std::move(t);  // token ids: never standardised
  } else if (d.has_tokens()) {
    absl::StatusOr<DataSplit> t =
        LoadTokenData(ToTokenDataOptions(job), d.train_limit(), d.test_limit());
    if (!t.ok()) return MarkDataError(t.status());
    return *std::move(t);
  } else if (d.has_numpy() || d.has_image_folder()) {
    absl::StatusOr<DataSplit> u =
        d.has_numpy() ? LoadNumpy(ToNumpySource(d.numpy()), d.train_limit(), d.test_limit())
                      : LoadImageFolders(d.image_folder().train_dir(), d.image_folder().test_dir(),
                                         d.train_limit(), d.test_limit());
    if (!u.ok()) return u.status();
    split = *std::move(u);
    if (split.test.y.empty() && d.holdout_fraction() == 0) {
      return absl::InvalidArgumentError(
          "data.numpy: there are no x_test/y_test arrays; set data.holdout_fraction to score "
          "epochs on held-out training examples");
    }
  } else {
    absl::StatusOr<DataSplit> f =
        d.has_cifar10()
            ? LoadCifar10(d.cifar10().dir(), d.train_limit(), d.test_limit())
            : LoadFashionMnist(d.fashion_mnist().dir(), d.train_limit(), d.test_limit());
    if (!f.ok()) return f.status();
    split = *std::move(f);
    // The packaged Fashion-MNIST: its classes have names (another IDX folder's may not).
    if (d.has_fashion_mnist() && d.fashion_mnist().dir() == kDefaultFashionMnistDir &&
        split.train.classes == 10 && split.class_names.empty()) {
      split.class_names = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                           "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
    }
  }
  if (d.holdout_fraction() > 0) HoldOut(split, d.holdout_fraction());
  Standardize(split);
  return split;
}

}  // namespace localpar
