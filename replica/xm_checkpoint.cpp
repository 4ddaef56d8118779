#include "xla_spawn/replica/xm_checkpoint.h"

#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/detail/atomic_file.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/replica/xm_collectives.h"
#include "xla_spawn/runtime/state_dict.h"

namespace xs::xm {
namespace {

constexpr std::string_view kModelPrefix = "model.";
constexpr std::string_view kOptimizerPrefix = "optim.";

void append(std::vector<HostTensor>& out, std::string_view prefix, const StateDict& state) {
  for (const HostTensorData& t : state) {
    out.push_back(HostTensor{fmt::format("{}{}", prefix, t.name), t.dtype, t.shape, t.bytes});
  }
}

// The entries whose name starts with `prefix`, prefix removed.
StateDict take(const Checkpoint& ckpt, std::string_view prefix) {
  StateDict out;
  for (const HostTensor& t : ckpt.tensors) {
    if (t.name.starts_with(prefix)) {
      out.push_back(HostTensorData{t.name.substr(prefix.size()), t.dtype, t.shape, t.bytes});
    }
  }
  return out;
}

void check_prefixes(const Checkpoint& ckpt) {
  for (const HostTensor& t : ckpt.tensors) {
    if (!t.name.starts_with(kModelPrefix) && !t.name.starts_with(kOptimizerPrefix)) {
      throw InvalidArgument(fmt::format("checkpoint {}: tensor '{}' is neither '{}*' nor '{}*'",
                                        ckpt.source, t.name, kModelPrefix, kOptimizerPrefix));
    }
  }
}

// Throws InvalidArgument unless `state` has exactly the names, shapes and dtypes of `target`.
void check_fits(const StateDict& state, const NamedTensors& target, std::string_view prefix) {
  if (state.size() != target.size()) {
    throw InvalidArgument(fmt::format("{} '{}*' tensors, the {} has {}", state.size(), prefix,
                                      prefix == kOptimizerPrefix ? "optimizer" : "model",
                                      target.size()));
  }
  for (size_t i = 0; i < state.size(); ++i) {
    const HostTensorData& t = state[i];
    const auto& [name, tensor] = target[i];
    if (t.name != name || t.shape != tensor.shape() || !loads_as(t.dtype, tensor.dtype())) {
      throw InvalidArgument(
          fmt::format("entry {} is '{}{}' {} {}, expected '{}{}' {} {}", i, prefix, t.name,
                      dtype_name(t.dtype), fmt::join(t.shape, "x"), prefix, name,
                      dtype_name(tensor.dtype()), fmt::join(tensor.shape(), "x")));
    }
  }
}

}  // namespace

void check_can_save(const std::string& path) {
  if (is_master()) detail::AtomicFileWriter probe(path, "checkpoint");  // removed uncommitted
}

void save(const std::string& path, const NamedTensors& model_state, const Optimizer* optimizer,
          const CheckpointMetadata& metadata) {
  // A sharded optimizer state is gathered in-graph: a collective every replica takes part in.
  StateDict optim;
  const bool gather = optimizer != nullptr && optimizer->shard_world_size() != 0;
  if (optimizer != nullptr && (is_master() || gather))
    optim = to_state_dict(optimizer->named_state());
  if (is_master()) {
    std::vector<HostTensor> tensors;
    append(tensors, kModelPrefix, to_state_dict(model_state));
    if (optimizer != nullptr) append(tensors, kOptimizerPrefix, optim);
    save_checkpoint(path, tensors, metadata);
  }
  rendezvous("xm.save");
}

CheckpointMetadata load(const std::string& path, const NamedTensors& model_state,
                        Optimizer* optimizer) {
  const Checkpoint ckpt = load_checkpoint(path);
  check_prefixes(ckpt);
  try {
    // Validate both parts before changing anything.
    const StateDict model = take(ckpt, kModelPrefix);
    const StateDict optim = take(ckpt, kOptimizerPrefix);
    check_fits(model, model_state, kModelPrefix);
    if (optimizer != nullptr) check_fits(optim, optimizer->named_state(), kOptimizerPrefix);
    load_state_dict(model_state, model);
    // Optimizer::load_state converts f32 entries into bf16 state and back (loads_as).
    if (optimizer != nullptr) optimizer->load_state(to_tensors(optim));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("checkpoint {} does not fit the model: {}", path, e.what()));
  }
  return ckpt.metadata;
}

std::optional<CheckpointMetadata> load_if_exists(const std::string& path,
                                                 const NamedTensors& model_state,
                                                 Optimizer* optimizer) {
  if (!load_checkpoint_if_exists(path)) return std::nullopt;
  return load(path, model_state, optimizer);
}

}  // namespace xs::xm
