#pragma once
// Whole writes to a file descriptor, the one loop every writer of files, pipes and the console
// uses (trace parts, compile-cache entries, the launcher's output).
//
//   if (!xs::write_all(fd, bytes)) throw IoError(errno_message("writing " + path, errno));
//   xs::write_all(2, message);  // the console: a failure is ignored on purpose

#include <string_view>

namespace xs {

// Writes all of `bytes` to `fd`. Retries a write interrupted by a signal (EINTR); on a
// non-blocking descriptor that is full (EAGAIN) waits for room, at most 1 s per try, and tries
// again. False, with errno set, when a write fails otherwise (ENOSPC, EPIPE, EBADF...) or
// writes nothing (errno ENOSPC: a full disk); what was written before stays written.
bool write_all(int fd, std::string_view bytes);

}  // namespace xs
