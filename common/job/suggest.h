// "Did you mean" suggestions for misspelt names (flags, job fields, enum values).
#pragma once

#include <string>
#include <vector>

namespace localpar {

// Levenshtein distance (insertions, deletions, substitutions).
size_t EditDistance(const std::string& a, const std::string& b);

// The candidate closest to `name`, if it is within max(2, |name| / 3) edits; else "".
std::string Closest(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace localpar
