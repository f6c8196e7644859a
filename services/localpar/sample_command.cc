// `localpar sample`: text from a trained language model.
#include <cmath>
#include <ostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/data/vocabulary.h"
#include "common/job/parse.h"
#include "common/model_io/sample.h"
#include "services/common/exit_codes.h"
#include "services/common/program_config.h"
#include "services/localpar/command_flags.h"
#include "services/localpar/commands.h"
#include "services/localpar/open_model.h"

namespace localpar {
namespace {

// How tokens read and print: a byte vocabulary's are bytes, a vocabulary file's are its
// strings, and otherwise they are ids.
struct TokenText {
  bool bytes = false;
  std::vector<std::string> vocabulary;

  bool text() const { return bytes || !vocabulary.empty(); }
  absl::StatusOr<std::vector<int32_t>> Encode(const std::string& prompt) const {
    if (!vocabulary.empty()) return EncodeText(vocabulary, prompt.empty() ? "\n" : prompt);
    std::vector<int32_t> ids;
    if (bytes) {
      for (unsigned char ch : prompt.empty() ? std::string("\n") : prompt) ids.push_back(ch);
      return ids;
    }
    for (absl::string_view part :
         absl::StrSplit(prompt, absl::ByAnyChar(", "), absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("'", part,
                         "' is not a token id (this job's tokens are ids: give them separated by "
                         "commas or spaces, or give --vocabulary to write text)"));
      }
      ids.push_back(id);
    }
    if (ids.empty()) ids.push_back(0);
    return ids;
  }
  std::string Decode(int32_t id, bool first) const {
    if (!vocabulary.empty()) {
      return id < static_cast<int32_t>(vocabulary.size()) ? vocabulary[id]
                                                          : absl::StrCat("<", id, ">");
    }
    if (bytes) return std::string(1, static_cast<char>(id));
    return first ? absl::StrCat(id) : absl::StrCat(" ", id);
  }
};

absl::Status CheckSampleFlags(const v1::SampleCommand& c) {
  if (c.tokens() < 0) return UsageError("--tokens must be >= 0");
  if (!std::isfinite(c.temperature()) || c.temperature() < 0) {
    return UsageError("--temperature must be a number >= 0 (0: always the likeliest token)");
  }
  if (c.top_k() < 0) return UsageError("--top_k must be >= 0 (0: all tokens)");
  if (c.seed() < 0) return UsageError("--seed must be >= 0");
  return absl::OkStatus();
}

}  // namespace

absl::Status SampleCommand(const Args& args, const Io& io) {
  v1::SampleCommand c = SampleDefaults();
  std::vector<std::string> pos;
  absl::StatusOr<bool> go = ParseCommandArgs(
      "sample",
      "localpar sample JOB_FILE WEIGHTS [--prompt=TEXT] [flags]\n"
      "Continues the prompt with a trained language model, one token at a time, and prints\n"
      "the prompt and what follows it: text for a byte vocabulary (or with --vocabulary),\n"
      "token ids otherwise. The same --seed gives the same tokens. The time per token goes\n"
      "to stderr.",
      args, &c, KeepOverrides({"stages", "data_path"}), {"JOB_FILE", "WEIGHTS"}, &pos, io.out);
  if (!go.ok() || !*go) return go.status();
  if (absl::Status s = CheckSampleFlags(c); !s.ok()) return s;
  absl::StatusOr<v1::Job> job = LoadJobWithOverrides(pos[0], c.overrides());
  if (!job.ok()) return JobLoadError(job.status());
  TokenText tokens;
  tokens.bytes = job->data().has_text();
  if (!c.vocabulary().empty()) {
    absl::StatusOr<std::vector<std::string>> v = ReadVocabulary(c.vocabulary());
    if (!v.ok()) {
      return CodedError(absl::IsNotFound(v.status()) ? kExitUsage : kExitBadData,
                        absl::StrCat("--vocabulary: ", v.status().message()));
    }
    tokens.vocabulary = *std::move(v);
  }
  std::unique_ptr<Backend> backend;
  TrainedModel model;
  if (absl::Status s =
          OpenModel(pos[0], c.overrides(), pos[1], c.compute(), io.err, &backend, &model);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<int32_t>> prompt = tokens.Encode(c.prompt());
  if (!prompt.ok()) return UsageError(absl::StrCat("--prompt: ", prompt.status().message()));
  SampleOptions o;
  o.prompt = *prompt;
  o.tokens = c.tokens();
  o.temperature = c.temperature();
  o.top_k = c.top_k();
  o.seed = static_cast<uint64_t>(c.seed());
  o.cache = c.cache();
  const int64_t context = model.config.input_shape.empty() ? 0 : model.config.input_shape[0];
  if (context > 0 && static_cast<int64_t>(o.prompt.size()) > context) {
    io.err << "localpar: the prompt's " << o.prompt.size() << " tokens are more than the "
           << "network's context (" << context << "): it sees the last " << context << "\n";
  }
  bool first = true;
  for (int32_t id : o.prompt) {
    io.out << tokens.Decode(id, first);
    first = false;
  }
  io.out.flush();
  absl::StatusOr<SampleStats> stats = SampleTokens(model, o, [&](int32_t id) {
    io.out << tokens.Decode(id, false);
    io.out.flush();
  });
  io.out << "\n";
  if (!stats.ok()) {
    const bool usage = absl::IsInvalidArgument(stats.status());
    const ExitCode code = usage                                        ? kExitUsage
                          : absl::IsFailedPrecondition(stats.status()) ? kExitBadJob
                                                                       : kExitFailure;
    return CodedError(code, absl::StrCat(usage ? "--prompt: " : "", stats.status().message()));
  }
  if (!stats->note.empty()) io.err << "localpar: " << stats->note << "\n";
  const double per = stats->tokens > 0 ? stats->seconds / stats->tokens : 0.0;
  io.err << absl::StrFormat(
      "localpar: %d tokens in %.3f s, %.3f ms per token (%s; %d positions computed, the "
      "%d-token window started again %d times)\n",
      stats->tokens, stats->seconds, 1e3 * per,
      stats->cached ? "key-value cache" : "whole window per token", stats->positions_run,
      model.config.input_shape.empty() ? 0 : model.config.input_shape[0], stats->window_restarts);
  return absl::OkStatus();
}

}  // namespace localpar
