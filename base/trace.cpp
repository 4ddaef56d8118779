#include "xla_spawn/base/trace.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <unordered_set>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

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

struct Recorder {
  std::mutex mutex;
  std::vector<Span> spans;
  int fd = -1;
  int pid = 0;
  int64_t t0_ns = 0;
  int64_t max_spans = kDefaultMaxSpans;
  int64_t recorded = 0;
  bool truncated = false;
  int next_tid = 1;
  std::set<int> named_tids;  // threads whose name line is written
  std::unordered_set<std::string> names;
  bool exit_hook = false;
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: the exit hook writes through it
  return *r;
}

thread_local int t_tid = -1;

void append_escaped(fmt::memory_buffer& out, const char* text) {
  for (const char* p = text; *p != '\0'; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
}

// One line per span: a complete Chrome trace event ("X": begin and duration, microseconds).
void format_span(fmt::memory_buffer& out, const Recorder& r, const Span& s) {
  out.append(std::string_view("{\"name\":\""));
  append_escaped(out, s.name);
  out.append(std::string_view("\",\"cat\":\""));
  append_escaped(out, s.category);
  fmt::format_to(std::back_inserter(out), "\",\"ph\":\"X\",\"ts\":{:.3f},\"dur\":{:.3f},\"pid\":{},\"tid\":{}",
                 static_cast<double>(s.start_ns - r.t0_ns) / 1e3,
                 static_cast<double>(s.end_ns - s.start_ns) / 1e3, r.pid, s.tid);
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

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk loses spans, never the job
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Writes the buffered spans (and the names of threads not seen before); caller holds the mutex.
void flush_locked(Recorder& r) {
  if (r.fd < 0) {
    r.spans.clear();
    return;
  }
  fmt::memory_buffer out;
  for (const Span& s : r.spans) {
    if (r.named_tids.insert(s.tid).second) {
      fmt::format_to(std::back_inserter(out),
                     "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":\"{}\"}}}}\n",
                     r.pid, s.tid, s.tid == 0 ? std::string("main") : fmt::format("thread {}", s.tid));
    }
    format_span(out, r, s);
  }
  r.spans.clear();
  write_all(r.fd, out.data(), out.size());
}

void flush_at_exit() { flush(); }

}  // namespace

std::string part_path(const std::string& file, int attempt, int ordinal) {
  return fmt::format("{}.{}.{}.part", file, attempt, ordinal);
}

int64_t now_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

void start(const std::string& file, int ordinal, int attempt, int64_t t0_ns) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.fd >= 0) ::close(r.fd);
  const std::string path = part_path(file, attempt, ordinal);
  ::unlink(path.c_str());  // a part of an earlier job; O_EXCL below refuses anything planted since
  r.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (r.fd < 0) throw IoError(errno_message("tracing: creating " + path, errno));
  r.pid = attempt * kAttemptStride + ordinal;
  r.t0_ns = t0_ns;
  r.max_spans = env_int("XLA_SPAWN_TRACE_MAX_SPANS", 1, int64_t{1} << 40).value_or(kDefaultMaxSpans);
  r.recorded = 0;
  r.truncated = false;
  r.spans.clear();
  r.named_tids.clear();
  r.next_tid = 1;
  t_tid = 0;  // the starting thread is the replica's main thread
  if (!r.exit_hook) {
    std::atexit(flush_at_exit);
    r.exit_hook = true;
  }
  trace_on.store(true, std::memory_order_relaxed);
}

void start_from_env(int ordinal, int attempt) {
  const std::optional<std::string> file = env_string(kFileEnv);
  if (!file) return;
  const int64_t t0 = env_int(kT0Env, 0, INT64_MAX).value_or(now_ns());
  start(*file, ordinal, attempt, t0);
}

void flush() noexcept {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  try {
    flush_locked(r);
  } catch (const std::exception&) {  // allocation: the spans are dropped, not the job
    r.spans.clear();
  }
}

void stop() noexcept {
  trace_on.store(false, std::memory_order_relaxed);
  flush();
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.fd >= 0) ::close(r.fd);
  r.fd = -1;
}

void record(const char* name, const char* category, int64_t start_ns, int64_t end_ns,
            const Arg* args, int n_args) noexcept {
  if (!trace_on.load(std::memory_order_relaxed)) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.recorded >= r.max_spans) {
    if (!r.truncated) {  // one last span says where and why the trace ends
      r.truncated = true;
      Span s{"trace truncated (XLA_SPAWN_TRACE_MAX_SPANS)", "trace", start_ns, start_ns, 0, 0, {}};
      try {
        r.spans.push_back(s);
      } catch (const std::exception&) {
      }
    }
    return;
  }
  if (t_tid < 0) t_tid = r.next_tid++;
  Span s{name, category, start_ns, end_ns, t_tid, std::min(n_args, kMaxArgs), {}};
  std::copy(args, args + s.n_args, s.args);
  try {
    r.spans.push_back(s);
  } catch (const std::exception&) {
    return;
  }
  ++r.recorded;
  if (r.spans.size() >= kFlushSpans) {
    try {
      flush_locked(r);
    } catch (const std::exception&) {
      r.spans.clear();
    }
  }
}

const char* intern(const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.names.insert(name).first->c_str();
}

namespace {

struct Part {
  int attempt = 0;
  int ordinal = 0;
  std::string path;
};

// The parts next to `file`: "<base>.<attempt>.<ordinal>.part", ordered by attempt and ordinal.
std::vector<Part> find_parts(const std::string& file) {
  const size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : file.substr(0, slash);
  const std::string base = (slash == std::string::npos ? file : file.substr(slash + 1)) + ".";
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

size_t merge(const std::string& file, int node, bool remove_parts) {
  const std::vector<Part> parts = find_parts(file);
  const bool several_attempts = !parts.empty() && parts.back().attempt > 0;
  const std::string temp = fmt::format("{}.merging.{}", file, ::getpid());
  ::unlink(temp.c_str());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError(errno_message("tracing: creating " + temp, errno));
  size_t spans = 0;
  fmt::memory_buffer out;
  out.append(std::string_view("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"));
  bool first = true;
  const auto add = [&](std::string_view line) {
    if (!first) out.append(std::string_view(",\n"));
    first = false;
    out.append(line);
    if (out.size() > (1 << 20)) {
      write_all(fd, out.data(), out.size());
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
    std::ifstream in(p.path);
    for (std::string line; std::getline(in, line);) {
      // Only whole lines of this part's own track: a replica killed mid-write leaves a torn
      // last line, and nothing else belongs in the merged file.
      if (in.eof() || !line.starts_with("{\"name\":\"") || !line.ends_with("}") ||
          line.find(fmt::format("\"pid\":{},", pid)) == std::string::npos) {
        continue;
      }
      add(line);
      if (line.find("\"ph\":\"X\"") != std::string::npos) ++spans;
    }
  }
  out.append(std::string_view("\n]}\n"));
  write_all(fd, out.data(), out.size());
  const bool written = ::fsync(fd) == 0 || errno == EINVAL;
  ::close(fd);
  if (!written || ::rename(temp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw IoError(errno_message("tracing: writing " + file, err));
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
