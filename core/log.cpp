#include "log.h"

#include <unistd.h>

#include <cerrno>

#include "settings.h"

namespace kiln {

void log_line(const std::string& line) {
  const std::string text = line + "\n";
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

bool debug_log() { return settings::choice("KILN_LOG", {"debug"}).has_value(); }

}  // namespace kiln
