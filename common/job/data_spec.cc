// What a job's data source gives: the example shape, the class count and labels per example,
// read from the files where the job does not say; data errors marked as such.
#include <algorithm>
#include <filesystem>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/data/dataset.h"
#include "common/data/user_data.h"
#include "common/job/job.h"

namespace localpar {

Shape JobInputShape(const v1::Job& job) {
  const v1::Data& d = job.data();
  if (d.has_synthetic()) {
    const auto& s = d.synthetic().shape();
    return Shape(s.begin(), s.end());
  }
  if (d.has_cifar10()) return {32, 32, 3};
  if (d.has_text()) return {d.text().seq_len()};
  if (d.has_tokens()) return {d.tokens().seq_len()};
  if (d.has_fashion_mnist() && !d.fashion_mnist().shape().empty()) {
    const auto& s = d.fashion_mnist().shape();
    return Shape(s.begin(), s.end());
  }
  if (d.has_numpy()) return Shape(d.numpy().shape().begin(), d.numpy().shape().end());
  if (d.has_image_folder()) {
    return Shape(d.image_folder().shape().begin(), d.image_folder().shape().end());
  }
  return {28, 28, 1};  // Fashion-MNIST's, until the files have been read
}

int32_t JobClasses(const v1::Job& job) {
  if (job.data().has_synthetic()) return job.data().synthetic().classes();
  if (job.data().has_text()) return 256;  // bytes
  if (job.data().has_tokens()) return static_cast<int32_t>(job.data().tokens().vocab());
  if (job.data().has_fashion_mnist() && job.data().fashion_mnist().classes() > 0) {
    return job.data().fashion_mnist().classes();
  }
  if (job.data().has_numpy()) return job.data().numpy().classes();
  if (job.data().has_image_folder()) return job.data().image_folder().classes();
  return 10;
}

namespace {

// Fills a user data source's shape and classes from `split`, or checks the ones set.
template <typename Source>
absl::Status ResolveFrom(const DataSplit& split, const std::string& field, const std::string& what,
                         Source* src) {
  const Shape& got = split.train.example_shape;
  if (!src->shape().empty() &&
      !std::equal(src->shape().begin(), src->shape().end(), got.begin(), got.end())) {
    return MarkDataError(absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: [", absl::StrJoin(src->shape(), ","), "], but ", what,
                     " hold examples of shape ", ShapeString(got))));
  }
  if (src->classes() > 0 && src->classes() != split.train.classes) {
    return MarkDataError(
        absl::InvalidArgumentError(absl::StrCat(field, ".classes: ", src->classes(), ", but ", what,
                                                " have labels 0..", split.train.classes - 1)));
  }
  src->clear_shape();
  for (int64_t d : got) src->add_shape(d);
  src->set_classes(split.train.classes);
  return absl::OkStatus();
}

}  // namespace

NumpySource ToNumpySource(const v1::Numpy& n) {
  NumpySource s;
  s.npz = n.npz();
  s.x_train = n.x_train();
  s.y_train = n.y_train();
  s.x_test = n.x_test();
  s.y_test = n.y_test();
  return s;
}

TextCorpusOptions ToTextCorpusOptions(const v1::Job& job) {
  const v1::TextCorpus& text = job.data().text();
  TextCorpusOptions o;
  o.paths.assign(text.paths().begin(), text.paths().end());
  o.validation_paths.assign(text.validation_paths().begin(), text.validation_paths().end());
  o.seq_len = text.seq_len();
  o.holdout_fraction = text.holdout_fraction();
  o.interleaved = text.holdout() == v1::TextCorpus::INTERLEAVED_BLOCKS;
  o.random_windows = text.windows() == v1::RANDOM_OFFSETS;
  o.seed = job.seed();
  return o;
}

TokenDataOptions ToTokenDataOptions(const v1::Job& job) {
  const v1::Tokens& tk = job.data().tokens();
  TokenDataOptions o;
  o.train_paths.assign(tk.train_paths().begin(), tk.train_paths().end());
  o.validation_paths.assign(tk.validation_paths().begin(), tk.validation_paths().end());
  o.format = tk.format() == v1::Tokens::RAW_UINT16 ? TokenFileFormat::kRawU16
             : tk.format() == v1::Tokens::LLMC     ? TokenFileFormat::kLlmcU16
                                                   : TokenFileFormat::kAuto;
  o.seq_len = tk.seq_len();
  o.vocab = tk.vocab();
  o.tokens_per_epoch = tk.tokens_per_epoch();
  o.holdout_fraction = tk.holdout_fraction();
  o.random_windows = tk.windows() != v1::NON_OVERLAPPING;
  o.seed = job.seed();
  return o;
}

