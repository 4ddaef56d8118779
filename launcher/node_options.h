#pragma once
// How this xla-spawn takes part in a multi-node job: one xla-spawn per node, torchrun's flag
// names (--nnodes, --node-rank, --master-addr, --master-port, --rdzv-timeout), or, when
// --nnodes is not given, the environment of a launcher that starts one process per node:
//   Slurm (srun --ntasks-per-node=1): SLURM_NNODES, SLURM_NODEID, and the master is the first
//     host of SLURM_JOB_NODELIST unless --master-addr names another;
//   Open MPI (mpirun --npernode 1): OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK; the master
//     address must be given (Open MPI does not say where rank 0 runs).
// Flags always win over the environment.
//
//   xs::NodeFlags flags{.nnodes = "2", .node_rank = "1", .master_addr = "10.0.0.1"};
//   const xs::NodeOptions nodes = xs::resolve_node_options(flags);   // throws xs::UsageError

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace xs {

// torchrun's default port.
inline constexpr uint16_t kDefaultMasterPort = 29500;
// How long a node waits for the others (torchrun waits 900 s; a forgotten node is found sooner).
inline constexpr std::chrono::seconds kDefaultRdzvTimeout{300};

struct NodeOptions {
  int nnodes = 1;
  int node = 0;
  std::string master_addr;
  uint16_t master_port = kDefaultMasterPort;
  std::chrono::milliseconds rdzv_timeout = kDefaultRdzvTimeout;
  std::string source = "the command line";  // or "Slurm", "Open MPI": named in errors
  std::string master_addr_from = "--master-addr";  // or SLURM_JOB_NODELIST: named in errors
  bool multi_node() const { return nnodes > 1; }
};

// The flags as given on the command line (nullopt when absent).
struct NodeFlags {
  std::optional<std::string> nnodes;
  std::optional<std::string> node_rank;
  std::optional<std::string> master_addr;
  std::optional<std::string> master_port;
  std::optional<std::string> rdzv_timeout;
};

// Combines the flags with the environment (see above) and validates the result; throws
// UsageError naming the flag or variable and what was expected.
NodeOptions resolve_node_options(const NodeFlags& flags);

// The first host of a Slurm host list: "node[03-05,9],gpu1" -> "node03",
// "rack[1-2]-n[7-8]" -> "rack1-n7". Throws InvalidArgument for an empty or malformed list.
std::string first_slurm_host(const std::string& nodelist);

// 0.0.0.0 (in any form inet_aton takes, "0" too, or mapped: ::ffff:0.0.0.0) or :: (bracketed
// or not).
bool is_wildcard_address(const std::string& address);

}  // namespace xs
