// A token vocabulary's text, for sampling: nanoGPT's meta.pkl or a plain vocabulary file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace localpar {

// Token i's text is element i. Reads either
//  - nanoGPT's meta.pkl (a pickled dict with `itos`, token id to string): only the pickle
//    opcodes that plain dicts of ints and strings use are understood, and nothing in the
//    file is ever run; anything else is refused naming the opcode; or
//  - a plain file: one token per line, line i for token i, with "\n", "\t", "\r" and "\\"
//    written as those escapes.
// A vocabulary with a gap in its ids, or over 2^24 tokens, is refused.
absl::StatusOr<std::vector<std::string>> ReadVocabulary(const std::string& path);

// Text to token ids, taking the longest token that matches at each point. The error names
// the first byte offset no token matches.
absl::StatusOr<std::vector<int32_t>> EncodeText(const std::vector<std::string>& vocabulary,
                                                const std::string& text);

}  // namespace localpar
