#include "tests/collectives/fork_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "tests/support/deadline_scale.h"

namespace xs::testing {
namespace {

// Child messages are truncated so a child never blocks writing into a full pipe.
constexpr size_t kMaxMessageBytes = 8 << 10;

[[noreturn]] void child_main(const std::function<std::string(Child&)>& fn, Child& child,
                             int pipe_fd) {
  int code = 0;
  std::string message;
  try {
    message = fn(child);
    code = message.empty() ? 0 : 1;
  } catch (const std::exception& e) {
    message = e.what();
    code = 2;
  } catch (...) {
    message = "non-std exception";
    code = 3;
  }
  if (message.size() > kMaxMessageBytes) message.resize(kMaxMessageBytes);
  const char* p = message.data();
  size_t left = message.size();
  while (left > 0) {
    const ssize_t n = ::write(pipe_fd, p, left);
    if (n <= 0) break;
    p += n;
    left -= static_cast<size_t>(n);
  }
  ::_exit(code);
}

std::string drain(int fd) {
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace

std::string unique_job_id() {
  static std::atomic<int> counter{0};
  return fmt::format("t{}-{}", ::getpid(), counter.fetch_add(1));
}

int64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

bool JobResult::all_ok() const {
  if (timed_out) return false;
  for (const auto& c : children) {
    if (!c.ok()) return false;
  }
  return true;
}

std::string JobResult::describe() const {
  std::string text =
      fmt::format("job {} after {:.2f} s:", timed_out ? "TIMED OUT" : "done", elapsed_s);
  for (const auto& c : children) {
    text += fmt::format("\n  ordinal {} (pid {}): exit {} signal {}: {}", c.ordinal, c.pid,
                        c.exit_code, c.signal, c.message);
  }
  return text;
}

ForkJob::ForkJob(int world_size, size_t staging_bytes, size_t arena_bytes)
    : world_size_(world_size), job_id_(unique_job_id()) {
  if (staging_bytes != 0) segment_.emplace(job_id_, world_size, staging_bytes, arena_bytes);
  void* scratch =
      ::mmap(nullptr, kScratchBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (scratch == MAP_FAILED) throw std::runtime_error("ForkJob: mmap scratch failed");
  scratch_ = static_cast<std::byte*>(scratch);
}

ForkJob::~ForkJob() {
  for (size_t i = 0; i < pids_.size(); ++i) {
    if (!reaped_[i]) {
      ::kill(pids_[i], SIGKILL);
      ::waitpid(pids_[i], nullptr, 0);
    }
  }
  for (int fd : pipes_) {
    if (fd >= 0) ::close(fd);
  }
  ::munmap(scratch_, kScratchBytes);
}

const std::string& ForkJob::segment_name() const {
  static const std::string kNone;
  return segment_ ? segment_->name() : kNone;
}

void ForkJob::start(const std::function<std::string(Child&)>& fn) {
  for (int ordinal = 0; ordinal < world_size_; ++ordinal) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("ForkJob: pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error(fmt::format("ForkJob: fork failed: {}", errno));
    if (pid == 0) {
      ::close(fds[0]);
      Child child{ordinal, world_size_, segment_name(), job_id_, scratch_};
      child_main(fn, child, fds[1]);
    }
    ::close(fds[1]);
    pids_.push_back(pid);
    reaped_.push_back(false);
    pipes_.push_back(fds[0]);
  }
}

JobResult ForkJob::wait(std::chrono::milliseconds deadline) {
  deadline = scaled(deadline);  // longer under sanitizers (scripts/sanitize)
  JobResult result;
  const auto start = std::chrono::steady_clock::now();
  result.children.resize(pids_.size());
  size_t running = pids_.size();
  for (size_t i = 0; i < pids_.size(); ++i) {
    result.children[i].ordinal = static_cast<int>(i);
    result.children[i].pid = pids_[i];
  }
  while (running > 0) {
    // Reap only our own children: another ForkJob of this process may be running too.
    for (size_t i = 0; i < pids_.size(); ++i) {
      int status = 0;
      if (reaped_[i] || ::waitpid(pids_[i], &status, WNOHANG) != pids_[i]) continue;
      auto& child = result.children[i];
      if (WIFEXITED(status)) child.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) child.signal = WTERMSIG(status);
      child.message = drain(pipes_[i]);
      reaped_[i] = true;
      --running;
    }
    if (running == 0) break;
    if (!result.timed_out && std::chrono::steady_clock::now() - start > deadline) {
      result.timed_out = true;  // kill the rest, then keep reaping them
      for (size_t i = 0; i < pids_.size(); ++i) {
        if (!reaped_[i]) ::kill(pids_[i], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // poll slice, not a settle
  }
  result.elapsed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace xs::testing