bool JobShufflesExamples(const v1::Job& job) {
  const v1::Data& d = job.data();
  if (d.has_text()) return d.text().windows() != v1::RANDOM_OFFSETS;
  if (d.has_tokens()) return d.tokens().windows() == v1::NON_OVERLAPPING;
  return true;
}

bool JobReadsBytes(const v1::Job& job) { return job.data().has_text(); }

void ResolveDataPaths(const std::string& dir, v1::Job* job) {
  auto fix = [&](std::string* p) {
    if (p->empty() || dir.empty() || std::filesystem::path(*p).is_absolute()) return;
    *p = std::filesystem::absolute(std::filesystem::path(dir) / *p).lexically_normal().string();
  };
  auto fix_all = [&](google::protobuf::RepeatedPtrField<std::string>* ps) {
    for (std::string& p : *ps) fix(&p);
  };
  v1::Data* d = job->mutable_data();
  if (d->has_text()) {
    fix_all(d->mutable_text()->mutable_paths());
    fix_all(d->mutable_text()->mutable_validation_paths());
  }
  if (d->has_tokens()) {
    fix_all(d->mutable_tokens()->mutable_train_paths());
    fix_all(d->mutable_tokens()->mutable_validation_paths());
  }
  if (d->has_numpy()) {
    v1::Numpy* n = d->mutable_numpy();
    for (std::string* p : {n->mutable_npz(), n->mutable_x_train(), n->mutable_y_train(),
                           n->mutable_x_test(), n->mutable_y_test()}) {
      fix(p);
    }
  }
  if (d->has_image_folder()) {
    fix(d->mutable_image_folder()->mutable_train_dir());
    fix(d->mutable_image_folder()->mutable_test_dir());
  }
  if (d->has_fashion_mnist()) fix(d->mutable_fashion_mnist()->mutable_dir());
  if (d->has_cifar10()) fix(d->mutable_cifar10()->mutable_dir());
}

