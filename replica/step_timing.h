#pragma once
// Per-step timing of one replica (wall time of the step split into waiting for data, tracing,
// compiling, computing and the in-graph all-reduce, from the runtime's metrics timers), gathered
// on the master at the end and written as one CSV with a row per (ordinal, step): the input of
// the scaling benchmark. Rows are kept only when asked for (a CSV will be written): at 80 bytes
// a step they would grow without bound in a long run.
//
//   StepTimer t(true); t.begin(); ...wait for batch...; t.data_ready(); ...step...; t.end(epoch, step);
//   t.write_csv(path);   // collective

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace xs::xm {

class StepTimer {
 public:
  explicit StepTimer(bool keep_rows) : keep_rows_(keep_rows) {}
  void begin();
  void data_ready();
  void end(int64_t epoch, int64_t step);
  // Collective (every replica ran the same number of steps); the master writes `path`:
  // ordinal,epoch,step,step_ms,wait_ms,trace_ms,compile_ms,compute_ms,allreduce_ms,
  // rendezvous_ms,end_ms,internode_ms. wait: for the loader's batch (or building it, when the loader has no
  // thread); compile: CompileTime; compute: ExecuteTime minus the in-graph AllReduceTime (which
  // includes waiting for the slowest peer); rendezvous: the runtime's graph-hash check
  // (GraphHashCheckTime, only when the graph changed; its waiting for peers included); trace:
  // the rest of the step on the host (tracing, reading the loss); end: when the step ended (ms
  // on the steady clock, CLOCK_MONOTONIC: comparable across the replicas of one machine);
  // internode: the part of the collectives spent between nodes (Communicator::network_seconds:
  // gloo's sends, receives and waits; 0 on one node), included in allreduce.
  void write_csv(const std::string& path) const;

 private:
  static constexpr int kColumns = 11;  // epoch, step, seven durations, the end time, internode
  bool keep_rows_;
  std::vector<double> rows_;           // kColumns per step
  std::chrono::steady_clock::time_point start_, data_ready_;
  // Timer totals at begin().
  double compile_ns_ = 0, execute_ns_ = 0, allreduce_ns_ = 0, rendezvous_ns_ = 0;
  double network_s_ = 0;
};

}  // namespace xs::xm
