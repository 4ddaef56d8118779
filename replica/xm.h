#pragma once
// The replica's view of its job, in the manner of torch_xla.core.xla_model: init() reads the
// launcher's environment, attaches the job's segment and hands the runtime a communicator for
// in-graph all-reduces; the rest answer who this replica is and print on the master only.
//
//   xs::xm::init();                                   // standalone: ordinal 0 of 1
//   if (xs::xm::is_master()) ...;
//   xs::xm::master_print("epoch {} accuracy {:.4f}", epoch, acc);

#include <string>
#include <utility>

#include <fmt/format.h>

#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/replica/context.h"

namespace xs::xm {

// Set to 1 to check, every optimizer_step, that all replicas compiled the same graph and hold
// bit-identical parameters (see replica/divergence_check.h).
inline constexpr const char* kDebugReplicasEnv = "XLA_SPAWN_DEBUG_REPLICAS";

// Reads the environment (ReplicaContext::from_env), builds the communicator (a
// ShmCommunicator on the job's segment; in a multi-node job a MultiHostCommunicator over this
// node's segment and gloo, whose contexts meet through the rendezvous server's store; a
// LocalCommunicator when standalone or at world size 1), sets it on the current runtime and
// tags log lines with the ordinal. Idempotent.
void init();
// Detaches the communicator from the runtime and forgets the state (tests, clean exit).
void shutdown();
// For a process exiting while another of its threads is inside a collective: forgets the
// state without tearing the communicator down under that thread (which would read unmapped
// memory). The exit itself then leaves the job: the peers see the process gone.
void abandon();
bool initialized();

const ReplicaContext& context();  // throws InternalError before init()
Communicator& communicator();  // valid until shutdown(); keep no reference past it
int ordinal();
int local_ordinal();
int world_size();
// The (global, or with local = true the per-host) master is ordinal 0.
bool is_master(bool local = false);
// Whether XLA_SPAWN_DEBUG_REPLICAS is on (read at init).
bool debug_replicas();

// Prints one line to stdout on the master only (every replica must still reach the call
// the same way; it synchronises nothing).
void master_print_line(const std::string& line);
template <typename... Args>
void master_print(fmt::format_string<Args...> format, Args&&... args) {
  if (is_master()) master_print_line(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace xs::xm
