// Vocabulary files: a reader for the pickled dicts nanoGPT writes (data only, nothing run)
// and for plain one-token-per-line files.
#include "common/data/vocabulary.h"

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/regular_file.h"

namespace localpar {
namespace {

constexpr int64_t kMaxTokens = int64_t{1} << 24;

// The values a pickled dict of ints and strings is built from.
struct Value {
  enum Kind { kInt, kText, kDict, kMark } kind = kInt;
  int64_t number = 0;
  std::string text;
  size_t dict = 0;  // index into Unpickler::dicts
};

class Unpickler {
 public:
  explicit Unpickler(const std::string& bytes) : b_(bytes) {}

  absl::StatusOr<Value> Run() {
    while (at_ < b_.size()) {
      const unsigned char op = static_cast<unsigned char>(b_[at_++]);
      if (op == '.') {
        if (stack_.size() != 1) return Bad("a stack of other than one value at STOP");
        return stack_.back();
      }
      if (absl::Status s = Step(op); !s.ok()) return s;
    }
    return Bad("no STOP opcode: the file is cut short");
  }
  std::vector<std::vector<std::pair<Value, Value>>> dicts;

 private:
  absl::Status Step(unsigned char op) {
    uint64_t n = 0;
    switch (op) {
      case 0x80:
        return Skip(1);  // PROTO
      case 0x95:
        return Skip(8);  // FRAME
      case '}':
        dicts.emplace_back();
        return Push({Value::kDict, 0, "", dicts.size() - 1});
      case '(':
        return Push({Value::kMark, 0, "", 0});
      case 'K':
        return Int(1, false);
      case 'M':
        return Int(2, false);
      case 'J':
        return Int(4, true);
      case 0x8c:
        return Text(1);  // SHORT_BINUNICODE
      case 'X':
        return Text(4);  // BINUNICODE
      case 0x8d:
        return Text(8);  // BINUNICODE8
      case 0x94:
        return Memo(memo_.size());
      case 'q':
      case 'r':
        if (!Read(op == 'q' ? 1 : 4, &n)) return Bad("cut short");
        return Memo(n);
      case 'h':
      case 'j': {
        if (!Read(op == 'h' ? 1 : 4, &n)) return Bad("cut short");
        auto it = memo_.find(n);
        if (it == memo_.end()) return Bad(absl::StrCat("memo ", n, " read before it is written"));
        return Push(it->second);
      }
      case 's':
        if (stack_.size() < 3) return Bad("SETITEM without a dict, a key and a value");
        return AddPairs(stack_.size() - 3, stack_.size() - 2);
      case 'u': {
        size_t mark = stack_.size();
        while (mark > 0 && stack_[mark - 1].kind != Value::kMark) --mark;
        if (mark < 2) return Bad("SETITEMS without a dict and a MARK");
        absl::Status s = AddPairs(mark - 2, mark);
        if (s.ok()) stack_.pop_back();  // the mark
        return s;
      }
      default:
        return Bad(absl::StrFormat(
            "opcode 0x%02x at byte %d is not one a plain dict of ints and strings uses "
            "(expected nanoGPT's {'vocab_size', 'itos', 'stoi'})",
            op, at_ - 1));
    }
  }
  absl::Status Bad(const std::string& why) const {
    return absl::InvalidArgumentError("not a pickled vocabulary: " + why);
  }
  bool Read(size_t bytes, uint64_t* v) {
    if (at_ + bytes > b_.size()) return false;
    *v = 0;
    for (size_t i = 0; i < bytes; ++i) {
      *v |= static_cast<uint64_t>(static_cast<unsigned char>(b_[at_ + i])) << (8 * i);
    }
    at_ += bytes;
    return true;
  }
  absl::Status Skip(size_t bytes) {
    uint64_t ignored;
    return Read(bytes, &ignored) ? absl::OkStatus() : Bad("cut short");
  }
  absl::Status Push(Value v) {
    if (stack_.size() > (size_t{1} << 26)) return Bad("too deep");
    stack_.push_back(std::move(v));
    return absl::OkStatus();
  }
  absl::Status Int(size_t bytes, bool is_signed) {
    uint64_t v;
    if (!Read(bytes, &v)) return Bad("cut short");
    int64_t n = static_cast<int64_t>(v);
    if (is_signed) n = static_cast<int32_t>(static_cast<uint32_t>(v));
    return Push({Value::kInt, n, "", 0});
  }
  absl::Status Text(size_t bytes) {
    uint64_t len;
    if (!Read(bytes, &len) || len > b_.size() - at_) return Bad("a string runs past the end");
    Value v{Value::kText, 0, b_.substr(at_, len), 0};
    at_ += len;
    return Push(std::move(v));
  }
  absl::Status Memo(uint64_t index) {
    if (stack_.empty()) return Bad("a memo of an empty stack");
    memo_[index] = stack_.back();
    return absl::OkStatus();
  }
  // Adds the key-value pairs stack_[from..] to the dict at stack_[dict_at], and pops them.
  absl::Status AddPairs(size_t dict_at, size_t from) {
    if (stack_[dict_at].kind != Value::kDict || (stack_.size() - from) % 2 != 0) {
      return Bad("SETITEM without a dict and key-value pairs");
    }
    auto& d = dicts[stack_[dict_at].dict];
    for (size_t i = from; i < stack_.size(); i += 2) d.emplace_back(stack_[i], stack_[i + 1]);
    stack_.resize(from);
    return absl::OkStatus();
  }

