// data.text: a byte-level corpus, memory-mapped: windows of seq_len bytes, each labelled with
// the byte after every position; its own validation split (a held-out share, or files).
#include "common/job/sources/sources.h"

namespace localpar {
namespace {

TextCorpusOptions Options(const v1::Job& job) {
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

class Text final : public DataSource {
 public:
  const char* name() const override { return "text"; }
  void Defaults(v1::Data* d) const override {
    v1::TextCorpus* t = d->mutable_text();
    if (t->paths().empty()) t->add_paths(kDefaultTextCorpusDir);
    if (t->seq_len() == 0) t->set_seq_len(64);
    if (t->holdout_fraction() == 0.0f) t->set_holdout_fraction(0.1f);
    if (t->windows() == v1::WINDOWS_DEFAULT) t->set_windows(v1::NON_OVERLAPPING);
  }
  absl::Status Validate(const v1::Data& d) const override {
    const v1::TextCorpus& t = d.text();
    if (absl::Status s = sources::CheckPathList("data.text.paths", t.paths()); !s.ok()) return s;
    if (t.seq_len() <= 0 || t.seq_len() > 4096) {
      return sources::Invalid("data.text.seq_len", "must be in 1..4096");
    }
    if (!(t.holdout_fraction() > 0.0f && t.holdout_fraction() < 1.0f)) {
      return sources::Invalid("data.text.holdout_fraction", "must be in (0, 1)");
    }
    if (absl::Status s = sources::CheckPathList("data.text.validation_paths", t.validation_paths());
        !s.ok()) {
      return s;
    }
    if (!v1::TextCorpus::Holdout_IsValid(t.holdout())) {
      return sources::Invalid("data.text.holdout", "expected TAIL or INTERLEAVED_BLOCKS");
    }
    if (!v1::Windows_IsValid(t.windows())) {
      return sources::Invalid("data.text.windows", "expected NON_OVERLAPPING or RANDOM_OFFSETS");
    }
    if (t.holdout() == v1::TextCorpus::INTERLEAVED_BLOCKS &&
        (t.windows() == v1::RANDOM_OFFSETS || t.validation_paths_size() > 0)) {
      return sources::Invalid("data.text.holdout",
                              "INTERLEAVED_BLOCKS holds out whole windows: it takes "
                              "NON_OVERLAPPING windows and no validation_paths");
    }
    return absl::OkStatus();
  }
  void Paths(v1::Data* d,
             const std::function<void(const std::string&, std::string*)>& visit) const override {
    sources::VisitPathList("data.text.paths", d->mutable_text()->mutable_paths(), visit);
    sources::VisitPathList("data.text.validation_paths",
                           d->mutable_text()->mutable_validation_paths(), visit);
  }
  std::string MissingPathHint(const std::string& path) const override {
    return MissingCorpusHint(path);
  }
  absl::Status SetTrainPaths(const std::vector<std::string>& paths, v1::Data* d) const override {
    d->mutable_text()->clear_paths();
    for (const std::string& p : paths) d->mutable_text()->add_paths(p);
    return absl::OkStatus();
  }
  absl::Status ResolveShape(const v1::Job& job, v1::Data*) const override {
    // Mapped, not read: a missing or unreadable corpus is found now, not after start-up.
    absl::StatusOr<DataSplit> s = LoadTextCorpus(Options(job), 1, 1);
    return s.status();
  }
  Shape InputShape(const v1::Data& d) const override { return {d.text().seq_len()}; }
  int32_t Classes(const v1::Data&) const override { return 256; }  // bytes
  int64_t LabelsPerExample(const v1::Data& d) const override { return d.text().seq_len(); }
  bool ByteTokens() const override { return true; }
  bool TokenIds() const override { return true; }
  bool OwnValidation() const override { return true; }
  bool ShufflesExamples(const v1::Data& d) const override {
    return d.text().windows() != v1::RANDOM_OFFSETS;
  }
  absl::StatusOr<DataSplit> Load(const v1::Job& job) const override {
    return LoadTextCorpus(Options(job), job.data().train_limit(), job.data().test_limit());
  }
};

}  // namespace

const DataSource& TextDataSource() {
  static const Text source;
  return source;
}

}  // namespace localpar
