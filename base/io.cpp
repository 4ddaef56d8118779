#include "xla_spawn/base/io.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

namespace xs {

bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 1000);  // a non-blocking console: wait for room, bounded per try
    } else {
      if (n == 0) errno = ENOSPC;
      return false;
    }
  }
  return true;
}

}  // namespace xs