namespace {

// Every file or folder the data source names exists: the error names the field and the
// resolved path, so a wrong relative path shows where it was looked for.
absl::Status CheckDataPathsExist(const v1::Data& d) {
  std::vector<std::pair<std::string, std::string>> named;  // field, path
  auto add = [&](const std::string& field, const std::string& path) {
    if (!path.empty()) named.emplace_back(field, path);
  };
  auto add_all = [&](const std::string& field,
                     const google::protobuf::RepeatedPtrField<std::string>& paths) {
    for (int i = 0; i < paths.size(); ++i) add(absl::StrCat(field, "[", i, "]"), paths[i]);
  };
  add_all("data.text.paths", d.text().paths());
  add_all("data.text.validation_paths", d.text().validation_paths());
  add_all("data.tokens.train_paths", d.tokens().train_paths());
  add_all("data.tokens.validation_paths", d.tokens().validation_paths());
  add("data.numpy.npz", d.numpy().npz());
  add("data.numpy.x_train", d.numpy().x_train());
  add("data.numpy.y_train", d.numpy().y_train());
  add("data.numpy.x_test", d.numpy().x_test());
  add("data.numpy.y_test", d.numpy().y_test());
  add("data.image_folder.train_dir", d.image_folder().train_dir());
  add("data.image_folder.test_dir", d.image_folder().test_dir());
  add("data.fashion_mnist.dir", d.fashion_mnist().dir());
  add("data.cifar10.dir", d.cifar10().dir());
  for (const auto& [field, path] : named) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      const bool corpus = field.starts_with("data.text") || field.starts_with("data.tokens");
      return MarkDataError(absl::NotFoundError(absl::StrCat(
          field, ": ", path, ": no such file or folder", corpus ? MissingCorpusHint(path) : "")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveDataShape(v1::Job* job) {
  v1::Data* d = job->mutable_data();
  if (absl::Status s = CheckDataPathsExist(*d); !s.ok()) return s;
  if (d->has_text()) {
    // Mapped, not read: a missing or unreadable corpus is found now, not after start-up.
    absl::StatusOr<DataSplit> s = LoadTextCorpus(ToTextCorpusOptions(*job), 1, 1);
    return s.ok() ? absl::OkStatus() : MarkDataError(s.status());
  }
  if (d->has_cifar10()) {
    for (const char* f : {"data_batch_1.bin", "test_batch.bin"}) {
      const std::string path = absl::StrCat(d->cifar10().dir(), "/", f);
      if (!std::filesystem::exists(path)) {
        return MarkDataError(absl::NotFoundError(absl::StrCat(
            "data.cifar10.dir: ", path, ": no such file (the CIFAR-10 binary version's files)")));
      }
    }
    return absl::OkStatus();
  }
  if (d->has_tokens() && d->tokens().vocab() > 0) {
    // Headers and sizes only (mapping reads nothing); the ids are checked when loaded.
    const TokenDataOptions o = ToTokenDataOptions(*job);
    for (const std::vector<std::string>* files : {&o.train_paths, &o.validation_paths}) {
      if (files->empty()) continue;
      absl::StatusOr<std::shared_ptr<TokenCorpus>> c = TokenCorpus::Map(*files, o.format);
      if (!c.ok()) return MarkDataError(c.status());
    }
    return absl::OkStatus();
  }
  if (d->has_tokens() && d->tokens().vocab() == 0) {
    // The vocabulary from the files: their largest id + 1 (a scan, not a load).
    absl::StatusOr<DataSplit> s = LoadTokenData(ToTokenDataOptions(*job), 1, 1);
    if (!s.ok()) return MarkDataError(s.status());
    d->mutable_tokens()->set_vocab(s->train.classes);
    return absl::OkStatus();
  }
  if (d->has_numpy()) {
    absl::StatusOr<DataSplit> s = LoadNumpy(ToNumpySource(d->numpy()), 0, 0);
    if (!s.ok()) return MarkDataError(s.status());
    const std::string what = d->numpy().npz().empty() ? d->numpy().x_train() : d->numpy().npz();
    return ResolveFrom(*s, "data.numpy", what, d->mutable_numpy());
  }
  if (d->has_image_folder()) {
    absl::StatusOr<DataSplit> s =
        LoadImageFolders(d->image_folder().train_dir(), d->image_folder().test_dir(), 0, 0);
    if (!s.ok()) return MarkDataError(s.status());
    return ResolveFrom(*s, "data.image_folder", d->image_folder().train_dir(),
                       d->mutable_image_folder());
  }
  if (!job->data().has_fashion_mnist()) return absl::OkStatus();
  v1::FashionMnist* f = job->mutable_data()->mutable_fashion_mnist();
  absl::StatusOr<IdxDataShape> read = ReadFashionMnistShape(f->dir());
  if (!read.ok()) return MarkDataError(read.status());
  const std::string files = absl::StrCat("the IDX files in ", f->dir());
  if (!f->shape().empty() && !std::equal(f->shape().begin(), f->shape().end(),
                                         read->example_shape.begin(), read->example_shape.end())) {
    return MarkDataError(absl::InvalidArgumentError(absl::StrCat(
        "data.fashion_mnist.shape: [", absl::StrJoin(f->shape(), ","), "], but ", files,
        " hold examples of shape [", absl::StrJoin(read->example_shape, ","), "]")));
  }
  if (f->classes() > 0 && f->classes() != read->classes) {
    return MarkDataError(absl::InvalidArgumentError(
        absl::StrCat("data.fashion_mnist.classes: ", f->classes(), ", but ", files,
                     " have labels 0..", read->classes - 1)));
  }
  f->clear_shape();
  for (int64_t d : read->example_shape) f->add_shape(d);
  f->set_classes(read->classes);
  return absl::OkStatus();
}

namespace {
constexpr char kDataErrorPayload[] = "type.localpar/data-error";
}  // namespace

absl::Status MarkDataError(absl::Status s) {
  if (!s.ok()) s.SetPayload(kDataErrorPayload, absl::Cord("1"));
  return s;
}

bool IsDataError(const absl::Status& s) { return s.GetPayload(kDataErrorPayload).has_value(); }

const char* EvalSplitName(const v1::Job& job) {
  const v1::Data& d = job.data();
  const bool held_out = d.has_text() || d.has_tokens() || d.holdout_fraction() > 0;
  return held_out ? "validation" : "test";
}

int64_t JobLabelsPerExample(const v1::Job& job) {
  if (job.data().has_text()) return job.data().text().seq_len();
  if (job.data().has_tokens()) return job.data().tokens().seq_len();
  return 1;
}

}  // namespace localpar
