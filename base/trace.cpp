#include "xla_spawn/base/trace.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/io.h"

namespace xs {
namespace trace {
namespace {

// Spans kept in memory before they are written out (~140 bytes each).
constexpr size_t kFlushSpans = 16384;
// Spans per replica and attempt, by default (XLA_SPAWN_TRACE_MAX_SPANS): ~30 MB of JSON, some
// minutes of a fast training loop. A trace is for looking at steps, not for whole days.
constexpr int64_t kDefaultMaxSpans = 200'000;
// Track ids: attempt a's ordinal k is pid a * kAttemptStride + k.
constexpr int kAttemptStride = 1 << 20;

struct Span {
  const char* name;
  const char* category;
  int64_t start_ns;
  int64_t end_ns;
  int tid;
  int n_args;
  Arg args[kMaxArgs];
};

// Two locks, always taken in this order when both are: `writing` serialises writes to the part
// and guards the file's state (fd, good_bytes, lost, named_tids); `mutex` guards the buffer
// and counters, and is held only for an append or a swap, so a write never stalls the
// threads that record.
struct Recorder {
  std::mutex writing;
  std::mutex mutex;
  std::vector<Span> spans;
  std::vector<Span> spare;  // the other buffer, empty, keeping its capacity
  std::string path;  // the part being written
  int fd = -1;
  off_t good_bytes = 0;       // the part's size after its last whole write
  int64_t lost = 0;           // spans a failed write dropped, said in the part at the next one
  pid_t owner = 0;            // the process that started: a forked child writes nothing
  int pid = 0;
  int64_t t0_ns = 0;
  int64_t max_spans = kDefaultMaxSpans;
  int64_t recorded = 0;
  bool truncated = false;
  int next_tid = 1;
  std::set<int> named_tids;  // threads whose name line is written
  std::unordered_set<std::string> names;
  bool hooks = false;    // the exit and fork hooks are installed
  // A process traced outside any xla-spawn job (XLA_SPAWN_TRACE set, no job id): no launcher
  // merges its part, so its exit hook does, into solo_file.
  std::string solo_file;
  std::string solo_job;
  pid_t writer = 0;      // the process whose writer thread runs (threads do not survive fork)
};

// Distinct run-time names kept (TraceScope(std::string)); past it, names are not kept.
constexpr size_t kMaxNames = 100'000;

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: the exit hook writes through it
  return *r;
}

thread_local int t_tid = -1;

// The length of the UTF-8 sequence starting at p (1..4), or 0 when it is not one (overlong
// forms, surrogates and code points past U+10FFFF included).
size_t utf8_length(const unsigned char* p) {
  const unsigned c = p[0];
  size_t n = 0;
  uint32_t cp = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; ++i) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  const bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
  if (overlong || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return 0;
  return n;
}

// JSON string contents: quotes, backslashes and control characters escaped, bytes that are
// not UTF-8 replaced by U+FFFD (a strict parser rejects the whole file otherwise).
void append_escaped(fmt::memory_buffer& out, const char* text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text);
  while (*p != 0) {
    const unsigned char c = *p;
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++p;
    } else if (c < 0x20) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
      ++p;
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++p;
    } else if (const size_t n = utf8_length(p); n > 0) {
      out.append(reinterpret_cast<const char*>(p), reinterpret_cast<const char*>(p) + n);
      p += n;
    } else {
      out.append(std::string_view("\xef\xbf\xbd"));
      ++p;
    }
  }
}

// Nanoseconds as microseconds with three decimals, exactly (integers: a double's formatting
// costs more than the rest of the line).
void append_us(fmt::memory_buffer& out, int64_t ns) {
  if (ns < 0) {
    out.push_back('-');
    ns = -ns;
  }
  fmt::format_to(std::back_inserter(out), "{}.{:03}", ns / 1000, ns % 1000);
}

