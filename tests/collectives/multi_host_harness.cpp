#include "tests/collectives/multi_host_harness.h"

#include <stdlib.h>

#include <filesystem>
#include <numeric>
#include <stdexcept>

#include <gloo/rendezvous/file_store.h>

#include "xla_spawn/shm/wait.h"

namespace xs::testing {
namespace {

std::string make_temp_dir() {
  std::string path = (std::filesystem::temp_directory_path() / "xs-multi-host-XXXXXX").string();
  if (::mkdtemp(path.data()) == nullptr) throw std::runtime_error("MultiHostJob: mkdtemp failed");
  return path;
}

}  // namespace

MultiHostJob::MultiHostJob(std::vector<int> node_sizes, MultiHostCommunicatorOptions options,
                           size_t staging_bytes)
    : node_sizes_(std::move(node_sizes)),
      world_size_(std::accumulate(node_sizes_.begin(), node_sizes_.end(), 0)),
      options_(std::move(options)),
      store_dir_(make_temp_dir()),
      job_(world_size_, /*staging_bytes=*/0) {
  options_.prefix = unique_job_id();
  for (int size : node_sizes_) {
    node_job_ids_.push_back(unique_job_id());
    segments_.push_back(std::make_unique<OwnedSegment>(node_job_ids_.back(), size, staging_bytes));
  }
}

MultiHostJob::~MultiHostJob() {
  std::error_code ignored;
  std::filesystem::remove_all(store_dir_, ignored);
}

void MultiHostJob::start(const Body& body) {
  job_.start([this, &body](Child& child) {
    const NodeTopology shape(node_sizes_, 0, 0);
    const int node = shape.node_of(child.ordinal);
    const int local_ordinal = child.ordinal - shape.first_ordinal(node);
    const NodeTopology topology(node_sizes_, node, local_ordinal);
    // Every "node" here shares this machine's cores, while each node's segment allows
    // spinning when its own replicas fit the cores: spinning waits would steal the CPU from
    // the replicas of other nodes (an all-reduce of one float on {2, 2}: 3.3 ms spinning,
    // 0.3 ms not, on 2 cores). The child's own environment, read by its Waiter.
    ::setenv(kSpinEnv, "0", 1);
    std::unique_ptr<ShmCommunicator> local;
    if (node_sizes_[node] > 1) {
      local = std::make_unique<ShmCommunicator>(
          Segment::attach(segments_[node]->name(), local_ordinal, node_sizes_[node],
                          node_job_ids_[node]),
          ShmCommunicatorOptions{.algorithm = {}, .timeout_ms = options_.timeout_ms});
    }
    MultiHostCommunicator comm(topology, std::move(local),
                               std::make_shared<gloo::rendezvous::FileStore>(store_dir_),
                               "127.0.0.1", options_);
    return body(child, comm);
  });
}

}  // namespace xs::testing