  const std::string& b_;
  size_t at_ = 0;
  std::vector<Value> stack_;
  std::map<uint64_t, Value> memo_;
};

absl::StatusOr<std::vector<std::string>> FromPickle(const std::string& bytes) {
  Unpickler u(bytes);
  absl::StatusOr<Value> top = u.Run();
  if (!top.ok()) return top.status();
  if (top->kind != Value::kDict) return absl::InvalidArgumentError("the pickle is not a dict");
  const std::vector<std::pair<Value, Value>>* itos = nullptr;
  for (const auto& [k, v] : u.dicts[top->dict]) {
    if (k.kind == Value::kText && k.text == "itos" && v.kind == Value::kDict)
      itos = &u.dicts[v.dict];
  }
  if (itos == nullptr) return absl::InvalidArgumentError("the dict has no 'itos' dict");
  std::map<int64_t, std::string> by_id;
  for (const auto& [k, v] : *itos) {
    if (k.kind != Value::kInt || v.kind != Value::kText || k.number < 0 || k.number >= kMaxTokens) {
      return absl::InvalidArgumentError("'itos' maps something other than token ids to strings");
    }
    by_id[k.number] = v.text;
  }
  std::vector<std::string> out;
  for (const auto& [id, text] : by_id) {
    if (id != static_cast<int64_t>(out.size())) {
      return absl::InvalidArgumentError(absl::StrCat("'itos' has no token ", out.size()));
    }
    out.push_back(text);
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> FromLines(const std::string& bytes) {
  std::vector<std::string> out;
  std::string token;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c == '\n') {
      out.push_back(std::move(token));
      token.clear();
      if (static_cast<int64_t>(out.size()) > kMaxTokens) {
        return absl::InvalidArgumentError(absl::StrCat("over ", kMaxTokens, " tokens"));
      }
      continue;
    }
    if (c != '\\') {
      token += c;
      continue;
    }
    const char e = i + 1 < bytes.size() ? bytes[++i] : '\0';
    if (e == 'n')
      token += '\n';
    else if (e == 't')
      token += '\t';
    else if (e == 'r')
      token += '\r';
    else if (e == '\\')
      token += '\\';
    else {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", out.size() + 1, ": unknown escape (write \\n, \\t, \\r or \\\\)"));
    }
  }
  if (!token.empty()) out.push_back(std::move(token));
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ReadVocabulary(const std::string& path) {
  if (absl::Status s = CheckRegularFile(path, "vocabulary"); !s.ok()) return s;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream all;
  all << in.rdbuf();
  const std::string bytes = all.str();
  if (!in && !in.eof()) return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  if (bytes.size() > (size_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": over 1 GiB"));
  }
  const bool pickled = !bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x80;
  absl::StatusOr<std::vector<std::string>> v = pickled ? FromPickle(bytes) : FromLines(bytes);
  if (!v.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", v.status().message()));
  if (v->empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens"));
  return v;
}

absl::StatusOr<std::vector<int32_t>> EncodeText(const std::vector<std::string>& vocabulary,
                                                const std::string& text) {
  std::map<std::string, int32_t> ids;
  size_t longest = 0;
  for (size_t i = 0; i < vocabulary.size(); ++i) {
    if (vocabulary[i].empty()) continue;
    ids.emplace(vocabulary[i], static_cast<int32_t>(i));  // the first of duplicates
    longest = std::max(longest, vocabulary[i].size());
  }
  std::vector<int32_t> out;
  for (size_t at = 0; at < text.size();) {
    size_t len = std::min(longest, text.size() - at);
    for (; len > 0; --len) {
      auto it = ids.find(text.substr(at, len));
      if (it == ids.end()) continue;
      out.push_back(it->second);
      at += len;
      break;
    }
    if (len == 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("byte %d (0x%02x) of the prompt starts no token of the vocabulary", at,
                          static_cast<unsigned char>(text[at])));
    }
  }
  return out;
}

}  // namespace localpar