// One line per span: a complete Chrome trace event ("X": begin and duration, microseconds).
void format_span(fmt::memory_buffer& out, const Recorder& r, const Span& s) {
  out.append(std::string_view("{\"name\":\""));
  append_escaped(out, s.name);
  out.append(std::string_view("\",\"cat\":\""));
  append_escaped(out, s.category);
  out.append(std::string_view("\",\"ph\":\"X\",\"ts\":"));
  append_us(out, s.start_ns - r.t0_ns);
  out.append(std::string_view(",\"dur\":"));
  append_us(out, s.end_ns - s.start_ns);
  fmt::format_to(std::back_inserter(out), ",\"pid\":{},\"tid\":{}", r.pid, s.tid);
  if (s.n_args > 0) {
    out.append(std::string_view(",\"args\":{"));
    for (int i = 0; i < s.n_args; ++i) {
      out.append(std::string_view(i == 0 ? "\"" : ",\""));
      append_escaped(out, s.args[i].key);
      if (s.args[i].text != nullptr) {
        out.append(std::string_view("\":\""));
        append_escaped(out, s.args[i].text);
        out.push_back('"');
      } else if (s.args[i].hex) {
        fmt::format_to(std::back_inserter(out), "\":\"{:016x}\"", static_cast<uint64_t>(s.args[i].value));
      } else {
        fmt::format_to(std::back_inserter(out), "\":{}", s.args[i].value);
      }
    }
    out.push_back('}');
  }
  out.append(std::string_view("}\n"));
}

std::string thread_name(int tid) {
  if (tid == 0) return "main";
  if (tid == kBetweenStepsTid) return "between steps (host code, tracing the next step)";
  return fmt::format("thread {}", tid);
}

// Writes `batch` (and the names of threads not seen before); caller holds `writing`. A failed
// write (a full disk) is cut back to the last whole line, so the part never holds a torn line
// that the next write would glue onto; the spans are counted as lost, and the next write that
// succeeds says how many.
void write_batch(Recorder& r, const std::vector<Span>& batch) {
  if (r.fd < 0 || batch.empty()) return;
  fmt::memory_buffer out;
  if (r.lost > 0) {
    fmt::format_to(std::back_inserter(out),
                   "{{\"name\":\"{} span(s) lost (a write to the part failed)\",\"cat\":\"trace\","
                   "\"ph\":\"X\",\"ts\":",
                   r.lost);
    append_us(out, batch.front().start_ns - r.t0_ns);
    fmt::format_to(std::back_inserter(out), ",\"dur\":0.000,\"pid\":{},\"tid\":0}}\n", r.pid);
  }
  std::set<int> named = r.named_tids;
  for (const Span& s : batch) {
    if (named.insert(s.tid).second) {
      fmt::format_to(std::back_inserter(out),
                     "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}\n",
                     r.pid, s.tid, thread_name(s.tid));
    }
    format_span(out, r, s);
  }
  if (write_all(r.fd, {out.data(), out.size()})) {
    r.good_bytes += static_cast<off_t>(out.size());
    r.named_tids = std::move(named);
    r.lost = 0;
  } else {
    [[maybe_unused]] const int rc = ::ftruncate(r.fd, r.good_bytes);
    r.lost += static_cast<int64_t>(batch.size());
  }
}

void flush_at_exit() {
  flush();
  Recorder& r = recorder();
  if (r.owner != ::getpid()) return;
  if (r.lost > 0) {  // the last writes failed: no later one carries the count into the part
    std::fprintf(stderr, "%s: %lld span(s) of the timeline lost: the writes to %s failed\n",
                 program_invocation_short_name, static_cast<long long>(r.lost), r.path.c_str());
  }
  if (r.solo_file.empty()) return;
  try {
    const size_t spans = merge(r.solo_file, r.solo_job, -1, /*remove_parts=*/true);
    std::fprintf(stderr, "%s: trace of %zu span(s) written to %s\n", program_invocation_short_name,
                 spans, r.solo_file.c_str());
  } catch (const std::exception& e) {
    const bool kept = ::access(r.path.c_str(), F_OK) == 0;
    std::fprintf(stderr, "%s: trace not written: %s%s%s%s\n", program_invocation_short_name,
                 e.what(), kept ? " (the part " : "", kept ? r.path.c_str() : "",
                 kept ? " is kept)" : "");
  }
}

