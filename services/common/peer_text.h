// Text that came from a peer (error messages, keys, names), made safe to print or relay:
// anything but printable ASCII becomes '?', and it is cut at `max` bytes ("..." says so).
// Terminal escape sequences, newlines and megabytes of text never pass through raw.
#pragma once

#include <string>
#include <string_view>

namespace localpar {

std::string SanitizePeerText(std::string_view text, size_t max = 512);

}  // namespace localpar
