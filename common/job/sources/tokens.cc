// data.tokens: token files (nanoGPT's raw uint16 .bin, llm.c's headered shards),
// memory-mapped and read a window at a time; its own validation split.
#include "common/job/sources/sources.h"

namespace localpar {
namespace {

TokenDataOptions Options(const v1::Job& job) {
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

class Tokens final : public DataSource {
 public:
  const char* name() const override { return "tokens"; }
  void Defaults(v1::Data* d) const override {
    v1::Tokens* t = d->mutable_tokens();
    if (t->seq_len() == 0) t->set_seq_len(64);
    if (t->holdout_fraction() == 0.0f) t->set_holdout_fraction(0.1f);
    if (t->windows() == v1::WINDOWS_DEFAULT) t->set_windows(v1::RANDOM_OFFSETS);
  }
  absl::Status Validate(const v1::Data& d) const override {
    const v1::Tokens& t = d.tokens();
    if (t.train_paths().empty()) {
      return sources::Invalid("data.tokens.train_paths",
                              "required: nanoGPT .bin or llm.c shard files");
    }
    if (absl::Status s = sources::CheckPathList("data.tokens.train_paths", t.train_paths());
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            sources::CheckPathList("data.tokens.validation_paths", t.validation_paths());
        !s.ok()) {
      return s;
    }
    if (t.seq_len() <= 0 || t.seq_len() > 65536) {
      return sources::Invalid("data.tokens.seq_len", "must be in 1..65536");
    }
    if (t.vocab() < 0 || t.vocab() > 65536) {
      return sources::Invalid("data.tokens.vocab",
                              "must be in 1..65536 (uint16 ids), or 0: from the data");
    }
    if (t.tokens_per_epoch() < 0) {
      return sources::Invalid("data.tokens.tokens_per_epoch", "must be >= 0");
    }
    if (!(t.holdout_fraction() > 0.0f && t.holdout_fraction() < 1.0f)) {
      return sources::Invalid("data.tokens.holdout_fraction", "must be in (0, 1)");
    }
    if (!v1::Windows_IsValid(t.windows())) {
      return sources::Invalid("data.tokens.windows", "expected NON_OVERLAPPING or RANDOM_OFFSETS");
    }
    if (!v1::Tokens::Format_IsValid(t.format())) {
      return sources::Invalid("data.tokens.format", "expected AUTO, RAW_UINT16 or LLMC");
    }
    return absl::OkStatus();
  }
  void Paths(v1::Data* d,
             const std::function<void(const std::string&, std::string*)>& visit) const override {
    sources::VisitPathList("data.tokens.train_paths", d->mutable_tokens()->mutable_train_paths(),
                           visit);
    sources::VisitPathList("data.tokens.validation_paths",
                           d->mutable_tokens()->mutable_validation_paths(), visit);
  }
  std::string MissingPathHint(const std::string& path) const override {
    return MissingCorpusHint(path);
  }
  absl::Status SetTrainPaths(const std::vector<std::string>& paths, v1::Data* d) const override {
    d->mutable_tokens()->clear_train_paths();
    for (const std::string& p : paths) d->mutable_tokens()->add_train_paths(p);
    return absl::OkStatus();
  }
  absl::Status ResolveShape(const v1::Job& job, v1::Data* d) const override {
    const TokenDataOptions o = Options(job);
    if (d->tokens().vocab() > 0) {
      // Headers and sizes only (mapping reads nothing); the ids are checked when loaded.
      for (const std::vector<std::string>* files : {&o.train_paths, &o.validation_paths}) {
        if (files->empty()) continue;
        absl::StatusOr<std::shared_ptr<TokenCorpus>> c = TokenCorpus::Map(*files, o.format);
        if (!c.ok()) return c.status();
      }
      return absl::OkStatus();
    }
    // The vocabulary from the files: their largest id + 1 (a scan, not a load).
    absl::StatusOr<DataSplit> s = LoadTokenData(o, 1, 1);
    if (!s.ok()) return s.status();
    d->mutable_tokens()->set_vocab(s->train.classes);
    return absl::OkStatus();
  }
  Shape InputShape(const v1::Data& d) const override { return {d.tokens().seq_len()}; }
  int32_t Classes(const v1::Data& d) const override {
    return static_cast<int32_t>(d.tokens().vocab());
  }
  int64_t LabelsPerExample(const v1::Data& d) const override { return d.tokens().seq_len(); }
  bool TokenIds() const override { return true; }
  bool OwnValidation() const override { return true; }
  bool ShufflesExamples(const v1::Data& d) const override {
    return d.tokens().windows() == v1::NON_OVERLAPPING;
  }
  absl::StatusOr<DataSplit> Load(const v1::Job& job) const override {
    return LoadTokenData(Options(job), job.data().train_limit(), job.data().test_limit());
  }
};

}  // namespace

const DataSource& TokensDataSource() {
  static const Tokens source;
  return source;
}

}  // namespace localpar
