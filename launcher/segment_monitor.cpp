#include "xla_spawn/launcher/segment_monitor.h"

#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/context.h"
#include "xla_spawn/shm/call_report.h"
#include "xla_spawn/shm/control_block_check.h"
#include "xla_spawn/shm/futex.h"
#include "xla_spawn/shm/stack_dump.h"

namespace xs {

namespace bip = boost::interprocess;

struct SegmentMonitor::Mapping {
  std::string name;
  bip::mapped_region region;
  SegmentHeader header;  // as created, before any replica ran
};

SegmentMonitor::SegmentMonitor(JobResources* inner) : inner_(inner) {}

SegmentMonitor::~SegmentMonitor() = default;

std::vector<EnvVar> SegmentMonitor::prepare(const std::string& job_id, int world_size,
                                            int attempt) {
  mapping_.reset();
  std::vector<EnvVar> env =
      inner_ != nullptr ? inner_->prepare(job_id, world_size, attempt) : std::vector<EnvVar>();
  for (const EnvVar& var : env) {
    if (var.name != env_names::kSegment || !var.value) continue;
    auto mapping = std::make_unique<Mapping>();
    mapping->name = *var.value;
    try {
      bip::shared_memory_object object(bip::open_only, var.value->c_str(), bip::read_only);
      mapping->region = bip::mapped_region(object, bip::read_only);
    } catch (const bip::interprocess_exception& e) {
      throw IoError(fmt::format("segment {}: cannot map it to watch it: {}", *var.value, e.what()));
    }
    const auto& control = *static_cast<const shm::ControlBlock*>(mapping->region.get_address());
    if (auto bad = check_header(control, mapping->region.get_size())) {
      throw InternalError(fmt::format("segment {} just created: {}", *var.value, *bad));
    }
    mapping->header = SegmentHeader::of(control);
    mapping_ = std::move(mapping);
  }
  return env;
}

void SegmentMonitor::release() noexcept {
  mapping_.reset();
  if (inner_ != nullptr) inner_->release();
}

std::optional<std::string> SegmentMonitor::check(std::span<const pid_t> pids_by_ordinal) noexcept {
  if (!mapping_) return std::nullopt;
  try {
    auto bad = check_segment(mapping_->region.get_address(), mapping_->region.get_size(),
                             mapping_->header, pids_by_ordinal);
    if (bad)
      return fmt::format("control block of segment {} is corrupted: {}", mapping_->name, *bad);
  } catch (const std::exception& e) {  // only allocation can throw here
    return fmt::format("checking segment {}: {}", mapping_->name, e.what());
  }
  return std::nullopt;
}

std::string SegmentMonitor::call_report(std::span<const pid_t> pids_by_ordinal, int first_ordinal,
                                        bool spans_nodes) noexcept {
  if (!mapping_) return {};
  try {
    return format_calls(read_calls(mapping_->region.get_address(), mapping_->region.get_size(),
                                   mapping_->header.world_size, pids_by_ordinal),
                        first_ordinal, spans_nodes);
  } catch (const std::exception& e) {  // only allocation can throw here
    return fmt::format("  (no report: {})\n", e.what());
  }
}

std::string SegmentMonitor::straggler_report(int first_ordinal, bool spans_nodes) noexcept {
  if (!mapping_) return {};
  try {
    return straggler_line(read_calls(mapping_->region.get_address(), mapping_->region.get_size(),
                                     mapping_->header.world_size, {}),
                          first_ordinal, spans_nodes)
        .value_or("");
  } catch (const std::exception&) {  // only allocation can throw here
    return {};
  }
}

namespace {

// Whether `pid` has a handler for `signo` (the SigCgt mask of /proc/<pid>/status).
bool catches_signal(pid_t pid, int signo) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (!line.starts_with("SigCgt:")) continue;
    try {
      const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
      return signo >= 1 && signo <= 64 && ((mask >> (signo - 1)) & 1) != 0;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

}  // namespace

int SegmentMonitor::request_stacks(std::span<const pid_t> pids_by_ordinal,
                                   bool continue_stopped) noexcept {
  if (!mapping_) return 0;
  int asked = 0;
  try {
    for (const OrdinalCall& c : read_calls(mapping_->region.get_address(),
                                           mapping_->region.get_size(),
                                           mapping_->header.world_size, pids_by_ordinal)) {
      const auto k = static_cast<size_t>(c.ordinal);
      // Only a live process of this replica's tree that said it handles the signal: its
      // default action would kill anything else.
      if (!c.dumps_stack || c.slot_pid <= 0 || k >= pids_by_ordinal.size() ||
          pids_by_ordinal[k] <= 0 || !of_replica(c.slot_pid, pids_by_ordinal[k])) {
        continue;
      }
      const std::optional<std::string> fields = process_stat_fields(c.slot_pid);
      if (!fields || fields->empty() || (*fields)[0] == 'Z') continue;
      // Still catching it now: the record is set at attach, and the process may have exec'd
      // since (the signal would kill the new program) or put its own disposition in place.
      if (!catches_signal(c.slot_pid, stack_dump_signal())) continue;
      const bool stopped = (*fields)[0] == 'T';
      if (stopped && !continue_stopped) continue;
      // To the main thread (tid = pid): a process-directed signal may land on any thread. A
      // stopped one dumps at once: retries would let it run on from where it stopped.
      if (!request_stack_dump(c.slot_pid, /*at_once=*/stopped)) continue;
      if (stopped) ::kill(c.slot_pid, SIGCONT);
      ++asked;
    }
  } catch (const std::exception&) {  // only allocation can throw here
  }
  return asked;
}

double SegmentMonitor::longest_wait_s() noexcept {
  if (!mapping_) return 0;
  double longest = 0;
  try {
    for (const OrdinalCall& c : read_calls(mapping_->region.get_address(),
                                           mapping_->region.get_size(),
                                           mapping_->header.world_size, {})) {
      if (c.seq == 0 && c.name.empty()) continue;  // no call yet
      if (!c.returned || c.between_nodes) longest = std::max(longest, c.seconds_in_call);
    }
  } catch (const std::exception&) {  // only allocation can throw here
  }
  return longest;
}

std::optional<std::pair<int, std::string>> SegmentMonitor::waits_for_departed(
    std::span<const pid_t> pids_by_ordinal, std::span<const int> ended, double min_wait_s,
    int first_ordinal) noexcept {
  if (!mapping_) return std::nullopt;
  try {
    const std::vector<OrdinalCall> calls =
        read_calls(mapping_->region.get_address(), mapping_->region.get_size(),
                   mapping_->header.world_size, pids_by_ordinal);
    const auto never_joined = [&](int ordinal) {
      return std::find(ended.begin(), ended.end(), ordinal) != ended.end() &&
             calls[static_cast<size_t>(ordinal)].slot_pid == 0;
    };
    for (const OrdinalCall& c : calls) {
      if (c.state == '\0' || c.returned || c.awaited < 0 ||
          c.awaited >= static_cast<int>(calls.size()) || c.seconds_waiting < min_wait_s ||
          !never_joined(c.awaited)) {
        continue;
      }
      return std::pair(c.awaited, fmt::format("ordinal {} has waited {:.1f} s in {}",
                                              first_ordinal + c.ordinal, c.seconds_waiting,
                                              c.name.empty() ? "a collective" : c.name));
    }
  } catch (const std::exception&) {  // only allocation can throw here
  }
  return std::nullopt;
}

bool SegmentMonitor::timed_out() noexcept {
  if (!mapping_) return false;
  const auto& control = *static_cast<const shm::ControlBlock*>(mapping_->region.get_address());
  if (control.poisoned.load(std::memory_order_acquire) == 0) return false;
  const std::string_view reason(control.poison_reason,
                                strnlen(control.poison_reason, shm::kPoisonReasonBytes));
  // The waits' "timed out after ...", gloo's "Timed out waiting ..." (across nodes).
  return reason.find("timed out") != std::string_view::npos ||
         reason.find("Timed out") != std::string_view::npos;
}

}  // namespace xs
