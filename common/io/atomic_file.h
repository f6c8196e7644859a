// The one way files are written: atomically and durably, with every error checked.
#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace localpar {

// Writes the concatenation of `pieces` to `path`: a temporary file beside it, every write
// checked, fsync and close checked, renamed over `path`, then the directory fsynced. On any
// failure `path` is untouched, the temporary file is removed, and the error names the file,
// the step that failed and the system's reason (errno). A full disk is RESOURCE_EXHAUSTED, a
// missing directory NOT_FOUND, no permission PERMISSION_DENIED, anything else DATA_LOSS.
absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<std::string_view> pieces);
inline absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  return WriteFileAtomically(path, {contents});
}

// The same, for files too large to hold in memory at once: `produce` writes the contents
// piece by piece through the sink it is given, which returns the first write error; an
// error from either ends the write with `path` untouched.
using ByteSink = std::function<absl::Status(std::string_view)>;
absl::Status WriteFileAtomicallyFrom(const std::string& path,
                                     const std::function<absl::Status(const ByteSink&)>& produce);

// Makes `dir` (and its parents) and proves a file can be written there, before any work
// whose result would go there; the error names `flag`, the directory and the reason. Also
// removes what killed writers left there (RemoveStaleTemporaries).
absl::Status CheckWritableDirectory(const std::string& dir, const std::string& flag);

// Removes WriteFileAtomically's temporary files ("NAME.tmp.PID") in `dir` whose writer is
// no longer running (a process killed mid-write); returns how many.
int RemoveStaleTemporaries(const std::string& dir);

// The status for a failed system call on `path` (`what` says which step), from errno.
absl::Status FileError(const std::string& path, const char* what, int error_number);

}  // namespace localpar
