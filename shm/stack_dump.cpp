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

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "xla_spawn/shm/detail/call_instruction.h"

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
// ... and for at most this long from the request: under load each retry (two clones of a
// large process, a sleep, a signal) takes far longer than 5 ms, and 40 of them could outlast
// the launcher's wait for the stack (launcher/detail/attempt.h, kStackWait: 3 s).
constexpr int64_t kMaxRetryNs = 1'000'000'000;
// Dump requests this far apart start a new count of retries.
constexpr int64_t kNewRequestNs = 1'000'000'000;
// The signal's value (request_stack_dump's `at_once`) that asks for no retries.
constexpr int kDumpAtOnce = 1;
// Bytes of the interrupted stack scanned at most (512 KiB), its outermost part when deeper.
constexpr uintptr_t kMaxScannedBytes = uintptr_t{512} << 10;
// Words at a stack pointer outside the thread's stack searched for the pointer into it that
// generated code kept (oneDNN's sgemm keeps its caller's at [rsp + small offset]).
constexpr size_t kForeignStackProbeWords = 64;
// Scanned frames kept from the innermost end when there are more than fit: the rest are kept
// from the outermost end, whose words (main's frame and its callers') are never stale.
constexpr int kInnermostScanned = 8;

// A line of /proc/self/maps (this copy's address space is the replica's).
struct Mapping {
  uintptr_t lo = 0;
  uintptr_t hi = 0;
  bool readable = false;
  bool executable = false;
  bool loaded_object = false;  // a file's code (executable, library) or the vDSO
  bool main_stack = false;     // [stack]: the main thread's
};

std::vector<Mapping> read_mappings() {
  std::vector<Mapping> mappings;
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return mappings;
  std::string maps;
  char buffer[8192];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;)
    maps.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  for (size_t at = 0; at < maps.size();) {
    const size_t eol = maps.find('\n', at);
    const std::string line =
        maps.substr(at, eol == std::string::npos ? std::string::npos : eol - at);
    at = eol == std::string::npos ? maps.size() : eol + 1;
    // lo-hi perms offset dev inode [path]
    char* rest = nullptr;
    Mapping m;
    m.lo = std::strtoull(line.c_str(), &rest, 16);
    if (rest == nullptr || *rest != '-') continue;
    m.hi = std::strtoull(rest + 1, &rest, 16);
    if (rest == nullptr || std::strlen(rest) < 5) continue;
    m.readable = rest[1] == 'r';
    m.executable = rest[3] == 'x';
    const size_t path = line.find_first_of("/[", static_cast<size_t>(rest - line.c_str()));
    const std::string_view name =
        path == std::string::npos ? std::string_view() : std::string_view(line).substr(path);
    m.loaded_object = name.starts_with("/") || name == "[vdso]";
    m.main_stack = name == "[stack]";
    mappings.push_back(m);
  }
  return mappings;
}

// The mapping holding `address`; nullptr when none (the kernel lists them in address order).
const Mapping* mapping_of(const std::vector<Mapping>& mappings, uintptr_t address) {
  auto it = std::upper_bound(mappings.begin(), mappings.end(), address,
                             [](uintptr_t a, const Mapping& m) { return a < m.lo; });
  if (it == mappings.begin()) return nullptr;
  --it;
  return address < it->hi ? &*it : nullptr;
}

// Whether `address` lies in the code of a loaded object (executable, library, vDSO; named by
// symbol or not, as static and hidden functions are not) and follows a call instruction
// there, of any form: what a return address on the stack looks like. A direct call must also
// lead to code, which rejects most stale words whose bytes merely happen to end with E8.
bool looks_like_return_address(const std::vector<Mapping>& mappings, uintptr_t address) {
  const Mapping* m = mapping_of(mappings, address);
  if (m == nullptr || !m->loaded_object || !m->executable || !m->readable ||
      address - m->lo < detail::kCallWindowBytes) {
    return false;
  }
  std::array<unsigned char, detail::kCallWindowBytes> window;
  std::memcpy(window.data(), reinterpret_cast<const void*>(address - window.size()), window.size());
  switch (detail::call_ending_at(window)) {
    case detail::CallForm::kNone:
      return false;
    case detail::CallForm::kIndirect:
      return true;
    case detail::CallForm::kDirect: {
      const uintptr_t target =
          address +
          static_cast<uintptr_t>(static_cast<intptr_t>(detail::direct_call_displacement(window)));
      const Mapping* callee = mapping_of(mappings, target);
      return callee != nullptr && callee->executable;
    }
  }
  return false;
}

