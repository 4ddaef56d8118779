#include "xla_spawn/launcher/replica_env.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/log.h"
#include "xla_spawn/launcher/options.h"
#include "xla_spawn/replica/context.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/shm/wait.h"

namespace xs {

std::string make_job_id() {
  // random_device alone is enough on Linux (getrandom); the clock guards against a
  // degenerate implementation returning constants.
  std::random_device device;
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  const uint32_t salt = device() ^ static_cast<uint32_t>(now) ^ static_cast<uint32_t>(now >> 32);
  return fmt::format("xs-{}-{:08x}", ::getpid(), salt);
}

void check_replica_settings() {
  try {
    log_level_from_env();
    collective_timeout_ms_from_env();
    wait_budget_from_env();
    env_bool(xm::kDebugReplicasEnv);
  } catch (const InvalidArgument& e) {
    throw UsageError(fmt::format("{} (a setting of the replicas, checked before they start)",
                                 e.what()));
  }
}

std::vector<EnvVar> compute_env_defaults() {
  std::vector<EnvVar> vars;
  auto set_default = [&vars](const char* name, const char* value) {
    if (std::getenv(name) == nullptr) vars.push_back({name, value});
  };
  set_default("OMP_NUM_THREADS", "1");
  set_default("OPENBLAS_NUM_THREADS", "1");
  // OpenBLAS's SkylakeX kernels need AVX-512 F, BW, DQ and VL; Haswell's need AVX2 and FMA.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    set_default("OPENBLAS_CORETYPE", "SkylakeX");
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    set_default("OPENBLAS_CORETYPE", "Haswell");
  }
  return vars;
}

std::vector<EnvVar> replica_env(const std::string& job_id, const ReplicaPlace& place, int attempt,
                                const std::vector<EnvVar>& extra) {
  namespace n = env_names;
  const std::string k = std::to_string(place.ordinal);
  const std::string local_k = std::to_string(place.local_ordinal);
  const std::string w = std::to_string(place.world_size);
  const std::string local_w = std::to_string(place.local_world_size);
  const std::string a = std::to_string(attempt);
  std::vector<EnvVar> vars = {
      {n::kOrdinal, k},
      {n::kLocalOrdinal, local_k},
      {n::kWorldSize, w},
      {n::kLocalWorldSize, local_w},
      {n::kJobId, job_id},
      {n::kAttempt, a},
      {n::kNode, "0"},
      {n::kNnodes, "1"},
      {n::kNodeSizes, std::nullopt},
      {n::kMasterAddr, std::nullopt},
      {n::kMasterPort, std::nullopt},
      {n::kHostAddr, std::nullopt},
      {n::kTorchRank, k},
      {n::kTorchLocalRank, local_k},
      {n::kTorchWorldSize, w},
      {n::kTorchLocalWorldSize, local_w},
      {n::kTorchGroupRank, "0"},
      {n::kTorchGroupWorldSize, "1"},
      {n::kTorchRunId, job_id},
      {n::kTorchRestartCount, a},
      {n::kSegment, std::nullopt},
  };
  const std::vector<EnvVar> defaults = compute_env_defaults();
  vars.insert(vars.end(), defaults.begin(), defaults.end());
  vars.insert(vars.end(), extra.begin(), extra.end());
  return vars;
}

std::vector<EnvVar> torch_store_env(const std::string& default_addr,
                                    const std::function<std::optional<uint16_t>()>& pick_port) {
  namespace n = env_names;
  constexpr const char* kMarker = "XLA_SPAWN_TORCH_PORT";
  const std::optional<std::string> port = env_string(n::kTorchMasterPort);
  const std::optional<std::string> marker = env_string(kMarker);
  const bool inherited = port && marker && *port == *marker;
  const std::optional<std::string> addr = env_string(n::kTorchMasterAddr);
  std::optional<std::string> chosen = inherited ? std::nullopt : port;
  if (!chosen) {
    if (const std::optional<uint16_t> picked = pick_port()) chosen = std::to_string(*picked);
  }
  return {{n::kTorchMasterAddr, addr && !inherited ? *addr : default_addr},
          {n::kTorchMasterPort, chosen},
          {kMarker, chosen}};
}

}  // namespace xs
