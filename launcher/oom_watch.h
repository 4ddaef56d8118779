#pragma once
// Whether the kernel's OOM killer took a replica: a replica killed by SIGKILL that xla-spawn did
// not send is checked against the OOM kill counters read when the attempt started, this
// process's memory cgroup's ("oom_kill" in cgroup v2's memory.events or v1's
// memory.oom_control) and the system's (/proc/vmstat). A rise names the OOM killer in the
// summary instead of a bare "signal 9".
//
//   xs::OomWatch oom;                          // counters now
//   if (auto why = oom.explain_sigkill()) ...  // "the kernel's OOM killer (oom_kill of memory
//                                              //  cgroup /job rose from 0 to 1)"

#include <cstdint>
#include <optional>
#include <string>

namespace xs {

class OomWatch {
 public:
  OomWatch();
  // Why a process of the job died by a SIGKILL nobody here sent, if the counters say so.
  std::optional<std::string> explain_sigkill() const;

 private:
  std::string cgroup_file_;  // empty when no memory cgroup counter could be read
  std::optional<uint64_t> cgroup_kills_;
  std::optional<uint64_t> system_kills_;
};

// "oom_kill N" from a memory.events, memory.oom_control or /proc/vmstat text.
std::optional<uint64_t> parse_oom_kills(const std::string& text);
// The file holding this process's memory cgroup's OOM kill count, from /proc/self/cgroup's
// text (v2 "0::/path", v1 "N:memory:/path"), under `root` (/sys/fs/cgroup); empty if none.
std::string memory_events_file(const std::string& proc_self_cgroup, const std::string& root);

}  // namespace xs
