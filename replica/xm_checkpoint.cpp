#include "xla_spawn/replica/xm_checkpoint.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

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

namespace {

// The file `path` names as far as it can tell: symlinks and ".." resolved in the part that
// exists, the rest as written; (device, inode) when it exists, for hard links; and its
// directory's (device, inode) with its name, which is what a rename over it targets, for a
// file not made yet in a directory with two names (a bind mount).
struct FileIdentity {
  std::string resolved;
  std::optional<std::pair<dev_t, ino_t>> inode;
  std::optional<std::tuple<dev_t, ino_t, std::string>> entry;

  explicit FileIdentity(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code error;
    const fs::path canonical = fs::weakly_canonical(path, error);
    resolved = error ? fs::absolute(path, error).lexically_normal().string() : canonical.string();
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) inode = std::pair(st.st_dev, st.st_ino);
    const fs::path given(path);
    const std::string dir = given.has_parent_path() ? given.parent_path().string() : ".";
    if (::stat(dir.c_str(), &st) == 0) entry = std::tuple(st.st_dev, st.st_ino, given.filename().string());
  }
  bool operator==(const FileIdentity& other) const {
    return resolved == other.resolved || (inode && inode == other.inode) || (entry && entry == other.entry);
  }
};

}  // namespace

void check_outputs(std::initializer_list<OutputFile> files) {
  if (!is_master()) return;
  std::vector<std::pair<OutputFile, FileIdentity>> seen;
  if (const char* trace = std::getenv("XLA_SPAWN_TRACE"); trace != nullptr && *trace != '\0') {
    seen.emplace_back(OutputFile{"the job's trace (XLA_SPAWN_TRACE)", trace}, FileIdentity(trace));
  }
  for (const OutputFile& file : files) {
    if (file.path.empty()) continue;
    if (file.may_be_stream && detail::names_a_stream(file.path, file.name)) continue;
    const FileIdentity identity(file.path);
    for (const auto& [other, other_identity] : seen) {
      if (identity == other_identity) {
        throw InvalidArgument(fmt::format(
            "{} {} and {} {} are the same file: the one written last would replace the other",
            file.name, file.path, other.name, other.path));
      }
    }
    detail::AtomicFileWriter probe(file.path, file.name);  // removed uncommitted
    seen.emplace_back(file, identity);
  }
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

namespace {

// Loads `ckpt` (read from `path`) into the model and the optimizer.
CheckpointMetadata apply(const Checkpoint& ckpt, const std::string& path,
                         const NamedTensors& model_state, Optimizer* optimizer) {
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

}  // namespace

CheckpointMetadata load(const std::string& path, const NamedTensors& model_state,
                        Optimizer* optimizer) {
  return apply(load_checkpoint(path), path, model_state, optimizer);
}

CheckpointMetadata load(const Checkpoint& checkpoint, const NamedTensors& model_state,
                        Optimizer* optimizer) {
  return apply(checkpoint, checkpoint.source, model_state, optimizer);
}

std::optional<CheckpointMetadata> load_if_exists(const std::string& path,
                                                 const NamedTensors& model_state,
                                                 Optimizer* optimizer) {
  const std::optional<Checkpoint> found = load_checkpoint_if_exists(path);
  if (!found) return std::nullopt;
  return apply(*found, path, model_state, optimizer);
}

}  // namespace xs::xm
