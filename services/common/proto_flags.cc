// Flags from message descriptors.
#include "services/common/proto_flags.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/job/suggest.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "proto/options.pb.h"

namespace localpar {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// A flag: the path of fields from the top message to the one it sets.
struct Flag {
  std::vector<const FieldDescriptor*> path;
  const FieldDescriptor* field() const { return path.back(); }
};

std::string DottedPath(const std::vector<const FieldDescriptor*>& path) {
  std::string out;
  for (const FieldDescriptor* f : path) absl::StrAppend(&out, out.empty() ? "" : ".", f->name());
  return out;
}

void CollectFlags(const Descriptor* d, std::vector<const FieldDescriptor*>* prefix,
                  const FlagOptions& o, std::map<std::string, Flag>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    prefix->push_back(f);
    if (o.exclude.count(f->name()) || o.exclude.count(DottedPath(*prefix))) {
      prefix->pop_back();
      continue;
    }
    if (f->options().HasExtension(v1::help)) {
      (*out)[f->name()] = Flag{*prefix};
    } else if (f->type() == FieldDescriptor::TYPE_MESSAGE && !f->is_repeated()) {
      CollectFlags(f->message_type(), prefix, o, out);
    }
    prefix->pop_back();
  }
}

std::map<std::string, Flag> Flags(const Descriptor* d, const FlagOptions& o) {
  std::map<std::string, Flag> flags;
  std::vector<const FieldDescriptor*> prefix;
  CollectFlags(d, &prefix, o, &flags);
  return flags;
}

// The message holding the flag's field (created along the path).
Message* Holder(Message* top, const Flag& flag) {
  Message* m = top;
  for (size_t i = 0; i + 1 < flag.path.size(); ++i) {
    m = m->GetReflection()->MutableMessage(m, flag.path[i]);
  }
  return m;
}

const Message& ConstHolder(const Message& top, const Flag& flag) {
  const Message* m = &top;
  for (size_t i = 0; i + 1 < flag.path.size(); ++i) {
    m = &m->GetReflection()->GetMessage(*m, flag.path[i]);
  }
  return *m;
}

std::string Suggest(const std::string& name, const std::map<std::string, Flag>& flags) {
  std::vector<std::string> names;
  for (const auto& [candidate, flag] : flags) names.push_back(candidate);
  const std::string best = Closest(name, names);
  return best.empty() ? "" : absl::StrCat("; did you mean --", best, "?");
}

absl::Status Invalid(const std::string& name, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", why));
}

std::string EnumNames(const google::protobuf::EnumDescriptor* e) {
  std::vector<std::string> names;
  for (int i = 0; i < e->value_count(); ++i) names.push_back(e->value(i)->name());
  return absl::StrJoin(names, ", ");
}

absl::Status SetScalar(Message* m, const FieldDescriptor* f, const std::string& name,
                       const std::string& value) {
  const Reflection* r = m->GetReflection();
  const bool count = f->options().GetExtension(v1::count);
  auto negative = [&] { return Invalid(name, absl::StrCat("must be >= 0, got ", value)); };
  auto bad = [&](const char* what) {
    return Invalid(name, absl::StrCat("expected ", what, ", got '", value, "'"));
  };
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      if (f->is_repeated()) {
        r->ClearField(m, f);
        for (absl::string_view v : absl::StrSplit(value, ',', absl::SkipEmpty())) {
          r->AddString(m, f, std::string(v));
        }
      } else if (const std::string& choices = f->options().GetExtension(v1::choices);
                 !choices.empty()) {
        for (absl::string_view c : absl::StrSplit(choices, ',')) {
          if (absl::EqualsIgnoreCase(c, value)) {
            r->SetString(m, f, std::string(c));
            return absl::OkStatus();
          }
        }
        return Invalid(name, absl::StrCat("expected one of ",
                                          absl::StrJoin(absl::StrSplit(choices, ','), ", "),
                                          ", got '", value, "'"));
      } else {
        r->SetString(m, f, value);
      }
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_BOOL: {
      bool b;
      if (!absl::SimpleAtob(value, &b)) return bad("true or false");
      r->SetBool(m, f, b);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v;
      if (!absl::SimpleAtoi(value, &v)) return bad("an integer");
      if (count && v < 0) return negative();
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
        if (v < INT32_MIN || v > INT32_MAX) return bad("a 32-bit integer");
        r->SetInt32(m, f, static_cast<int32_t>(v));
      } else {
        r->SetInt64(m, f, v);
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT: {
      double v;
      if (!absl::SimpleAtod(value, &v) || !std::isfinite(v)) return bad("a number");
      if (count && v < 0) return negative();
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
        r->SetDouble(m, f, v);
      } else {
        r->SetFloat(m, f, static_cast<float>(v));
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const auto* e = f->enum_type()->FindValueByName(absl::AsciiStrToUpper(value));
      if (!e)
        return Invalid(name, absl::StrCat("expected one of ", EnumNames(f->enum_type()), ", got '",
                                          value, "'"));
      r->SetEnum(m, f, e);
      return absl::OkStatus();
    }
    default:
      return Invalid(name, "cannot be set from the command line");
  }
}

// Keeps the parser's first complaint, with its position, for the error message.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (text.empty()) text = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  std::string text;
};

