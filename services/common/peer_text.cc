// Peer text, sanitised.
#include "services/common/peer_text.h"

namespace localpar {

std::string SanitizePeerText(std::string_view text, size_t max) {
  std::string out;
  for (char c : text.substr(0, max)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > max) out += "...";
  return out;
}

}  // namespace localpar
