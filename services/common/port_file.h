// Port files: how a process that bound port 0 tells whoever started it (the launcher, a
// test) which ports it got: one line of space-separated numbers, written atomically.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace localpar {

absl::Status WritePortFile(const std::string& path, const std::vector<int>& ports);
// The first `count` ports in `path`; nullopt while it is absent or incomplete.
std::optional<std::vector<int>> ReadPortFile(const std::string& path, size_t count);
// Polls `path` until it holds `count` ports. Gives up (DEADLINE_EXCEEDED) after `timeout`,
// or (CANCELLED) as soon as `give_up` returns true (the process died, Ctrl-C).
absl::StatusOr<std::vector<int>> WaitForPortFile(const std::string& path, size_t count,
                                                 std::chrono::milliseconds timeout,
                                                 const std::function<bool()>& give_up = nullptr);

}  // namespace localpar