absl::Status LoadConfigFile(const std::string& path, Message* message) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--config ", path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::TextFormat::Parser parser;
  FirstError error;
  parser.RecordErrorsTo(&error);
  if (!parser.MergeFromString(text.str(), message)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--config ", path, ":", error.text, " (a text-format ", message->GetTypeName(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedFlags> ParseFlags(const std::vector<std::string>& args, Message* message,
                                       const FlagOptions& options) {
  const std::map<std::string, Flag> flags = Flags(message->GetDescriptor(), options);
  ParsedFlags out;
  // --config first, so that flags given beside it override the file.
  for (size_t i = 0; options.config_flag && i < args.size(); ++i) {
    if (args[i].rfind("--config=", 0) == 0) {
      if (absl::Status s = LoadConfigFile(args[i].substr(9), message); !s.ok()) return s;
    }
  }
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (flags_done || a.size() < 2 || a[0] != '-') {
      out.positional.push_back(a);
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    if (a == "-h" || a == "--help" || a == "-help") {
      out.help = true;
      continue;
    }
    if (a == "--version") {
      out.version = true;
      continue;
    }
    if (a == "--check_flags") {
      out.check_flags = true;
      continue;
    }
    std::string body = a.substr(a[1] == '-' ? 2 : 1);
    size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    if (options.config_flag && name == "config") continue;
    auto it = flags.find(name);
    bool negated = false;
    if (it == flags.end() && name.rfind("no", 0) == 0 && eq == std::string::npos) {
      it = flags.find(name.substr(2));
      negated =
          it != flags.end() && it->second.field()->cpp_type() == FieldDescriptor::CPPTYPE_BOOL;
      if (!negated) it = flags.end();
    }
    if (it == flags.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, Suggest(name, flags)));
    }
    const FieldDescriptor* f = it->second.field();
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_BOOL) {
      value = negated ? "false" : "true";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return Invalid(name, "needs a value");
    }
    if (absl::Status s = SetScalar(Holder(message, it->second), f, name, value); !s.ok()) return s;
  }
  return out;
}

std::string FlagHelp(const Message& defaults, const FlagOptions& options) {
  const std::map<std::string, Flag> flags = Flags(defaults.GetDescriptor(), options);
  std::vector<std::pair<std::string, std::string>> rows;
  size_t width = 0;
  for (const auto& [name, flag] : flags) {
    const FieldDescriptor* f = flag.field();
    if (f->options().GetExtension(v1::testing)) continue;
    std::string value = f->options().GetExtension(v1::value);
    if (const std::string& choices = f->options().GetExtension(v1::choices); !choices.empty()) {
      value = absl::StrJoin(absl::StrSplit(choices, ','), "|");
    }
    if (value.empty()) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_BOOL:
          break;
        case FieldDescriptor::CPPTYPE_ENUM:
          value = absl::StrJoin(absl::StrSplit(EnumNames(f->enum_type()), ", "), "|");
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
        case FieldDescriptor::CPPTYPE_FLOAT:
          value = "X";
          break;
        default:
          value = "N";
      }
    }
    std::string left = absl::StrCat("  --", name, value.empty() ? "" : "=" + value);
    std::string help = f->options().GetExtension(v1::help);
    const Message& holder = ConstHolder(defaults, flag);
    const Reflection* r = holder.GetReflection();
    std::string def;
    if (!f->is_repeated() && (!f->has_presence() || r->HasField(holder, f))) {
      google::protobuf::TextFormat::PrintFieldValueToString(holder, f, -1, &def);
      if (def == "0" || def == "\"\"" || def == "false") def.clear();
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_ENUM && r->GetEnumValue(holder, f) == 0) {
        def = r->GetEnum(holder, f)->name();
      }
    }
    if (!def.empty()) absl::StrAppend(&help, " (default ", def, ")");
    width = std::max(width, left.size());
    rows.emplace_back(left, help);
  }
  std::string out;
  for (const auto& [left, help] : rows) {
    absl::StrAppend(&out, absl::StrFormat("%-*s  %s\n", static_cast<int>(width), left, help));
  }
  return out;
}

std::vector<std::string> ToFlagArgs(const Message& message, const Message& defaults) {
  std::vector<std::string> out;
  for (const auto& [name, flag] : Flags(message.GetDescriptor(), {})) {
    const FieldDescriptor* f = flag.field();
    const Message& m = ConstHolder(message, flag);
    const Message& d = ConstHolder(defaults, flag);
    std::string a, b;
    if (f->is_repeated()) {
      std::vector<std::string> items;
      for (int i = 0; i < m.GetReflection()->FieldSize(m, f); ++i) {
        items.push_back(m.GetReflection()->GetRepeatedString(m, f, i));
      }
      a = absl::StrJoin(items, ",");
    } else {
      if (f->has_presence() && !m.GetReflection()->HasField(m, f)) continue;
      google::protobuf::TextFormat::PrintFieldValueToString(m, f, -1, &a);
      google::protobuf::TextFormat::PrintFieldValueToString(d, f, -1, &b);
      if (a == b && !(f->has_presence() && !d.GetReflection()->HasField(d, f))) continue;
      if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) a = m.GetReflection()->GetString(m, f);
    }
    if (!f->is_repeated() || !a.empty()) out.push_back(absl::StrCat("--", name, "=", a));
  }
  return out;
}

}  // namespace localpar