// Writes the buffer every kFlushIntervalMs, whatever the replica does: a replica stuck in a
// sleep, a loop or a wait, then killed, keeps what it recorded up to then. Detached: it never
// keeps the process alive, and the recorder it writes through is never destroyed.
void write_periodically() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(kFlushIntervalMs));
    if (trace_on.load(std::memory_order_relaxed)) flush();
  }
}

// A child forked without exec holds a copy of the buffer (and maybe of a locked mutex): it
// must neither write the parent's spans again nor record its own into the parent's part.
void forget_in_child() {
  trace_on.store(false, std::memory_order_relaxed);
}

}  // namespace

std::string part_path(const std::string& file, const std::string& job_id, int attempt, int ordinal) {
  return fmt::format("{}.{}.{}.{}.part", file, job_id, attempt, ordinal);
}

int64_t now_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void start(const std::string& file, const std::string& job_id, int ordinal, int attempt,
           int64_t t0_ns) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> write_lock(r.writing);
  std::lock_guard<std::mutex> lock(r.mutex);
  const std::string path = part_path(file, job_id, attempt, ordinal);
  if (r.fd >= 0 && r.path == path && r.owner == ::getpid()) {  // xm::init after xm::shutdown
    trace_on.store(true, std::memory_order_relaxed);
    return;
  }
  if (r.fd >= 0) ::close(r.fd);
  r.fd = -1;
  ::unlink(path.c_str());  // a part of an earlier job; O_EXCL below refuses anything planted since
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw IoError(errno_message("tracing: creating " + path, errno));
  r.fd = fd;
  r.path = path;
  r.good_bytes = 0;
  r.owner = ::getpid();
  r.pid = attempt * kAttemptStride + ordinal;
  r.t0_ns = t0_ns;
  try {
    r.max_spans = env_int("XLA_SPAWN_TRACE_MAX_SPANS", 1, int64_t{1} << 40).value_or(kDefaultMaxSpans);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "%s: %s; tracing keeps the default %lld spans\n",
                 program_invocation_short_name, e.what(), static_cast<long long>(kDefaultMaxSpans));
    r.max_spans = kDefaultMaxSpans;
  }
  r.recorded = 0;
  r.lost = 0;
  r.truncated = false;
  r.spans.clear();
  // Both buffers at full size from the start: growing one span at a time would copy and
  // page-fault the whole buffer over and over (it was most of a span's cost, ~1.3 us).
  r.spans.reserve(kFlushSpans);
  r.spare.reserve(kFlushSpans);
  r.named_tids.clear();
  r.next_tid = 1;
  t_tid = 0;  // the starting thread is the replica's main thread
  if (!r.hooks) {
    std::atexit(flush_at_exit);
    ::pthread_atfork(nullptr, nullptr, forget_in_child);
    r.hooks = true;
  }
  if (r.writer != r.owner) {
    std::thread(write_periodically).detach();
    r.writer = r.owner;
  }
  trace_on.store(true, std::memory_order_relaxed);
}

void start_from_env(int ordinal, int attempt) {
  const std::optional<std::string> file = env_string(kFileEnv);
  if (!file) return;
  try {
    const int64_t t0 = env_int(kT0Env, 0, now_ns()).value_or(now_ns());  // not in the future
    const std::optional<std::string> job_id = env_string("XLA_SPAWN_JOB_ID");
    // Alone, nobody checked FILE before: its part would go beside a directory or a device.
    if (!job_id) check_file(*file, kFileEnv);
    const std::string job = job_id.value_or(fmt::format("solo-{}", ::getpid()));
    start(*file, job, ordinal, attempt, t0);
    Recorder& r = recorder();
    r.solo_file = job_id ? std::string() : *file;
    r.solo_job = job_id ? std::string() : job;
  } catch (const std::exception& e) {  // a timeline is never worth the job
    std::fprintf(stderr, "%s: ordinal %d runs without tracing: %s\n", program_invocation_short_name,
                 ordinal, e.what());
    trace_on.store(false, std::memory_order_relaxed);
  }
}

