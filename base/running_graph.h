#pragma once
// The runtime program whose collectives this process is running: its graph hash, 0 when none
// (an eager call). The runtime sets it around a program's run; every collective call records
// it in its segment slot for the launcher's hang report (shm/call_report.h).

#include <atomic>
#include <cstdint>

namespace xs {

inline std::atomic<uint64_t> running_graph_hash{0};

}  // namespace xs
