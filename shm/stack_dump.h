#pragma once
// A replica's stack on request, for the launcher's hang report: Segment::attach installs a
// handler for stack_dump_signal() (when the program left it at its default). The handler does
// not unwind in the replica: unwinding may allocate (libgcc sorts the unwind tables of code
// registered at run time, as the runtime's JIT code is, on first use), and a replica
// interrupted inside malloc would be corrupted. It clones the process (the raw system call,
// not fork(), whose handlers take malloc's locks) into a throwaway grandchild that unwinds its
// copy of the interrupted thread, demangles, writes the frames to stderr and exits (alarm(5)
// ends it should a lock copied held block it); the replica only waits for the short-lived
// child in between. The launcher waits for the lines the header announces.
//
//   [1] xla-spawn: stack of pid 4242, 19 frames:
//   [1]   at xs::Waiter::wait_slow(char const*, ...) (train_fmnist+0x1f3)
//   [1]   at main (train_fmnist+0x8c)
//
// The handler runs on an alternate stack (sigaltstack, set for the thread that attaches, the
// main one in practice): with the signal frame on the interrupted stack, replicas interrupted
// inside oneDNN's generated GEMM code died of heap corruption, whatever the handler did.
// A signal interrupts what the replica's thread was doing: sleep(3), poll(2) and the like
// return early (EINTR), as with any handled signal.

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace xs {

// SIGRTMIN + 7: a real-time signal, so it never collides with SIGUSR1/2 that programs use.
int stack_dump_signal();
// Asks `pid`'s main thread for its stack with stack_dump_signal(). `at_once`: dump where the
// thread is, without the retries that let a thread interrupted in generated code run on to
// code the unwinder knows. For a stopped process about to be continued for the dump, whose
// stack is wanted where it stopped. False when the signal could not be sent.
bool request_stack_dump(pid_t pid, bool at_once);

// Installs the handler unless the program set its own disposition; true if installed (or
// already).
bool install_stack_dump();

// "xla-spawn: stack of pid P, N frames:" and then N lines beginning with kFrameLinePrefix.
inline constexpr std::string_view kStackHeaderPrefix = "xla-spawn: stack of pid ";
inline constexpr std::string_view kFrameLinePrefix = "  at ";
// N from a header line; nullopt when `line` is not one.
std::optional<int> stack_header_frames(std::string_view line);

// One frame as backtrace_symbols() gives it ("module(mangled+0x1f) [0x...]") as
// "  at demangled (module+0x1f)".
std::string describe_frame(std::string_view symbol_line);

}  // namespace xs
