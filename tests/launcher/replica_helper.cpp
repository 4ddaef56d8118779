// A replica for the launcher tests, started by xla-spawn. Behaviour is chosen by arguments,
// per ordinal when needed:
//
//   replica_helper [--pid-dir DIR] [--wait-peers] --do ACTION [--then ACTION] [--for K=ACTION ...]
//
// --pid-dir DIR   write DIR/pid.<ordinal> (atomically) at start, and DIR/fail.<ordinal>
//                 (CLOCK_MONOTONIC ns) just before a failing action
// --wait-peers    after writing the pid file, wait (at most 20 s) for all peers' pid files
// ACTION          print-env | exit:C | signal:S | sleep:SECONDS | ignore-term:SECONDS |
//                 ignore-all:SECONDS | catch:SECONDS | lines:COUNT:PAD | fail-attempts:N:C |
//                 affinity | partial | exit-on-term:SECONDS (SIGTERM exits with code 1, as a
//                 replica whose collective failed does) | slow-death:MIB:SECONDS (writes
//                 DIR/ready.<ordinal> once set up) | exit-when-gone:K:SECONDS |
//                 trace-span (one span on the timeline, when XLA_SPAWN_TRACE is set)
// Every sleep is bounded by its SECONDS; a helper never outlives that.

#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "xla_spawn/base/trace.h"

namespace {

int g_ordinal = 0;

int env_number(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : fallback;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(sep, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* file = std::fopen(tmp.c_str(), "w");
  if (file == nullptr) std::_Exit(90);
  std::fputs(text.c_str(), file);
  std::fclose(file);
  std::rename(tmp.c_str(), path.c_str());
}

long long monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1'000'000'000LL + ts.tv_nsec;
}

void sleep_bounded(double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

extern "C" void on_term_exit_1(int) { ::_exit(1); }

extern "C" void on_caught(int signo) {
  char line[96];
  const int n =
      std::snprintf(line, sizeof line, "ordinal %d caught SIG%s\n", g_ordinal, sigabbrev_np(signo));
  [[maybe_unused]] ssize_t w = ::write(1, line, static_cast<size_t>(n));
  ::_exit(0);
}

void print_env() {
  for (const char* name :
       {"XLA_SPAWN_ORDINAL", "XLA_SPAWN_LOCAL_ORDINAL", "XLA_SPAWN_WORLD_SIZE",
        "XLA_SPAWN_LOCAL_WORLD_SIZE", "XLA_SPAWN_JOB_ID", "XLA_SPAWN_ATTEMPT", "XLA_SPAWN_SEGMENT",
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "XLA_SPAWN_NODE", "XLA_SPAWN_NNODES",
        "XLA_SPAWN_NODE_SIZES", "XLA_SPAWN_MASTER_ADDR", "XLA_SPAWN_MASTER_PORT",
        "XLA_SPAWN_HOST_ADDR", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "XLA_SPAWN_TRACE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT"}) {
    const char* value = std::getenv(name);
    std::printf("ENV %s=%s\n", name, value != nullptr ? value : "<unset>");
  }
}

// COUNT lines "L <ordinal> <seq> <pad x's> END", written with raw write(2) calls cut at
// varying points, so the launcher must reassemble lines from arbitrary chunks.
void print_lines(int count, int pad) {
  std::string all;
  for (int seq = 0; seq < count; ++seq) {
    all += "L " + std::to_string(g_ordinal) + " " + std::to_string(seq) + " " +
           std::string(static_cast<size_t>(pad), 'x') + " END\n";
  }
  size_t offset = 0;
  size_t cut = 7 + static_cast<size_t>(g_ordinal) * 13;
  while (offset < all.size()) {
    const size_t n = std::min(cut, all.size() - offset);
    const ssize_t w = ::write(1, all.data() + offset, n);
    if (w <= 0) std::_Exit(91);
    offset += static_cast<size_t>(w);
    cut = cut * 7 % 4093 + 1;  // 1..4093 bytes: sometimes mid-line, sometimes many lines
  }
}

void print_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof set, &set);
  std::string cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    if (!cpus.empty()) cpus.push_back(',');
    cpus.append(std::to_string(cpu));
  }
  std::printf("CPUS %s\n", cpus.c_str());
}

// Whether `pid` has exited, as shm/futex.h's process_alive judges it: absent, or a zombie.
bool gone(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return !in.is_open();
  return text[close + 2] == 'Z' || text[close + 2] == 'X';
}

void mark_failure(const std::string& pid_dir) {
  if (pid_dir.empty()) return;
  write_file_atomically(pid_dir + "/fail." + std::to_string(g_ordinal),
                        std::to_string(monotonic_ns()));
}

