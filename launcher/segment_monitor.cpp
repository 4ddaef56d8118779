#include "launcher/segment_monitor.h"

#include <fmt/format.h>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "base/error.h"
#include "replica/context.h"
#include "shm/call_report.h"
#include "shm/control_block_check.h"

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

std::string SegmentMonitor::call_report(std::span<const pid_t> pids_by_ordinal,
                                        int first_ordinal) noexcept {
  if (!mapping_) return {};
  try {
    return format_calls(read_calls(mapping_->region.get_address(), mapping_->region.get_size(),
                                   mapping_->header.world_size, pids_by_ordinal),
                        first_ordinal);
  } catch (const std::exception& e) {  // only allocation can throw here
    return fmt::format("  (no report: {})\n", e.what());
  }
}

bool SegmentMonitor::timed_out() noexcept {
  if (!mapping_) return false;
  const auto& control = *static_cast<const shm::ControlBlock*>(mapping_->region.get_address());
  if (control.poisoned.load(std::memory_order_acquire) == 0) return false;
  const std::string_view reason(control.poison_reason,
                                strnlen(control.poison_reason, shm::kPoisonReasonBytes));
  return reason.find("timed out after") != std::string_view::npos;
}

}  // namespace xs
