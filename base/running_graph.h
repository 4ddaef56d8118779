#pragma once
// The runtime program whose collectives this process is running: its graph hash, 0 when none
// (an eager call), and how many steps (mark_step) have run. The runtime sets both when it runs
// a program; every collective call records the hash in its segment slot for the launcher's
// hang report, and each step's first collective counts towards the straggler report
// (shm/call_report.h).

#include <atomic>
#include <cstdint>

namespace xs {

inline std::atomic<uint64_t> running_graph_hash{0};
inline std::atomic<uint64_t> graph_steps{0};

}  // namespace xs
