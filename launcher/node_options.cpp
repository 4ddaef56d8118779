#include "xla_spawn/launcher/node_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/launcher/options.h"
#include "xla_spawn/replica/context.h"

namespace xs {
namespace {

int64_t flag_int(const std::string& text, int64_t min, int64_t max, const char* what) {
  try {
    return parse_int(text, min, max, what);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

// Slurm or Open MPI, when they started this process as one task per node.
bool from_scheduler(NodeOptions& nodes) {
  const auto slurm_nodes = env_string("SLURM_NNODES");
  if (slurm_nodes && env_string("SLURM_PROCID")) {  // SLURM_PROCID: inside srun, not sbatch's script
    nodes.source = "Slurm";
    nodes.nnodes = static_cast<int>(flag_int(*slurm_nodes, 1, kMaxNodes, "SLURM_NNODES"));
    const auto tasks = env_int("SLURM_NTASKS", 1, INT32_MAX);
    if (tasks && *tasks != nodes.nnodes) {
      throw UsageError(fmt::format("Slurm started {} tasks on {} nodes: run one xla-spawn per node "
                                   "(srun --ntasks-per-node=1), it starts the replicas",
                                   *tasks, nodes.nnodes));
    }
    const auto node_id = env_string("SLURM_NODEID");
    if (!node_id) throw UsageError("SLURM_NNODES is set but SLURM_NODEID is not");
    nodes.node = static_cast<int>(flag_int(*node_id, 0, kMaxNodes - 1, "SLURM_NODEID"));
    if (auto list = env_string("SLURM_JOB_NODELIST")) {
      try {
        nodes.master_addr = first_slurm_host(*list);
        nodes.master_addr_from = "SLURM_JOB_NODELIST's first host";
      } catch (const InvalidArgument& e) {
        throw UsageError(fmt::format("SLURM_JOB_NODELIST: {}", e.what()));
      }
    }
    // Both schedulers' variables (mpirun inside an srun allocation): they must agree.
    const auto mpi_size = env_int("OMPI_COMM_WORLD_SIZE", 1, INT32_MAX);
    const auto mpi_rank = env_int("OMPI_COMM_WORLD_RANK", 0, INT32_MAX);
    if (mpi_size.has_value() != mpi_rank.has_value()) {  // as without Slurm: mpirun sets both
      throw UsageError(mpi_size ? "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"
                                : "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
    }
    if (mpi_size && mpi_rank && (*mpi_size != nodes.nnodes || *mpi_rank != nodes.node)) {
      throw UsageError(fmt::format(
          "Slurm says node {} of {} (SLURM_NODEID, SLURM_NNODES), Open MPI says {} of {} "
          "(OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE): start xla-spawn with one of them, "
          "one per node, or give --nnodes and --node-rank",
          nodes.node, nodes.nnodes, *mpi_rank, *mpi_size));
    }
    return true;
  }
  const auto mpi_size = env_string("OMPI_COMM_WORLD_SIZE");
  if (mpi_size) {
    nodes.source = "Open MPI";
    nodes.nnodes = static_cast<int>(flag_int(*mpi_size, 1, kMaxNodes, "OMPI_COMM_WORLD_SIZE"));
    const auto local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1, INT32_MAX);
    if (local && *local != 1) {
      throw UsageError(fmt::format("mpirun started {} processes on this node: run one xla-spawn per "
                                   "node (mpirun --npernode 1), it starts the replicas",
                                   *local));
    }
    const auto rank = env_string("OMPI_COMM_WORLD_RANK");
    if (!rank) throw UsageError("OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
    nodes.node = static_cast<int>(flag_int(*rank, 0, kMaxNodes - 1, "OMPI_COMM_WORLD_RANK"));
    return true;
  }
  return false;
}

}  // namespace

NodeOptions resolve_node_options(const NodeFlags& flags) {
  NodeOptions nodes;
  bool scheduled = false;
  if (flags.nnodes) {
    nodes.nnodes = static_cast<int>(flag_int(*flags.nnodes, 1, kMaxNodes, "--nnodes"));
  } else {
    scheduled = from_scheduler(nodes);
  }
  if (flags.node_rank) {
    const int rank = static_cast<int>(flag_int(*flags.node_rank, 0, kMaxNodes - 1, "--node-rank"));
    // The scheduler's rank is this task's; another one would make two hosts the same node.
    if (scheduled && rank != nodes.node) {
      throw UsageError(fmt::format("--node-rank {} but {} says this is node {}: leave out "
                                   "--node-rank under srun or mpirun, or give --nnodes too",
                                   rank, nodes.source, nodes.node));
    }
    nodes.node = rank;
  } else if (flags.nnodes && nodes.nnodes > 1) {
    // A default of 0 would make every host that forgot it a second master.
    throw UsageError(fmt::format(
        "--nnodes {} needs --node-rank K on every host (0..{}, node 0 runs the rendezvous); "
        "under srun or mpirun leave out both to take them from the scheduler",
        nodes.nnodes, nodes.nnodes - 1));
  }
  if (flags.master_addr) {
    nodes.master_addr = *flags.master_addr;
    nodes.master_addr_from = "--master-addr";
  }
  // Node 0 listens on exactly this address and the others connect to it: the wildcard
  // address would have node 0 advertise loopback, and every other node fail in gloo.
  if (is_wildcard_address(nodes.master_addr)) {
    throw UsageError(fmt::format(
        "{} {} is the wildcard address: give node 0's address that the other nodes reach "
        "(xla-spawn listens on exactly that address)",
        nodes.master_addr_from, nodes.master_addr));
  }
  if (flags.master_port) {
    nodes.master_port = static_cast<uint16_t>(flag_int(*flags.master_port, 1, 65535, "--master-port"));
  }
  if (flags.rdzv_timeout) {
    const int64_t seconds = flag_int(*flags.rdzv_timeout, 1, 86400, "--rdzv-timeout");
    nodes.rdzv_timeout = std::chrono::seconds(seconds);
  }
  // Harmless on one node, but most likely a forgotten --nnodes: say so rather than run alone.
  if (!flags.nnodes && !scheduled &&
      (flags.node_rank || flags.master_addr || flags.master_port || flags.rdzv_timeout)) {
    throw UsageError("--node-rank, --master-addr, --master-port and --rdzv-timeout need --nnodes N");
  }
  if (nodes.node >= nodes.nnodes) {
    if (!flags.nnodes) {
      throw UsageError(fmt::format("node rank {} must be less than the node count, {} (both from {})",
                                   nodes.node, nodes.nnodes, nodes.source));
    }
    throw UsageError(fmt::format("node rank {} (from {}) must be less than --nnodes {}", nodes.node,
                                 nodes.source, nodes.nnodes));
  }
  if (nodes.multi_node() && nodes.master_addr.empty()) {
    throw UsageError(fmt::format("a job of {} nodes (from {}) needs --master-addr: the address of "
                                 "node 0, which runs the rendezvous",
                                 nodes.nnodes, nodes.source));
  }
  return nodes;
}

std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host.push_back(nodelist[i++]);
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) {
      throw InvalidArgument(fmt::format("'{}': '[' without ']'", nodelist));
    }
    // The first value of the first range keeps its zero padding: "[03-05,9]" -> "03".
    const std::string inside = nodelist.substr(i + 1, close - i - 1);
    if (inside.find_first_not_of("0123456789,-") != std::string::npos) {
      throw InvalidArgument(
          fmt::format("'{}': range '[{}]' holds more than numbers, ',' and '-'", nodelist, inside));
    }
    const std::string first = inside.substr(0, inside.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
      throw InvalidArgument(fmt::format("'{}': range '[{}]' does not start with a number", nodelist, inside));
    }
    host += first;
    i = close + 1;
  }
  if (host.empty()) throw InvalidArgument(fmt::format("'{}': no host", nodelist));
  if (host.find(']') != std::string::npos) {
    throw InvalidArgument(fmt::format("'{}': ']' without '['", nodelist));
  }
  return host;
}

bool is_wildcard_address(const std::string& address) {
  std::string text = address;
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  in_addr v4{};
  in6_addr v6{};
  if (::inet_aton(text.c_str(), &v4) != 0) return v4.s_addr == htonl(INADDR_ANY);
  if (::inet_pton(AF_INET6, text.c_str(), &v6) != 1) return false;
  // "::" or "::ffff:0.0.0.0", the IPv4 wildcard mapped.
  return IN6_IS_ADDR_UNSPECIFIED(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr32[3] == 0);
}

}  // namespace xs
