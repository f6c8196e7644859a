// Files read as weights, data or jobs must be regular files: opening a FIFO blocks until
// someone writes to it, and a device or socket never ends, so either would hang the reader.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace localpar {

// OK when `path` (after symbolic links) is a regular file. Otherwise NOT_FOUND ("PATH: no
// such file"), or INVALID_ARGUMENT naming what it is ("PATH: is a FIFO (named pipe), not a
// regular file"); `what` ("token file", "weights file") starts the message when not empty.
absl::Status CheckRegularFile(const std::string& path, const std::string& what = "");

}  // namespace localpar
