#include "xla_spawn/launcher/output_mux.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"
#include "xla_spawn/shm/stack_dump.h"

namespace xs {
namespace {

// 1 KiB per kept line: the summary shows the gist, the log file keeps everything.
constexpr size_t kTailLineBytes = 1024;

std::string timestamp_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  ::localtime_r(&seconds, &local);
  return fmt::format("{:02}:{:02}:{:02}.{:03} ", local.tm_hour, local.tm_min, local.tm_sec, millis);
}

// Appends to DIR/ordinal-K.log, owner-only whatever the umask, like checkpoints and segments.
// A symlink there is refused (O_NOFOLLOW) rather than followed to a file elsewhere, a FIFO
// (O_NONBLOCK: no reader means ENXIO, not a wait) or any other non-file by its type.
FILE* open_log(const std::string& dir, int ordinal) {
  const std::string path = fmt::format("{}/ordinal-{}.log", dir, ordinal);
  // O_CLOEXEC: replicas must not inherit it.
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) {
    // A directory no file can be made in (no permission, read-only, /proc) is a bad value, as
    // one that cannot be made (exit 2); anything else the system refused (a full disk), 1.
    const int error = errno;
    const std::string what =
        errno_message(fmt::format("--log-dir {}: cannot open ordinal-{}.log", dir, ordinal), error);
    if (error == EACCES || error == EPERM || error == EROFS || error == ENOENT ||
        error == ENOTDIR || error == EISDIR) {
      throw InvalidArgument(what);
    }
    throw IoError(what);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw IoError(fmt::format("log file {}: not a regular file", path));
  }
  if (st.st_nlink > 1) {
    // Another name of some file (planted where the kernel lets anyone hard-link it): the log
    // would be appended to that file.
    ::close(fd);
    throw IoError(fmt::format("log file {} has {} names (a hard link): it may be another file's; "
                              "remove it or choose another --log-dir",
                              path, st.st_nlink));
  }
  if (st.st_uid != ::geteuid()) {
    // Its owner can read what the replicas print (and chmod it back after ours).
    ::close(fd);
    throw IoError(fmt::format(
        "log file {} belongs to uid {}, not this user (uid {}): its owner could read the "
        "replicas' output; remove it or choose another --log-dir",
        path, st.st_uid, ::geteuid()));
  }
  if ((st.st_mode & 077) != 0) ::fchmod(fd, 0600);  // left by an older run: owner-only now
  FILE* file = ::fdopen(fd, "a");
  if (file == nullptr) {
    const int error = errno;
    ::close(fd);
    throw IoError(errno_message(fmt::format("open log file {}", path), error));
  }
  return file;
}

}  // namespace

OutputMux::OutputMux(const OutputOptions& options, int world_size)
    : options_(options),
      splitters_(2 * static_cast<size_t>(world_size)),
      tails_(static_cast<size_t>(world_size)) {
  XS_CHECK_ARG(options_.shown.empty() || options_.shown.size() == static_cast<size_t>(world_size),
               "OutputOptions::shown has {} entries for world size {}", options_.shown.size(),
               world_size);
  const auto shown = options_.shown.empty()
                         ? world_size
                         : std::count(options_.shown.begin(), options_.shown.end(), true);
  console_has_one_writer_ = shown == 1;
  if (options_.log_dir.empty()) return;
  if (const std::string link = foreign_symlink(options_.log_dir); !link.empty()) {
    // Its owner would choose where the replicas' output goes.
    throw InvalidArgument(fmt::format(
        "--log-dir {}: reached through {}, whose owner could point it anywhere; give its real "
        "path if you trust them",
        options_.log_dir, link));
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.log_dir, ec);
  if (ec) {  // a bad value, as a --trace directory that is not one (exit 2)
    throw InvalidArgument(
        fmt::format("--log-dir {}: cannot create directory: {}", options_.log_dir, ec.message()));
  }
  log_failed_.assign(static_cast<size_t>(world_size), false);
  for (int k = 0; k < world_size; ++k) {
    try {
      log_files_.push_back(open_log(options_.log_dir, options_.first_ordinal + k));
    } catch (...) {
      for (FILE* file : log_files_) std::fclose(file);
      throw;
    }
  }
}

OutputMux::~OutputMux() {
  for (FILE* file : log_files_) std::fclose(file);
}

