#include "xla_spawn/shm/stack_dump.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <ucontext.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

namespace xs {
namespace {

void write_text(const char* text, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(2, text, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

// Frames shown at most.
constexpr int kMaxFrames = 64;
// A thread interrupted in generated code (no unwind tables) is signalled again this much
// later, up to this many times, so that its stack is taken from code the unwinder knows.
constexpr long kRetryDelayNs = 5'000'000;
constexpr int kMaxRetries = 40;
// Dump requests this far apart start a new count of retries.
constexpr int64_t kNewRequestNs = 1'000'000'000;
// Words of the interrupted stack scanned at most (512 KiB) when the unwinder stops early.
constexpr size_t kMaxScannedWords = size_t{64} << 10;

// Whether `address` is in a loaded module (executable or library) and follows a call
// instruction there: what a return address on the stack looks like (E8 rel32; FF /2 with a
// register, [reg + disp8] or [rip/reg + disp32] operand).
bool looks_like_return_address(uintptr_t address) {
  Dl_info info {};
  if (address < 8 || ::dladdr(reinterpret_cast<void*>(address), &info) == 0 ||
      info.dli_fname == nullptr || info.dli_saddr == nullptr) {
    return false;
  }
  const auto* code = reinterpret_cast<const unsigned char*>(address);
  const auto is_call_modrm = [](unsigned char modrm) { return (modrm & 0x38) == 0x10; };
  return code[-5] == 0xE8 || (code[-2] == 0xFF && is_call_modrm(code[-1]) && code[-1] >= 0xC0) ||
         (code[-3] == 0xFF && is_call_modrm(code[-2]) && (code[-2] & 0xC0) == 0x40) ||
         (code[-6] == 0xFF && is_call_modrm(code[-5]) && (code[-5] & 0xC7) != 0xC0);
}

// The end of the mapping that holds `address` (the interrupted thread's stack), from
// /proc/self/maps: this copy's address space is the replica's. 0 when not found.
uintptr_t mapping_end(uintptr_t address) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::string maps;
  char buffer[8192];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) maps.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  for (size_t at = 0; at < maps.size();) {
    const size_t eol = maps.find('\n', at);
    const std::string line = maps.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    at = eol == std::string::npos ? maps.size() : eol + 1;
    char* rest = nullptr;
    const uintptr_t lo = std::strtoull(line.c_str(), &rest, 16);
    if (rest == nullptr || *rest != '-') continue;
    const uintptr_t hi = std::strtoull(rest + 1, nullptr, 16);
    if (lo <= address && address < hi) return hi;
  }
  return 0;
}

// In the throwaway grandchild: unwinds, demangles (allocation is fine here: this copy of the
// process is discarded) and writes the header and one line per frame. When the unwinder stops
// at code no module holds (generated code without unwind tables: oneDNN's GEMM kernels, the
// runtime's JIT loops), the rest of the interrupted stack, from its saved stack pointer, is
// scanned for return addresses into loaded modules; those frames are marked "[scanned]" (a
// stale value can pass for one).
[[noreturn, gnu::noinline]] void dump_and_exit(pid_t replica, uintptr_t interrupted_sp) {
  ::alarm(5);  // a lock copied held (by another thread, or the interrupted one) blocks nothing
  void* frames[kMaxFrames];
  int count = ::backtrace(frames, kMaxFrames);
  constexpr int kSkipped = 3;  // this function, the handler and the kernel's signal trampoline
  int unwound = count;
  Dl_info last {};
  if (count > kSkipped && count < kMaxFrames && interrupted_sp != 0 &&
      (::dladdr(frames[count - 1], &last) == 0 || last.dli_fname == nullptr)) {
    const uintptr_t end = mapping_end(interrupted_sp);
    const auto* word = reinterpret_cast<const uintptr_t*>(interrupted_sp & ~uintptr_t{7});
    for (size_t k = 0; k < kMaxScannedWords && count < kMaxFrames &&
                       reinterpret_cast<uintptr_t>(word + k + 1) <= end;
         ++k) {
      if (looks_like_return_address(word[k])) frames[count++] = reinterpret_cast<void*>(word[k]);
    }
  }
  const int shown = count > kSkipped ? count - kSkipped : 0;
  std::string text = std::string(kStackHeaderPrefix) + std::to_string(replica) + ", " +
                     std::to_string(shown) + " frames:\n";
  char** symbols = ::backtrace_symbols(frames, count);
  for (int i = kSkipped; i < count; ++i) {
    text += symbols != nullptr ? describe_frame(symbols[i]) : std::string(kFrameLinePrefix) + "??";
    if (i >= unwound) text += " [scanned]";
    text += '\n';
  }
  write_text(text.data(), text.size());
  ::_exit(0);
}

// Where the signal interrupted the thread (0 where not known).
uintptr_t interrupted_register(const void* context, int reg) {
#if defined(__x86_64__)
  if (context != nullptr) {
    return static_cast<uintptr_t>(static_cast<const ucontext_t*>(context)->uc_mcontext.gregs[reg]);
  }
#endif
  (void)context;
  (void)reg;
  return 0;
}

bool in_module(uintptr_t address) {
  Dl_info info {};
  return ::dladdr(reinterpret_cast<void*>(address), &info) != 0 && info.dli_fname != nullptr;
}

// This request's attempts so far, and when the last one came (the replica's memory; the
// handler alone writes them).
std::atomic<int> g_attempts{0};
std::atomic<int64_t> g_last_attempt_ns{0};

int64_t monotonic_ns() {
  timespec now {};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

// In the throwaway grandchild. A thread interrupted in generated code (oneDNN's GEMM kernels,
// the runtime's JIT loops, which have no unwind tables) is signalled again a little later, by
// when it has most likely returned to code the unwinder knows; only a thread still there after
// every retry gets the scanned stack.
[[noreturn]] void dump_or_retry(pid_t replica, pid_t thread, int attempt, const void* context) {
#if defined(__x86_64__)
  const uintptr_t pc = interrupted_register(context, REG_RIP);
  const uintptr_t sp = interrupted_register(context, REG_RSP);
#else
  const uintptr_t pc = 0;
  const uintptr_t sp = 0;
#endif
  if (pc != 0 && attempt < kMaxRetries && !in_module(pc)) {
    const timespec delay{0, kRetryDelayNs};
    ::nanosleep(&delay, nullptr);
    ::syscall(SYS_tgkill, replica, thread, stack_dump_signal());
    ::_exit(0);
  }
  dump_and_exit(replica, sp);
}

// Async-signal-safe in the replica: two raw clones, waitpid, getpid, gettid, clock_gettime.
extern "C" void on_stack_dump(int, siginfo_t*, void* context) {
  const int saved_errno = errno;
  const int64_t now = monotonic_ns();
  if (now - g_last_attempt_ns.load(std::memory_order_relaxed) > kNewRequestNs) {
    g_attempts.store(0, std::memory_order_relaxed);
  }
  g_last_attempt_ns.store(now, std::memory_order_relaxed);
  const int attempt = g_attempts.fetch_add(1, std::memory_order_relaxed);
  const pid_t replica = ::getpid();
  const auto thread = static_cast<pid_t>(::syscall(SYS_gettid));
  const long child = ::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (child == 0) {
    // The child exits at once, so the replica waits only for it; the grandchild, adopted by
    // xla-spawn (the job's subreaper), does the work and is reaped there.
    if (::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0) == 0) {
      dump_or_retry(replica, thread, attempt, context);
    }
    ::_exit(0);
  }
  if (child > 0) {
    while (::waitpid(static_cast<pid_t>(child), nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  errno = saved_errno;
}

}  // namespace

int stack_dump_signal() { return SIGRTMIN + 7; }

bool install_stack_dump() {
  struct sigaction current {};
  if (::sigaction(stack_dump_signal(), nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) != 0) return current.sa_sigaction == on_stack_dump;
  if (current.sa_handler != SIG_DFL) return false;
  // The handler runs on a stack of its own (this thread's alternate stack, unless the program
  // set one): a signal frame pushed onto the interrupted stack corrupted the heap of replicas
  // interrupted inside oneDNN's generated GEMM code, handler or not.
  stack_t current_alt {};
  if (::sigaltstack(nullptr, &current_alt) == 0 && (current_alt.ss_flags & SS_DISABLE) != 0) {
    static constexpr size_t kAltStackBytes = size_t{256} << 10;
    void* memory = ::mmap(nullptr, kAltStackBytes, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return false;
    stack_t alt {};
    alt.ss_sp = memory;
    alt.ss_size = kAltStackBytes;
    if (::sigaltstack(&alt, nullptr) != 0) {
      ::munmap(memory, kAltStackBytes);
      return false;
    }
  }
  struct sigaction action {};
  action.sa_sigaction = on_stack_dump;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  return ::sigaction(stack_dump_signal(), &action, nullptr) == 0;
}

std::optional<int> stack_header_frames(std::string_view line) {
  if (line.substr(0, kStackHeaderPrefix.size()) != kStackHeaderPrefix) return std::nullopt;
  const size_t comma = line.find(", ");
  const size_t end = line.find(" frames:");
  if (comma == std::string_view::npos || end == std::string_view::npos || end < comma + 2) {
    return std::nullopt;
  }
  int frames = 0;
  for (const char c : line.substr(comma + 2, end - comma - 2)) {
    if (c < '0' || c > '9' || frames > 1000) return std::nullopt;
    frames = frames * 10 + (c - '0');
  }
  return frames;
}

std::string describe_frame(std::string_view frame) {
  // module(symbol+offset) [address] | module(+offset) [address] | [address]
  const size_t open = frame.find('(');
  const size_t close = frame.find(')', open == std::string_view::npos ? 0 : open);
  if (open == std::string_view::npos || close == std::string_view::npos) {
    return std::string(kFrameLinePrefix) + "?? " + std::string(frame);
  }
  std::string_view module = frame.substr(0, open);
  if (const size_t slash = module.rfind('/'); slash != std::string_view::npos) {
    module = module.substr(slash + 1);
  }
  const std::string_view inside = frame.substr(open + 1, close - open - 1);
  const size_t plus = inside.rfind('+');
  const std::string symbol(inside.substr(0, plus == std::string_view::npos ? inside.size() : plus));
  const std::string_view offset =
      plus == std::string_view::npos ? std::string_view() : inside.substr(plus);
  std::string name = symbol.empty() ? "??" : symbol;
  if (!symbol.empty()) {
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> demangled(
        abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status), &std::free);
    if (status == 0 && demangled) name = demangled.get();
  }
  return std::string(kFrameLinePrefix) + name + " (" + std::string(module) + std::string(offset) +
         ")";
}

}  // namespace xs