int run_action(const std::string& action, const std::string& pid_dir) {
  const std::vector<std::string> a = split(action, ':');
  const auto arg = [&](size_t i) { return i < a.size() ? std::atof(a[i].c_str()) : 30.0; };
  if (a[0] == "print-env") {
    print_env();
  } else if (a[0] == "exit") {
    if (arg(1) != 0) mark_failure(pid_dir);
    std::fflush(nullptr);
    return static_cast<int>(arg(1));
  } else if (a[0] == "signal") {
    mark_failure(pid_dir);
    std::fflush(nullptr);
    const rlimit no_core{0, 0};  // a core dump per test run would be slow and pointless
    setrlimit(RLIMIT_CORE, &no_core);
    std::signal(static_cast<int>(arg(1)), SIG_DFL);
    std::raise(static_cast<int>(arg(1)));
  } else if (a[0] == "sleep") {
    sleep_bounded(arg(1));
  } else if (a[0] == "ignore-term" || a[0] == "ignore-all" || a[0] == "catch" ||
             a[0] == "exit-on-term") {
    sleep_bounded(arg(1));  // dispositions were set before the pid file was written
  } else if (a[0] == "lines") {
    print_lines(static_cast<int>(arg(1)), static_cast<int>(arg(2)));
  } else if (a[0] == "fail-attempts") {
    const bool fail = env_number("XLA_SPAWN_ATTEMPT", 0) < static_cast<int>(arg(1));
    std::printf("attempt %d: %s\n", env_number("XLA_SPAWN_ATTEMPT", 0), fail ? "fail" : "ok");
    const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT");
    const char* job = std::getenv("XLA_SPAWN_JOB_ID");
    std::printf("restart count %s of job %s\n", restarts ? restarts : "<unset>",
                job ? job : "<unset>");
    return fail ? static_cast<int>(arg(2)) : 0;
  } else if (a[0] == "affinity") {
    print_affinity();
  } else if (a[0] == "eat-memory") {  // touches N MiB, a page at a time (the OOM tests)
    const size_t bytes = static_cast<size_t>(arg(1)) << 20;
    auto* block = static_cast<char*>(std::malloc(bytes));
    if (block == nullptr) return 93;
    for (size_t at = 0; at < bytes; at += 4096) block[at] = 1;
    std::printf("touched %zu MiB\n", bytes >> 20);
    std::free(block);
  } else if (a[0] == "slow-death") {
    // Touches MiB of memory shared by 7 more threads, then sleeps: SIGKILLed, the process is a
    // zombie (state Z) once its main thread has gone, reapable only once the thread that
    // drops the memory last has freed it (often not the main one).
    const size_t bytes = static_cast<size_t>(arg(1)) << 20;
    auto* block = static_cast<char*>(std::malloc(bytes));
    if (block == nullptr) return 93;
    for (size_t at = 0; at < bytes; at += 4096) block[at] = 1;
    for (int t = 0; t < 7; ++t) std::thread([&] { sleep_bounded(arg(2)); }).detach();
    if (!pid_dir.empty()) {
      write_file_atomically(pid_dir + "/ready." + std::to_string(g_ordinal), "1");
    }
    sleep_bounded(arg(2));
  } else if (a[0] == "exit-when-gone") {
    // Exits with code 1 as soon as ordinal K's process is gone or a zombie, as a replica
    // whose collective finds a peer gone does (shm/wait.cpp); at most SECONDS.
    const std::string pid_file = pid_dir + "/pid." + std::to_string(static_cast<int>(arg(1)));
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(arg(2) * 1000));
    pid_t peer = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (peer == 0) {
        std::ifstream in(pid_file);
        in >> peer;
      } else if (gone(peer)) {
        std::fprintf(stderr, "ordinal %d is gone\n", static_cast<int>(arg(1)));
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else if (a[0] == "trace-span") {  // one span on the job's timeline (XLA_SPAWN_TRACE)
    xs::trace::start_from_env(g_ordinal, env_number("XLA_SPAWN_ATTEMPT", 0));
    { xs::TraceScope span("helper"); }
    xs::trace::flush();
  } else if (a[0] == "partial") {
    std::printf("no newline at the end");
  } else {
    std::fprintf(stderr, "replica_helper: unknown action '%s'\n", action.c_str());
    return 64;
  }
  return 0;
}

// Before the pid file exists, so a test that signals after seeing it never races the setup.
void set_dispositions(const std::string& action) {
  if (action.rfind("ignore-term", 0) == 0 || action.rfind("ignore-all", 0) == 0) {
    std::signal(SIGTERM, SIG_IGN);
  }
  if (action.rfind("ignore-all", 0) == 0) {
    for (int signo : {SIGINT, SIGHUP, SIGQUIT}) std::signal(signo, SIG_IGN);
  }
  if (action.rfind("catch", 0) == 0) {
    for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) std::signal(signo, on_caught);
  }
  if (action.rfind("exit-on-term", 0) == 0) std::signal(SIGTERM, on_term_exit_1);
}

void wait_for_peers(const std::string& pid_dir, int world_size) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int k = 0; k < world_size; ++k) {
    while (!std::filesystem::exists(pid_dir + "/pid." + std::to_string(k))) {
      if (std::chrono::steady_clock::now() > deadline) std::_Exit(92);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  g_ordinal = env_number("XLA_SPAWN_ORDINAL", 0);
  std::string pid_dir;
  bool wait_peers = false;
  std::string action = "exit:0";
  std::string then;  // a second action, after the first succeeded
  std::map<int, std::string> per_ordinal;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--wait-peers") {
      wait_peers = true;
    } else if (i + 1 < argc && flag == "--pid-dir") {
      pid_dir = argv[++i];
    } else if (i + 1 < argc && flag == "--do") {
      action = argv[++i];
    } else if (i + 1 < argc && flag == "--then") {
      then = argv[++i];
    } else if (i + 1 < argc && flag == "--for") {
      const std::string spec = argv[++i];
      const size_t eq = spec.find('=');
      per_ordinal[std::atoi(spec.substr(0, eq).c_str())] = spec.substr(eq + 1);
    } else {
      std::fprintf(stderr, "replica_helper: bad argument '%s'\n", flag.c_str());
      return 64;
    }
  }
  if (per_ordinal.count(g_ordinal)) action = per_ordinal[g_ordinal];
  set_dispositions(action);
  if (!pid_dir.empty()) {
    write_file_atomically(pid_dir + "/pid." + std::to_string(g_ordinal),
                          std::to_string(::getpid()));
  }
  if (wait_peers) wait_for_peers(pid_dir, env_number("XLA_SPAWN_WORLD_SIZE", 1));
  const int status = run_action(action, pid_dir);
  return status != 0 || then.empty() ? status : run_action(then, pid_dir);
}
