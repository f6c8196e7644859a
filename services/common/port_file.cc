// Port files.
#include "services/common/port_file.h"

#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/atomic_file.h"

namespace localpar {

absl::Status WritePortFile(const std::string& path, const std::vector<int>& ports) {
  return WriteFileAtomically(path, absl::StrCat(absl::StrJoin(ports, " "), "\n"));
}

std::optional<std::vector<int>> ReadPortFile(const std::string& path, size_t count) {
  std::ifstream in(path);
  std::vector<int> ports;
  for (int p = 0; ports.size() < count && in >> p;) ports.push_back(p);
  if (ports.size() < count || ports[0] <= 0) return std::nullopt;
  return ports;
}

absl::StatusOr<std::vector<int>> WaitForPortFile(const std::string& path, size_t count,
                                                 std::chrono::milliseconds timeout,
                                                 const std::function<bool()>& give_up) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (std::optional<std::vector<int>> ports = ReadPortFile(path, count)) return *ports;
    if (give_up && give_up()) return absl::CancelledError(absl::StrCat(path, ": given up"));
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(path, ": no ports after ", timeout.count(), " ms"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace localpar