void OutputMux::begin_attempt(int attempt) {
  for (LineSplitter& splitter : splitters_) splitter = LineSplitter();
  if (attempt == 0) return;
  const std::string marker = fmt::format("--- xla-spawn: attempt {} ---\n", attempt);
  for (FILE* file : log_files_) {
    std::fputs(marker.c_str(), file);
    std::fflush(file);
  }
}

void OutputMux::on_bytes(int ordinal, ReplicaStream stream, std::string_view bytes) {
  scratch_.clear();
  splitters_[2 * static_cast<size_t>(ordinal) + static_cast<size_t>(stream)].feed(bytes, scratch_);
  if (!scratch_.empty()) emit(ordinal, stream, scratch_);
}

void OutputMux::on_eof(int ordinal, ReplicaStream stream) {
  scratch_.clear();
  splitters_[2 * static_cast<size_t>(ordinal) + static_cast<size_t>(stream)].finish(scratch_);
  if (!scratch_.empty()) emit(ordinal, stream, scratch_);
}

void OutputMux::emit(int ordinal, ReplicaStream stream, const std::vector<LinePiece>& pieces) {
  const auto k = static_cast<size_t>(ordinal);
  const std::string stamp = options_.timestamp ? timestamp_now() : std::string();
  const std::string prefix =
      options_.prefix ? fmt::format("[{}] {}", options_.first_ordinal + ordinal, stamp) : stamp;
  const bool shown = options_.shown.empty() || options_.shown[k];
  std::string console;
  std::string file_text;
  for (const LinePiece& piece : pieces) {
    const std::string& line = piece.text;
    if (piece.starts_line) {
      // A replica's stack (shm/stack_dump.h): counted, so the hang report knows when it is
      // whole.
      if (stream == ReplicaStream::kStderr) {
        if (const std::optional<int> frames = stack_header_frames(line)) {
          ++stacks_begun_;
          frames_pending_ += *frames;
        } else if (frames_pending_ > 0 && line.starts_with(kFrameLinePrefix)) {
          --frames_pending_;
        }
      }
      tails_[k].push_back(line.substr(0, kTailLineBytes));
      if (tails_[k].size() > options_.tail_lines) tails_[k].pop_front();
    }
    // A line longer than the cap goes on where its piece stopped, unless other replicas
    // write to the same console: then each piece is a line of its own, since waiting for the
    // rest of the line would hold up their output.
    if (shown && console_has_one_writer_) {
      if (piece.starts_line) console.append(prefix);
      console.append(line);
      if (piece.ends_line) console.push_back('\n');
    } else if (shown) {
      console.append(prefix).append(line).push_back('\n');
    }
    if (!log_files_.empty()) {  // one file per ordinal: its lines stay whole
      if (piece.starts_line) file_text.append(stamp);
      file_text.append(line);
      if (piece.ends_line) file_text.push_back('\n');
    }
    if (options_.on_line) options_.on_line(ordinal, stream, line);
  }
  // One write per batch: whole lines (or pieces of one over the cap) only, so concurrent
  // replicas never split a line.
  if (!console.empty()) {
    write_all(stream == ReplicaStream::kStdout ? options_.stdout_fd : options_.stderr_fd, console);
  }
  if (!file_text.empty() && !log_failed_[k]) {
    errno = 0;
    const size_t written = std::fwrite(file_text.data(), 1, file_text.size(), log_files_[k]);
    if (std::fflush(log_files_[k]) != 0 || written != file_text.size()) {
      // A full disk: said once, and the log ends there rather than with a gap in the middle.
      log_failed_[k] = true;
      message(fmt::format("{}; ordinal {}'s later lines are not in it",
                          errno_message(fmt::format("cannot write log file {}/ordinal-{}.log",
                                                    options_.log_dir,
                                                    options_.first_ordinal + ordinal),
                                        errno),
                          options_.first_ordinal + ordinal));
    }
  }
}

const std::deque<std::string>& OutputMux::tail(int ordinal) const {
  return tails_[static_cast<size_t>(ordinal)];
}

void OutputMux::message(std::string_view text) const {
  std::string line = fmt::format("xla-spawn: {}", text);
  if (line.empty() || line.back() != '\n') line.push_back('\n');
  write_all(options_.stderr_fd, line);
}

void OutputMux::report(std::string_view text) const {
  write_all(options_.stderr_fd, text);
}

}  // namespace xs