// The general registers of the interrupted thread but its stack and instruction pointers.
using InterruptedRegisters = std::array<uintptr_t, 15>;

// The words of the interrupted thread's stack that its live frames hold: [begin, end).
// Generated code may run with its stack pointer elsewhere: oneDNN's sgemm kernel moves it to a
// heap workspace for long rows (and to a page boundary below its caller's frame otherwise),
// so a scan from it alone found nothing above and the hang report lost the way to main. The
// thread's own stack is then entered at the lowest pointer into it that the kernel kept (in a
// register, or in the first words at its stack pointer), else at its lowest page.
struct ScanRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
};

ScanRange live_stack(const std::vector<Mapping>& mappings, bool main_thread, uintptr_t sp,
                     const InterruptedRegisters& registers) {
  const Mapping* at_sp = mapping_of(mappings, sp);
  const Mapping* stack = at_sp;
  if (main_thread) {
    stack = nullptr;
    for (const Mapping& m : mappings) {
      if (m.main_stack) stack = &m;
    }
  }
  if (stack == nullptr || !stack->readable) return {};
  ScanRange range{sp, stack->hi};
  if (sp < stack->lo || sp >= stack->hi) {
    range.begin = stack->lo;
    uintptr_t lowest = stack->hi;
    const auto consider = [&](uintptr_t v) {
      if (v >= stack->lo && v < stack->hi && v < lowest) lowest = v;
    };
    for (const uintptr_t r : registers) consider(r);
    if (at_sp != nullptr && at_sp->readable && sp % sizeof(uintptr_t) == 0) {
      const auto* word = reinterpret_cast<const uintptr_t*>(sp);
      for (size_t k = 0;
           k < kForeignStackProbeWords && sp + (k + 1) * sizeof(uintptr_t) <= at_sp->hi; ++k) {
        consider(word[k]);
      }
    }
    if (lowest < stack->hi) range.begin = lowest;
  }
  range.begin &= ~uintptr_t{7};
  if (range.end - range.begin > kMaxScannedBytes) range.begin = range.end - kMaxScannedBytes;
  return range;
}

// Scanned frames kept from the innermost end when `room` frames are left for them.
size_t innermost_kept(size_t room) {
  return std::min<size_t>(kInnermostScanned, room / 2);
}

// Return addresses found in `range`, innermost first; when more than `room`, the
// innermost_kept(room) and the outermost rest, `skipped` saying how many were left out between.
std::vector<void*> scan_for_return_addresses(const std::vector<Mapping>& mappings, ScanRange range,
                                             size_t room, size_t& skipped) {
  std::vector<void*> found;
  for (uintptr_t at = range.begin; at + sizeof(uintptr_t) <= range.end; at += sizeof(uintptr_t)) {
    const uintptr_t value = *reinterpret_cast<const uintptr_t*>(at);
    if (looks_like_return_address(mappings, value)) found.push_back(reinterpret_cast<void*>(value));
  }
  skipped = 0;
  if (found.size() > room) {
    const size_t inner = innermost_kept(room);
    skipped = found.size() - room;
    found.erase(found.begin() + static_cast<std::ptrdiff_t>(inner),
                found.begin() + static_cast<std::ptrdiff_t>(inner + skipped));
  }
  return found;
}

