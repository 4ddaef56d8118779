#pragma once
// Whether the kernel's OOM killer took a replica: for a replica killed by a SIGKILL xla-spawn
// did not send, the kernel log (/dev/kmsg, when readable: root) is searched for the OOM
// killer's "Killed process <pid> (...)" line, which names the process itself; where the log
// cannot be read, a rise of this process's memory cgroup's OOM kill count ("oom_kill" in
// cgroup v2's memory.events or v1's memory.oom_control) since the attempt started is taken,
// and the message says it is the count. A rise alone may be another process of the same
// cgroup, hence the log first.
//
//   xs::OomWatch oom;                             // the count now
//   if (auto why = oom.explain_sigkill(pid)) ...  // "the kernel's OOM killer (kernel log:
//                                                 //  Killed process 4242 (train_fmnist))"

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace xs {

class OomWatch {
 public:
  OomWatch();
  // Why `pid`, a process of the job, died by a SIGKILL nobody here sent, if the kernel log or
  // (without it) the cgroup's count says the OOM killer did it.
  std::optional<std::string> explain_sigkill(pid_t pid) const;

 private:
  std::string cgroup_file_;  // empty when no memory cgroup counter could be read
  std::optional<uint64_t> cgroup_kills_;
};

// The OOM killer's line about `pid` in kernel log text ("Killed process 4242 (name)"), from
// /dev/kmsg records or dmesg output; nullopt when there is none.
std::optional<std::string> oom_kill_line(const std::string& log, pid_t pid);

// "oom_kill N" from a memory.events or memory.oom_control text.
std::optional<uint64_t> parse_oom_kills(const std::string& text);
// The file holding this process's memory cgroup's OOM kill count, from /proc/self/cgroup's
// text (v2 "0::/path", v1 "N:memory:/path"), under `root` (/sys/fs/cgroup); empty if none.
std::string memory_events_file(const std::string& proc_self_cgroup, const std::string& root);
// The same for this process, as the system shows it.
std::string own_memory_events_file();

}  // namespace xs
