// Atomic file writes.
#include "common/io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace localpar {
namespace {

std::string DirectoryOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

absl::Status WriteAll(int fd, const std::string& tmp, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(tmp, "write", errno);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FileError(const std::string& path, const char* what, int e) {
  std::string message =
      absl::StrCat(path, ": ", what, " failed: ", std::strerror(e), " (errno ", e, ")");
  switch (e) {
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    default:
      return absl::DataLossError(message);
  }
}

absl::Status CheckWritableDirectory(const std::string& dir, const std::string& flag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", dir, ": cannot create: ", ec.message()));
  const std::string probe = absl::StrCat(dir, "/.localpar-write-check.", getpid());
  if (absl::Status s = WriteFileAtomically(probe, "ok\n"); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", dir, ": not writable: ", s.message()));
  }
  std::filesystem::remove(probe, ec);
  RemoveStaleTemporaries(dir);
  return absl::OkStatus();
}

int RemoveStaleTemporaries(const std::string& dir) {
  std::error_code ec;
  int removed = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 >= name.size()) continue;
    const std::string digits = name.substr(at + 5);
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    // Only a writer that is gone: a live one (another run sharing the folder) keeps its file.
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH && e.is_regular_file(ec)) {
      removed += std::filesystem::remove(e.path(), ec) ? 1 : 0;
    }
  }
  return removed;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<std::string_view> pieces) {
  return WriteFileAtomicallyFrom(path, [&](const ByteSink& sink) {
    for (std::string_view piece : pieces) {
      if (absl::Status s = sink(piece); !s.ok()) return s;
    }
    return absl::OkStatus();
  });
}

absl::Status WriteFileAtomicallyFrom(const std::string& path,
                                     const std::function<absl::Status(const ByteSink&)>& produce) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(tmp, "create", errno);
  absl::Status s = produce([&](std::string_view piece) { return WriteAll(fd, tmp, piece); });
  if (s.ok() && fsync(fd) != 0) s = FileError(tmp, "fsync", errno);
  if (close(fd) != 0 && s.ok()) s = FileError(tmp, "close", errno);
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = FileError(path, "rename", errno);
  if (!s.ok()) {
    unlink(tmp.c_str());
    return s;
  }
  const std::string dir = DirectoryOf(path);
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return FileError(dir, "open to fsync", errno);
  int rc = fsync(dfd);
  int e = errno;
  close(dfd);
  return rc == 0 ? absl::OkStatus() : FileError(dir, "fsync", e);
}

}  // namespace localpar
