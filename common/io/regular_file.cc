// The regular-file check, by stat (never by opening, which is what blocks on a FIFO).
#include "common/io/regular_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace localpar {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

}  // namespace

absl::Status CheckRegularFile(const std::string& path, const std::string& what) {
  const std::string name = what.empty() ? path : absl::StrCat(what, " ", path);
  struct stat st = {};
  if (stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      return absl::NotFoundError(absl::StrCat(name, ": no such file"));
    return absl::PermissionDeniedError(absl::StrCat(name, ": cannot read: ", std::strerror(e)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": is ", KindOf(st.st_mode), ", not a regular file"));
  }
  return absl::OkStatus();
}

}  // namespace localpar
