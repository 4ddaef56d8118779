#pragma once
// Test support for the reliability tests: find a job's processes by an environment tag every
// process of the job inherits, find a launcher's segments in /dev/shm, and build the small,
// fast train_fmnist command line the fault cases run.
//
//   const std::string tag = unique_tag();            // set as XS_FAULT_TRIAL in the launcher
//   EXPECT_TRUE(wait_until([&] { return tagged_processes(tag).empty(); }, 10s));
//   EXPECT_TRUE(segments_of_launcher(launcher_pid).empty());

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace xs::testing {

inline constexpr const char* kTrialTagEnv = "XS_FAULT_TRIAL";

std::string train_fmnist_path();
std::string checkpoint_check_path();
std::string corrupt_replica_path();

// A value unique to this test process and call.
std::string unique_tag();

// Pids of live processes (not zombies) whose environment holds XS_FAULT_TRIAL=<tag>.
std::vector<pid_t> tagged_processes(const std::string& tag);
// The pid of the tagged replica with XLA_SPAWN_ORDINAL=<ordinal>, if it runs.
std::optional<pid_t> tagged_replica(const std::string& tag, int ordinal);

// /dev/shm entries of segments created by the launcher with this pid (job ids hold it).
std::vector<std::string> segments_of_launcher(pid_t launcher_pid);

// `xla-spawn` arguments after the launcher's own: "-- train_fmnist <small fast config>".
// steps = 0: train until stopped (1000 epochs).
std::vector<std::string> train_command(const std::string& checkpoint, int steps);

// checkpoint_check's verdict: "ok global_step=3 ...", "missing ...", "damaged: ...".
std::string check_checkpoint(const std::string& path);

}  // namespace xs::testing
