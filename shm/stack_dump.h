#pragma once
// A replica's stack on request, for the launcher's hang report: Segment::attach installs a
// handler for stack_dump_signal() (when the program left it at its default), which writes the
// calling thread's frames to stderr, one "xla-spawn frame: " line each (backtrace_symbols_fd:
// no allocation in the handler); the launcher turns those lines into demangled function names
// (describe_frame) as it relays them. The launcher sends the signal only to processes whose
// call record says the handler is there: the signal's default action would kill them.
//
//   [1] xla-spawn: stack of pid 4242, 19 frames:
//   [1]   at xs::Waiter::wait_slow(char const*, ...) (libxs.so+0x1f3)
//   [1]   at main (train_fmnist+0x8c)

#include <optional>
#include <string>
#include <string_view>

namespace xs {

// SIGRTMIN + 7: a real-time signal, so it never collides with SIGUSR1/2 that programs use.
int stack_dump_signal();

// Installs the handler unless the program set its own disposition; true if installed (or
// already). Loads what backtrace() needs up front, so the handler never does.
bool install_stack_dump();

inline constexpr std::string_view kFramePrefix = "xla-spawn frame: ";
// "xla-spawn: stack of pid P, N frames:": the N frame lines follow.
inline constexpr std::string_view kStackHeaderPrefix = "xla-spawn: stack of pid ";
// N from a header line; nullopt when `line` is not one.
std::optional<int> stack_header_frames(std::string_view line);

// "module(mangled+0x1f) [0x...]" (what backtrace_symbols_fd writes after kFramePrefix) as
// "  at demangled (module+0x1f)"; the line unchanged when it is not a frame.
std::string describe_frame(std::string_view line);

}  // namespace xs
