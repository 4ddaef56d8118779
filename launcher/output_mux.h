#pragma once
// Where replica output goes: whole lines to the console (tagged "[ordinal] ", optionally
// timestamped, optionally only some ordinals), every line to DIR/ordinal-<k>.log when a log
// directory is set, to an optional callback, and the last lines of each ordinal kept for the
// failure summary.
//
//   xs::OutputMux mux(options, /*world_size=*/4);
//   mux.on_bytes(2, xs::ReplicaStream::kStdout, bytes_read_from_pipe);
//   mux.on_eof(2, xs::ReplicaStream::kStdout);

#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "xla_spawn/launcher/line_splitter.h"

namespace xs {

enum class ReplicaStream { kStdout, kStderr };

struct OutputOptions {
  bool prefix = true;      // "[k] " before each console line
  // The job ordinal of this node's first replica (multi-node jobs): lines and log files are
  // named by job ordinal, first_ordinal + the local index the mux is given.
  int first_ordinal = 0;
  bool timestamp = false;  // "HH:MM:SS.mmm " (local time) before each line
  // Empty: every ordinal on the console; else shown[k] says whether this node's k-th is.
  std::vector<bool> shown;
  std::string log_dir;     // non-empty: DIR/ordinal-<k>.log gets every line (created if missing)
  size_t tail_lines = 20;  // lines kept per ordinal for the failure summary
  // Called for every line (without '\n'), shown or not, and for each 64 KiB piece of a longer
  // one; for tests and embedding.
  std::function<void(int ordinal, ReplicaStream stream, std::string_view line)> on_line;
  int stdout_fd = 1;  // console: replica stdout lines go here...
  int stderr_fd = 2;  // ...and replica stderr lines and xla-spawn's own messages here
};

class OutputMux {
 public:
  // Opens (appends to) the log files; throws xs::IoError naming the path on failure.
  OutputMux(const OutputOptions& options, int world_size);
  ~OutputMux();
  OutputMux(const OutputMux&) = delete;
  OutputMux& operator=(const OutputMux&) = delete;

  // A new attempt starts: fresh line buffers, a marker line in the log files (attempt > 0).
  void begin_attempt(int attempt);
  void on_bytes(int ordinal, ReplicaStream stream, std::string_view bytes);
  void on_eof(int ordinal, ReplicaStream stream);  // flushes a partial last line

  // The last lines of `ordinal` (both streams, in arrival order), oldest first.
  const std::deque<std::string>& tail(int ordinal) const;

  // Stacks replicas print on request (shm/stack_dump.h): how many began since the last
  // expect_stacks(), and whether every frame they announced has arrived.
  void expect_stacks() { stacks_begun_ = 0; frames_pending_ = 0; }
  bool stacks_complete(int expected) const {
    return stacks_begun_ >= expected && frames_pending_ == 0;
  }

  // xla-spawn's own message, written whole to the console's stderr (and nowhere else).
  void message(std::string_view text) const;
  // A block of whole lines written as is to the console's stderr (the failure summary).
  void report(std::string_view text) const;

 private:
  void emit(int ordinal, ReplicaStream stream, const std::vector<LinePiece>& pieces);

  OutputOptions options_;
  std::vector<LineSplitter> splitters_;  // [2 * ordinal + stream]
  std::vector<std::deque<std::string>> tails_;
  std::vector<FILE*> log_files_;  // empty without --log-dir
  std::vector<bool> log_failed_;  // a write to the ordinal's log failed: it is written no more
  std::vector<LinePiece> scratch_;
  bool console_has_one_writer_ = false;  // one ordinal shown: a long line stays whole there too
  int stacks_begun_ = 0;
  int frames_pending_ = 0;
};

}  // namespace xs