void flush() noexcept {
  Recorder& r = recorder();
  if (r.owner != 0 && r.owner != ::getpid()) return;  // a forked child: not its part
  std::lock_guard<std::mutex> write_lock(r.writing);
  std::vector<Span> batch;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    batch.swap(r.spans);
    r.spans.swap(r.spare);  // the empty buffer of the last write, with its capacity
  }
  try {
    write_batch(r, batch);
  } catch (const std::exception&) {  // allocation: the spans are dropped, not the job
  }
  batch.clear();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.spare.capacity() < batch.capacity()) r.spare.swap(batch);
}

void stop() noexcept {
  trace_on.store(false, std::memory_order_relaxed);
  flush();
  Recorder& r = recorder();
  if (r.owner != 0 && r.owner != ::getpid()) return;
  std::lock_guard<std::mutex> write_lock(r.writing);
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.fd >= 0) ::close(r.fd);
  r.fd = -1;
  r.path.clear();
}

namespace {

// Appends a span under the buffer's lock; true when the buffer is full and must be written.
bool append(Recorder& r, const Span& span) {
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.recorded >= r.max_spans) {
    if (!r.truncated) {  // one last span says where and why the trace ends
      r.truncated = true;
      r.spans.push_back({"trace truncated (XLA_SPAWN_TRACE_MAX_SPANS)", "trace", span.start_ns,
                         span.start_ns, 0, 0, {}});
    }
    return false;
  }
  r.spans.push_back(span);
  if (span.tid < 0) r.spans.back().tid = t_tid = r.next_tid++;
  ++r.recorded;
  return r.spans.size() >= kFlushSpans;
}

}  // namespace

namespace {

void record_on(int tid, const char* name, const char* category, int64_t start_ns, int64_t end_ns,
               const Arg* args, int n_args) noexcept {
  Span span{name, category, start_ns, end_ns, tid, std::min(n_args, kMaxArgs), {}};
  std::copy(args, args + span.n_args, span.args);
  try {
    if (append(recorder(), span)) flush();
  } catch (const std::exception&) {  // allocation: the span is dropped, not the job
  }
}

}  // namespace

void record(const char* name, const char* category, int64_t start_ns, int64_t end_ns,
            const Arg* args, int n_args) noexcept {
  if (trace_on.load(std::memory_order_relaxed)) record_on(t_tid, name, category, start_ns, end_ns, args, n_args);
}

void record_between_steps(const char* name, int64_t start_ns, int64_t end_ns, const Arg* args,
                          int n_args) noexcept {
  if (trace_on.load(std::memory_order_relaxed)) {
    record_on(kBetweenStepsTid, name, "trace", start_ns, end_ns, args, n_args);
  }
}

const char* intern(const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.names.size() >= kMaxNames && r.names.count(name) == 0) return "(more than 100,000 distinct span names)";
  return r.names.insert(name).first->c_str();
}

namespace {

struct Part {
  int attempt = 0;
  int ordinal = 0;
  std::string path;
};

// Job `job_id`'s parts next to `file`: "<base>.<job>.<attempt>.<ordinal>.part", ordered by
// attempt and ordinal.
std::vector<Part> find_parts(const std::string& file, const std::string& job_id) {
  const size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : file.substr(0, slash);
  const std::string base =
      (slash == std::string::npos ? file : file.substr(slash + 1)) + "." + job_id + ".";
  std::vector<Part> parts;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return parts;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!name.starts_with(base) || !name.ends_with(".part")) continue;
    const std::string middle = name.substr(base.size(), name.size() - base.size() - 5);
    int attempt = -1, ordinal = -1, used = 0;
    if (std::sscanf(middle.c_str(), "%d.%d%n", &attempt, &ordinal, &used) != 2 ||
        used != static_cast<int>(middle.size()) || attempt < 0 || ordinal < 0 ||
        attempt >= 1000 || ordinal >= kAttemptStride) {
      continue;
    }
    parts.push_back({attempt, ordinal, dir + "/" + name});
  }
  ::closedir(d);
  std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) {
    return std::tie(a.attempt, a.ordinal) < std::tie(b.attempt, b.ordinal);
  });
  return parts;
}

}  // namespace

