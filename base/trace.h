#pragma once
// The timeline (`xla-spawn --trace FILE`): each replica records spans (mark_step and its
// phases, every collective and the wait inside it, data waits, checkpoint writes, user
// scopes) into memory and writes them to its part file; the launcher merges the parts into one
// Chrome trace-event JSON file (merge_trace below) that Perfetto and chrome://tracing open.
//
//   xs::TraceScope span("evaluate");              // a user span, on the calling thread
//   span.arg("samples", n);
//
// Off (the default) every entry point is one load of a global flag. On, a span costs two
// clock reads and an append under an uncontended mutex (~0.1 us). Spans of one thread nest
// (a scope's destructor ends it); times are CLOCK_MONOTONIC, shared by every process of a
// host, relative to the launcher's start (XLA_SPAWN_TRACE_T0). Names may be any bytes: what is
// not UTF-8 is written as U+FFFD.

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace xs {

// Tracing is on in this process (start_trace ran).
inline std::atomic<bool> trace_on{false};

namespace trace {

inline constexpr const char* kFileEnv = "XLA_SPAWN_TRACE";  // the merged file, set by the launcher
inline constexpr const char* kT0Env = "XLA_SPAWN_TRACE_T0";  // CLOCK_MONOTONIC ns of time 0
inline constexpr int kMaxArgs = 4;

// Starts recording for global ordinal `ordinal` of `attempt` of job `job_id`, writing spans to
// part_path(...) (created 0600, an existing one replaced, never through a symlink) every
// kFlushIntervalMs (a thread of its own), when the buffer fills and at exit. Throws xs::IoError when the part cannot
// be created. start_from_env() does it when XLA_SPAWN_TRACE is set (xm::init); there a failure
// is a warning and the replica runs untraced. Starting again with the same part goes on
// appending to it (xm::init after xm::shutdown).
void start(const std::string& file, const std::string& job_id, int ordinal, int attempt,
           int64_t t0_ns);
void start_from_env(int ordinal, int attempt);
// Writes what is buffered to the part file (also every kFlushIntervalMs, when the buffer
// fills, and at exit). Safe to call when tracing is off, and in a forked child (a no-op).
void flush() noexcept;
// Stops recording and closes the part (tests; spans recorded afterwards are dropped).
void stop() noexcept;

// A replica killed by a signal loses at most the spans it recorded this long before.
inline constexpr int kFlushIntervalMs = 100;

// "<file>.<job id>.<attempt>.<ordinal>.part": where a replica writes its spans.
std::string part_path(const std::string& file, const std::string& job_id, int attempt, int ordinal);
// The longest file name merge() accepts, so that the parts' names fit the filesystem's 255.
inline constexpr size_t kMaxFileNameBytes = 160;

int64_t now_ns() noexcept;  // CLOCK_MONOTONIC

struct Arg {
  const char* key = nullptr;  // a literal: kept by pointer
  int64_t value = 0;
  bool hex = false;            // shown as a 16-digit hex string (graph hashes)
  const char* text = nullptr;  // a literal shown instead of the value
};

// Records a complete span [start_ns, end_ns) on the calling thread. `name` and `category`
// must outlive the process's tracing (literals, or intern()ed).
void record(const char* name, const char* category, int64_t start_ns, int64_t end_ns,
            const Arg* args = nullptr, int n_args = 0) noexcept;
// The same on the track kBetweenStepsTid ("between steps"), for spans that would not nest
// with the calling thread's (the host's time from one mark_step to the next, across which a
// user's own scopes may begin and end).
inline constexpr int kBetweenStepsTid = 1'000'000;
void record_between_steps(const char* name, int64_t start_ns, int64_t end_ns,
                          const Arg* args = nullptr, int n_args = 0) noexcept;
// A stable copy of a run-time name, for record().
const char* intern(const std::string& name);

// Merges the parts of job `job_id` next to `file` (every attempt and ordinal found) into
// `file`: {"traceEvents": [...]} with one track per ordinal, named "ordinal K" ("node N,
// ordinal K" when node >= 0), and per attempt when there were several. Takes only regular
// files of this user, drops lines that are not one whole span of the part's own track (a
// replica killed mid-write leaves a torn last line) and lines over 1 MiB. Written through a
// temporary (0600) renamed into place; refuses a `file` that exists and is not a regular file
// or not a trace (why_not_replaceable).
// Returns the number of spans written. Throws xs::IoError when the file cannot be written, and
// then leaves the parts and any earlier `file` alone; `remove_parts` deletes the parts after a
// successful merge.
// `output`, when not empty, is written instead of `file` (the parts are still found beside
// `file`).
size_t merge(const std::string& file, const std::string& job_id, int node, bool remove_parts,
             const std::string& output = "");

// `file` with `tag` before its extension, in the same directory: ("run/t.json", "node1") ->
// "run/t.node1.json". A node's own trace file, or a job's beside another job's.
std::string tagged_path(const std::string& file, const std::string& tag);

// What identifies a file's contents as last seen: nullopt when there is none at `file`.
struct FileStamp {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t mtime_ns = 0;
  int64_t size = 0;
  bool operator==(const FileStamp&) const = default;
};
std::optional<FileStamp> stamp(const std::string& file);

// Throws xs::InvalidArgument, beginning with `source` ("--trace", "XLA_SPAWN_TRACE"), unless
// `given` can take a trace: a file name whose directory exists, is writable, is not reached
// through another user's symlink and is not /dev's or /proc's, and which names nothing or a
// regular file the merge may replace (why_not_replaceable). Its parts go beside it.
void check_file(const std::string& given, const char* source);

// How many parts of job `job_id` lie next to `file` (what merge() would read).
size_t count_parts(const std::string& file, const std::string& job_id);

// Why the merge must not replace what is at `file`, or empty when it may (nothing there, an
// empty file, or an earlier trace: JSON whose first 4 KiB name "traceEvents" or
// "displayTimeUnit"). A file that is not a trace (a checkpoint or a CSV given the same name)
// is someone's work, and one that cannot be read cannot be told apart from that.
std::string why_not_replaceable(const std::string& file);

}  // namespace trace

// A span from construction to destruction, on the calling thread; nothing when tracing is off.
// Scopes on the stack nest; a TraceScope held elsewhere (an optional, a member) must end before
// the scope around it, or the viewer shows the two overlapping.
class TraceScope {
 public:
  explicit TraceScope(const char* name, const char* category = "user") noexcept {
    if (trace_on.load(std::memory_order_relaxed)) begin(name, category);
  }
  // A run-time name (interned once per distinct name).
  explicit TraceScope(const std::string& name, const char* category = "user");
  ~TraceScope() {
    if (name_ != nullptr) end();
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

  // Up to trace::kMaxArgs arguments shown with the span (more are dropped): integers, hashes
  // (hex) and literal strings.
  void arg(const char* key, int64_t value, bool hex = false) noexcept {
    if (name_ != nullptr && n_args_ < trace::kMaxArgs) args_[n_args_++] = {key, value, hex, nullptr};
  }
  void arg(const char* key, const char* text) noexcept {
    if (name_ != nullptr && n_args_ < trace::kMaxArgs) args_[n_args_++] = {key, 0, false, text};
  }
  bool active() const { return name_ != nullptr; }

 private:
  void begin(const char* name, const char* category) noexcept;
  void end() noexcept;

  const char* name_ = nullptr;
  const char* category_ = nullptr;
  int64_t start_ns_ = 0;
  int n_args_ = 0;
  trace::Arg args_[trace::kMaxArgs];
};

}  // namespace xs
