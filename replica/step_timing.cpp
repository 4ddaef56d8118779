#include "xla_spawn/replica/step_timing.h"

#include <iterator>
#include <span>

#include <fmt/format.h>

#include "xla_spawn/replica/detail/atomic_file.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs::xm {
namespace {

double total_ns(std::string_view timer) {
  return runtime().metrics().total_ns(timer);
}

}  // namespace

void StepTimer::begin() {
  start_ = std::chrono::steady_clock::now();
  compile_ns_ = total_ns(kTimerCompileTime);
  rendezvous_ns_ = total_ns(kTimerGraphHashCheckTime);
  execute_ns_ = total_ns(kTimerExecuteTime);
  allreduce_ns_ = total_ns(kTimerAllReduceTime);
  network_s_ = communicator().network_seconds();
}

void StepTimer::data_ready() {
  data_ready_ = std::chrono::steady_clock::now();
}

void StepTimer::end(int64_t epoch, int64_t step) {
  if (!keep_rows_) return;
  using Ms = std::chrono::duration<double, std::milli>;
  const auto now = std::chrono::steady_clock::now();
  const double step_ms = Ms(now - start_).count();
  const double wait_ms = Ms(data_ready_ - start_).count();
  const double compile_ms = (total_ns(kTimerCompileTime) - compile_ns_) / 1e6;
  const double execute_ms = (total_ns(kTimerExecuteTime) - execute_ns_) / 1e6;
  // The all-reduce runs inside the program, so its time is part of ExecuteTime.
  const double allreduce_ms = (total_ns(kTimerAllReduceTime) - allreduce_ns_) / 1e6;
  const double rendezvous_ms = (total_ns(kTimerGraphHashCheckTime) - rendezvous_ns_) / 1e6;
  const double trace_ms = step_ms - wait_ms - compile_ms - execute_ms - rendezvous_ms;
  const double internode_ms = (communicator().network_seconds() - network_s_) * 1e3;
  for (double v : {static_cast<double>(epoch), static_cast<double>(step), step_ms, wait_ms,
                   trace_ms, compile_ms, execute_ms - allreduce_ms, allreduce_ms, rendezvous_ms,
                   Ms(now.time_since_epoch()).count(), internode_ms}) {
    rows_.push_back(v);
  }
}

void StepTimer::write_csv(const std::string& path) const {
  const std::vector<double> all = xm::all_gather(rows_);
  if (!xm::is_master()) return;
  std::string text =
      "ordinal,epoch,step,step_ms,wait_ms,trace_ms,compile_ms,compute_ms,allreduce_ms,"
      "rendezvous_ms,end_ms,internode_ms\n";
  const size_t per_ordinal = rows_.size();
  for (size_t k = 0; k < static_cast<size_t>(xm::world_size()); ++k) {
    for (size_t r = 0; r < per_ordinal; r += kColumns) {
      const double* v = &all[k * per_ordinal + r];
      fmt::format_to(
          std::back_inserter(text),
          "{},{:.0f},{:.0f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.3f},{:.4f}\n", k,
          v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], v[10]);
    }
  }
  if (detail::names_a_stream(path, "step timing CSV")) {
    return detail::write_to_stream(path, "step timing CSV", text);
  }
  // Like a checkpoint: a temporary renamed over the path, so a full disk keeps the previous
  // file and a symlink planted at the path is replaced, not written through.
  detail::AtomicFileWriter out(path, "step timing CSV");
  out.write(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  out.commit();
}

}  // namespace xs::xm