std::string tagged_path(const std::string& file, const std::string& tag) {
  const std::filesystem::path path(file);
  return (path.parent_path() /
          fmt::format("{}.{}{}", path.stem().string(), tag, path.extension().string()))
      .string();
}

size_t count_parts(const std::string& file, const std::string& job_id) {
  return find_parts(file, job_id).size();
}

namespace {

// A part to read: a regular file of this user, opened without following a symlink or
// blocking on a FIFO; -1 for anything else (planted by someone else in a shared directory).
int open_part(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Calls `line` for each whole line of the file (without its newline) of at most kMaxLine
// bytes; longer ones, and an unterminated last one, are skipped.
constexpr size_t kMaxLine = 1 << 20;
void for_each_line(int fd, const std::function<void(std::string_view)>& line) {
  std::string pending;
  bool skipping = false;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    std::string_view chunk(buffer, static_cast<size_t>(n));
    while (!chunk.empty()) {
      const size_t nl = chunk.find('\n');
      const std::string_view piece = chunk.substr(0, nl);
      if (!skipping) pending.append(piece);
      if (pending.size() > kMaxLine) {
        pending.clear();
        skipping = true;
      }
      if (nl == std::string_view::npos) break;
      if (!skipping) line(pending);
      pending.clear();
      skipping = false;
      chunk.remove_prefix(nl + 1);
    }
  }
}

}  // namespace

std::string why_not_replaceable(const std::string& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? "" : errno_message("exists and cannot be read to tell it is a trace", errno);
  }
  char head[4096];
  ssize_t got;
  do {
    got = ::read(fd, head, sizeof head);
  } while (got < 0 && errno == EINTR);
  const int read_errno = errno;
  ::close(fd);
  if (got < 0) return errno_message("exists and cannot be read to tell it is a trace", read_errno);
  const std::string_view text(head, static_cast<size_t>(got));
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos && got < static_cast<ssize_t>(sizeof head)) return "";  // blanks only
  if (first != std::string_view::npos && text[first] == '{' && (text.find("\"traceEvents\"") != std::string_view::npos ||
                             text.find("\"displayTimeUnit\"") != std::string_view::npos)) {
    return "";
  }
  return fmt::format("exists and is not a trace (it begins {:?})", text.substr(0, std::min<size_t>(8, text.size())));
}

void check_file(const std::string& given, const char* source) {
  const std::filesystem::path file = std::filesystem::absolute(given);
  XS_CHECK_ARG(!given.empty() && !given.ends_with("/") && file.filename() != "." &&
                   file.filename() != "..",
               "{} '{}': expected a file name", source, given);
  XS_CHECK_ARG(file.filename().string().size() <= kMaxFileNameBytes,
               "{} {}: the file name is {} bytes, at most {} (its parts add a suffix)", source, given,
               file.filename().string().size(), kMaxFileNameBytes);
  const std::filesystem::path dir = file.parent_path();
  std::error_code ec;
  XS_CHECK_ARG(std::filesystem::is_directory(dir, ec), "{} {}: directory {} does not exist", source,
               given, dir.string());
  XS_CHECK_ARG(!in_dev_or_proc(file.string()),
               "{} {}: directory {} holds devices or processes, not files", source, given,
               dir.string());
  XS_CHECK_ARG(::access(dir.c_str(), W_OK | X_OK) == 0, "{} {}: directory {} is not writable",
               source, given, dir.string());
  struct stat st {};
  XS_CHECK_ARG(::lstat(file.c_str(), &st) != 0 || S_ISREG(st.st_mode),
               "{} {}: exists and is not a regular file (a directory, device or link is never "
               "replaced)",
               source, given);
  const std::string link = foreign_symlink(dir.string());
  XS_CHECK_ARG(link.empty(),
               "{} {}: directory {} is reached through {}, whose owner could point it anywhere; "
               "give its real path if you trust them",
               source, given, dir.string(), link);
  const std::string why = why_not_replaceable(file.string());
  XS_CHECK_ARG(why.empty(), "{} {}: {}; the trace would replace it", source, given, why);
}