// In the throwaway grandchild: unwinds, demangles (allocation is fine here: this copy of the
// process is discarded) and writes the header and one line per frame. When the unwinder stops
// at code no module holds (generated code without unwind tables: oneDNN's GEMM kernels, the
// runtime's JIT loops), the rest of the thread's stack is scanned for return addresses into
// loaded modules (live_stack() says where); those frames are marked "[scanned]" (a stale value
// can pass for one).
[[noreturn, gnu::noinline]] void dump_and_exit(pid_t replica, bool main_thread,
                                               uintptr_t interrupted_sp,
                                               const InterruptedRegisters& registers) {
  ::alarm(5);  // a lock copied held (by another thread, or the interrupted one) blocks nothing
  std::vector<void*> frames(kMaxFrames);
  const int unwound = ::backtrace(frames.data(), kMaxFrames);
  frames.resize(static_cast<size_t>(std::max(unwound, 0)));
  constexpr int kSkipped = 3;  // this function, the handler and the kernel's signal trampoline
  size_t skipped = 0;
  Dl_info last{};
  if (unwound > kSkipped && unwound < kMaxFrames && interrupted_sp != 0 &&
      (::dladdr(frames.back(), &last) == 0 || last.dli_fname == nullptr)) {
    const std::vector<Mapping> mappings = read_mappings();
    const std::vector<void*> scanned = scan_for_return_addresses(
        mappings, live_stack(mappings, main_thread, interrupted_sp, registers),
        static_cast<size_t>(kMaxFrames - unwound), skipped);
    frames.insert(frames.end(), scanned.begin(), scanned.end());
  }
  const int count = static_cast<int>(frames.size());
  const int shown = count > kSkipped ? count - kSkipped : 0;
  std::string text = std::string(kStackHeaderPrefix) + std::to_string(replica) + ", " +
                     std::to_string(shown) + " frames:\n";
  char** symbols = ::backtrace_symbols(frames.data(), count);
  for (int i = kSkipped; i < count; ++i) {
    text += symbols != nullptr ? describe_frame(symbols[i]) : std::string(kFrameLinePrefix) + "??";
    if (i >= unwound) text += " [scanned]";
    if (skipped > 0 && i == unwound + static_cast<int>(innermost_kept(kMaxFrames - unwound))) {
      text += " (" + std::to_string(skipped) + " scanned frames before this one left out)";
    }
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
std::atomic<int64_t> g_request_ns{0};  // when the current request's first signal came

int64_t monotonic_ns() {
  timespec now {};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

// In the throwaway grandchild. A thread interrupted in generated code (oneDNN's GEMM kernels,
// the runtime's JIT loops, which have no unwind tables) is signalled again a little later, by
// when it has most likely returned to code the unwinder knows; only a thread still there after
// every retry gets the scanned stack.
// Inlined into the handler, whose frame kSkipped counts; allocates nothing before alarm(5) is
// set (the replica may have been interrupted holding malloc's lock).
[[noreturn, gnu::always_inline]] inline void dump_or_retry(pid_t replica, pid_t thread, int attempt,
                                                           int64_t since_request_ns,
                                                           const void* context) {
  InterruptedRegisters registers{};
#if defined(__x86_64__)
  const uintptr_t pc = interrupted_register(context, REG_RIP);
  const uintptr_t sp = interrupted_register(context, REG_RSP);
  size_t k = 0;
  for (const int reg : {REG_RAX, REG_RBX, REG_RCX, REG_RDX, REG_RSI, REG_RDI, REG_RBP, REG_R8,
                        REG_R9, REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15}) {
    registers[k++] = interrupted_register(context, reg);
  }
#else
  const uintptr_t pc = 0;
  const uintptr_t sp = 0;
#endif
  if (pc != 0 && attempt < kMaxRetries && since_request_ns < kMaxRetryNs && !in_module(pc)) {
    const timespec delay{0, kRetryDelayNs};
    ::nanosleep(&delay, nullptr);
    ::syscall(SYS_tgkill, replica, thread, stack_dump_signal());
    ::_exit(0);
  }
  dump_and_exit(replica, /*main_thread=*/thread == replica, sp, registers);
}

// Async-signal-safe in the replica: two raw clones, waitpid, getpid, gettid, clock_gettime.
extern "C" void on_stack_dump(int, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const int64_t now = monotonic_ns();
  if (now - g_last_attempt_ns.load(std::memory_order_relaxed) > kNewRequestNs) {
    g_attempts.store(0, std::memory_order_relaxed);
    g_request_ns.store(now, std::memory_order_relaxed);
  }
  g_last_attempt_ns.store(now, std::memory_order_relaxed);
  const bool at_once = info != nullptr && info->si_code == SI_QUEUE &&
                       info->si_value.sival_int == kDumpAtOnce;
  const int attempt =
      at_once ? kMaxRetries : g_attempts.fetch_add(1, std::memory_order_relaxed);
  const pid_t replica = ::getpid();
  const auto thread = static_cast<pid_t>(::syscall(SYS_gettid));
  const long child = ::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0);
  if (child == 0) {
    // The child exits at once, so the replica waits only for it; the grandchild, adopted by
    // xla-spawn (the job's subreaper), does the work and is reaped there.
    if (::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, 0) == 0) {
      dump_or_retry(replica, thread, attempt, now - g_request_ns.load(std::memory_order_relaxed),
                    context);
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

bool request_stack_dump(pid_t pid, bool at_once) {
  if (!at_once) return ::syscall(SYS_tgkill, pid, pid, stack_dump_signal()) == 0;
  siginfo_t info{};
  info.si_signo = stack_dump_signal();
  info.si_code = SI_QUEUE;
  info.si_pid = ::getpid();
  info.si_uid = ::getuid();
  info.si_value.sival_int = kDumpAtOnce;
  return ::syscall(SYS_rt_tgsigqueueinfo, pid, pid, stack_dump_signal(), &info) == 0;
}

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
