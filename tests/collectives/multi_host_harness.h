#pragma once
// A fork harness for multi-node collectives on one machine: one process per replica, grouped
// into nodes, each node with its own shared-memory segment; every node's address is
// 127.0.0.1 and the rendezvous store a gloo FileStore in a fresh temporary directory, removed
// with the job. Children get the ForkJob's Child (global ordinal and world size, scratch).
//
//   xs::testing::MultiHostJob job({2, 1, 3});
//   job.start([](xs::testing::Child& child, xs::MultiHostCommunicator& comm) {
//     comm.barrier();
//     return std::string();                      // "" = success, else what went wrong
//   });
//   EXPECT_TRUE(job.wait(std::chrono::seconds(60)).all_ok());

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "xla_spawn/collectives/multi_host_communicator.h"
#include "tests/collectives/fork_harness.h"

namespace xs::testing {

class MultiHostJob {
 public:
  using Body = std::function<std::string(Child&, MultiHostCommunicator&)>;

  // `options` go to every replica's MultiHostCommunicator (and their timeout to the local
  // ShmCommunicators); the store prefix is made unique to the job.
  explicit MultiHostJob(std::vector<int> node_sizes, MultiHostCommunicatorOptions options = {},
                        size_t staging_bytes = size_t{64} << 10);
  ~MultiHostJob();  // the ForkJob reaps the children; the segments and store directory go
  MultiHostJob(const MultiHostJob&) = delete;
  MultiHostJob& operator=(const MultiHostJob&) = delete;

  int world_size() const { return world_size_; }
  const std::string& segment_name(int node) const { return segments_[node]->name(); }
  const ForkJob& fork_job() const { return job_; }

  void start(const Body& body);
  // As ForkJob::wait (which stretches the deadline under sanitizers).
  JobResult wait(std::chrono::milliseconds deadline) { return job_.wait(deadline); }

 private:
  std::vector<int> node_sizes_;
  int world_size_;
  MultiHostCommunicatorOptions options_;
  std::vector<std::string> node_job_ids_;
  std::vector<std::unique_ptr<OwnedSegment>> segments_;  // one per node
  std::string store_dir_;
  ForkJob job_;  // declared last: destroyed (children killed and reaped) first
};

}  // namespace xs::testing
