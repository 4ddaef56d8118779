#include "xla_spawn/shm/stack_dump.h"

#include <cxxabi.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
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

// In the throwaway grandchild: unwinds, demangles (allocation is fine here: this copy of the
// process is discarded) and writes the header and one line per frame.
[[noreturn, gnu::noinline]] void dump_and_exit(pid_t replica) {
  ::alarm(5);  // a lock copied held (by another thread, or the interrupted one) blocks nothing
  void* frames[64];
  const int count = ::backtrace(frames, 64);
  constexpr int kSkipped = 3;  // this function, the handler and the kernel's signal trampoline
  const int shown = count > kSkipped ? count - kSkipped : 0;
  std::string text = std::string(kStackHeaderPrefix) + std::to_string(replica) + ", " +
                     std::to_string(shown) + " frames:\n";
  char** symbols = ::backtrace_symbols(frames, count);
  for (int i = kSkipped; i < count; ++i) {
    text += symbols != nullptr ? describe_frame(symbols[i]) : std::string(kFrameLinePrefix) + "??";
    text += '\n';
  }
  write_text(text.data(), text.size());
  ::_exit(0);
}

// Async-signal-safe in the replica: two raw clones, waitpid, getpid.
extern "C" void on_stack_dump(int) {
  const int saved_errno = errno;
  const pid_t replica = ::getpid();
  const long child = ::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (child == 0) {
    // The child exits at once, so the replica waits only for it; the grandchild, adopted by
    // xla-spawn (the job's subreaper), does the work and is reaped there.
    if (::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0) == 0) dump_and_exit(replica);
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
  if (current.sa_handler == on_stack_dump) return true;
  if (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO) != 0) return false;
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
  action.sa_handler = on_stack_dump;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_ONSTACK;
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