std::optional<FileStamp> stamp(const std::string& file) {
  struct stat st {};
  if (::lstat(file.c_str(), &st) != 0) return std::nullopt;
  return FileStamp{st.st_dev, st.st_ino,
                   static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                   st.st_size};
}

size_t merge(const std::string& file, const std::string& job_id, int node, bool remove_parts,
             const std::string& output_or_empty) {
  const std::string& output = output_or_empty.empty() ? file : output_or_empty;
  struct stat existing {};
  if (::lstat(output.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) {
    throw IoError(fmt::format("tracing: {} exists and is not a regular file", output));
  }
  if (const std::string why = why_not_replaceable(output); !why.empty()) {
    throw IoError(fmt::format("tracing: {} {}; the merge would replace it", output, why));
  }
  const std::vector<Part> parts = find_parts(file, job_id);
  const bool several_attempts = !parts.empty() && parts.back().attempt > 0;
  const std::string temp = fmt::format("{}.merging.{}", output, ::getpid());
  ::unlink(temp.c_str());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw IoError(errno_message("tracing: creating " + temp, errno));
  size_t spans = 0;
  bool written = true;
  fmt::memory_buffer out;
  out.append(std::string_view("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"));
  bool first = true;
  const auto add = [&](std::string_view line) {
    if (!first) out.append(std::string_view(",\n"));
    first = false;
    out.append(line);
    if (out.size() > (1 << 20)) {
      written = written && write_all(fd, {out.data(), out.size()});
      out.clear();
    }
  };
  for (const Part& p : parts) {
    const int pid = p.attempt * kAttemptStride + p.ordinal;
    std::string track = node >= 0 ? fmt::format("node {}, ordinal {}", node, p.ordinal)
                                  : fmt::format("ordinal {}", p.ordinal);
    if (several_attempts) track += fmt::format(" (attempt {})", p.attempt);
    add(fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"{}\"}}}}",
                    pid, track));
    add(fmt::format("{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"sort_index\":{}}}}}",
                    pid, pid));
    const int part = open_part(p.path);
    if (part < 0) continue;
    const std::string own_track = fmt::format("\"pid\":{},", pid);
    for_each_line(part, [&](std::string_view line) {
      // Only whole lines of this part's own track.
      if (!line.starts_with("{\"name\":\"") || !line.ends_with("}") ||
          line.find(own_track) == std::string_view::npos) {
        return;
      }
      add(line);
      if (line.find("\"ph\":\"X\"") != std::string_view::npos) ++spans;
    });
    ::close(part);
  }
  out.append(std::string_view("\n]}\n"));
  written = written && write_all(fd, {out.data(), out.size()});
  written = written && (::fsync(fd) == 0 || errno == EINVAL);
  const int write_errno = errno;
  ::close(fd);
  if (!written || ::rename(temp.c_str(), output.c_str()) != 0) {
    const int err = written ? errno : write_errno;
    ::unlink(temp.c_str());
    throw IoError(errno_message("tracing: writing " + output, err));
  }
  if (remove_parts) {
    for (const Part& p : parts) ::unlink(p.path.c_str());
  }
  return spans;
}

}  // namespace trace

TraceScope::TraceScope(const std::string& name, const char* category) {
  if (trace_on.load(std::memory_order_relaxed)) begin(trace::intern(name), category);
}

void TraceScope::begin(const char* name, const char* category) noexcept {
  name_ = name;
  category_ = category;
  start_ns_ = trace::now_ns();
}

void TraceScope::end() noexcept {
  trace::record(name_, category_, start_ns_, trace::now_ns(), args_, n_args_);
}

}  // namespace xs
