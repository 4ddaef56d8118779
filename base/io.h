#pragma once
// Whole writes to a file descriptor, the one loop every writer of files, pipes and the console
// uses (trace parts, compile-cache entries, the launcher's output), and whole files replaced
// in one rename (compile-cache entries, graph dumps).
//
//   if (!xs::write_all(fd, bytes)) throw IoError(errno_message("writing " + path, errno));
//   xs::write_all(2, message);  // the console: a failure is ignored on purpose

#include <sys/types.h>

#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace xs {

// Writes all of `bytes` to `fd`. Retries a write interrupted by a signal (EINTR); on a
// non-blocking descriptor that is full (EAGAIN) waits for room, at most 1 s per try, and tries
// again, for ever or, with `stall_limit`, until that long has passed without any byte taken
// (errno ETIMEDOUT). False, with errno set, when a write fails otherwise (ENOSPC, EPIPE,
// EBADF...) or writes nothing (errno ENOSPC: a full disk); what was written before stays
// written.
bool write_all(int fd, std::string_view bytes,
               std::optional<std::chrono::milliseconds> stall_limit = std::nullopt);

// `text` safe to print on a terminal: control characters (ESC, newlines, BEL...) and bytes
// that are not UTF-8 become \xNN, so text from elsewhere (another node's command line) can
// neither move the cursor, retitle the window nor forge a line of its own.
std::string printable_text(std::string_view text);

// The longest prefix of `text` of at most `max_bytes` that does not split a UTF-8 character.
std::string_view utf8_prefix(std::string_view text, size_t max_bytes);

// Writes `parts`, one after the other, to `path` through a temporary of its own beside it
// (`path`.tmp.XXXXXX, mode `mode`) renamed over it: a reader sees the old file or the whole
// new one, and writers racing on one path never meet in a temporary. False, with errno set,
// when any step fails; the temporary is removed.
bool write_file_atomically(const std::string& path, std::initializer_list<std::string_view> parts,
                           mode_t mode = 0600);

// The first symlink met on the way along `path` (every component, and the links those lead
// through, resolved as the kernel would) that belongs to neither this user nor root, described
// as "<where it is> (a symlink of uid N)"; empty when there is none. A path that cannot be
// checked (a working directory getcwd cannot name, a component it may not lstat, a link loop)
// is described too: it cannot be told safe. Whoever owns such a link (planted in /tmp, say) can point the path anywhere at any
// moment, so a directory reached through it is not one to write into or take code from.
std::string foreign_symlink(const std::string& path);

// Whether `path`'s directory, resolved, is in /dev (but for /dev/shm, a file system like any
// other) or /proc: where /dev/stdout and /proc/self/fd/N live, names of devices and
// descriptors rather than of files. False when the directory cannot be resolved.
bool in_dev_or_proc(const std::string& path);

}  // namespace xs
