#pragma once
// Checkpoint files: named host tensors plus a metadata map (epoch, step, seed, ...), written
// atomically (temporary file, fsync, rename, fsync directory; mode 0600) and validated field
// by field on load, with errors that name the file, the tensor and the byte offsets.
// Layout (little-endian, version 1) is in replica/detail/checkpoint_format.h.
//
//   xs::save_checkpoint("/ckpt/last.xsckpt", {w1, b1}, {{"epoch", int64_t{3}}, {"model", "mlp"}});
//   xs::Checkpoint ckpt = xs::load_checkpoint("/ckpt/last.xsckpt");
//   const xs::HostTensor& w = ckpt.tensor("fc1.weight");   int64_t epoch = ckpt.meta_int("epoch");

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "xla_spawn/base/dtype.h"

namespace xs {

// A non-owning view of one tensor to save: its bytes are n_elems * dtype_size, row-major.
struct TensorRef {
  std::string_view name;
  DType dtype = DType::kF32;
  std::span<const int64_t> shape;
  std::span<const uint8_t> bytes;
};

// An owning host tensor (what load_checkpoint returns).
struct HostTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  int64_t n_elems() const;
  TensorRef ref() const { return TensorRef{name, dtype, shape, bytes}; }
};

using MetaValue = std::variant<int64_t, std::string>;
using CheckpointMetadata = std::map<std::string, MetaValue, std::less<>>;

struct Checkpoint {
  std::string source;               // the path it came from, for error messages
  std::vector<HostTensor> tensors;  // in the order they were saved
  CheckpointMetadata metadata;

  // Throw xs::InvalidArgument naming the file and what is missing or of the wrong kind.
  const HostTensor& tensor(std::string_view name) const;
  int64_t meta_int(std::string_view key) const;
  const std::string& meta_string(std::string_view key) const;
};

// Limits that keep a hostile file from making the loader allocate without bound.
inline constexpr size_t kMaxTensorNameBytes = 4096;
inline constexpr int kMaxTensorRank = 8;
inline constexpr size_t kMaxMetaStringBytes = size_t{1} << 20;

// Writes the checkpoint atomically; an existing file at `path` is replaced only when the new
// one is complete and on disk. Throws xs::InvalidArgument for bad tensors (duplicate or empty
// names, byte counts that do not match the shape) and xs::IoError when the OS refuses; in
// both cases the existing file is untouched and no temporary is left behind.
void save_checkpoint(const std::string& path, std::span<const TensorRef> tensors,
                     const CheckpointMetadata& metadata);
void save_checkpoint(const std::string& path, const std::vector<HostTensor>& tensors,
                     const CheckpointMetadata& metadata);

// Reads and validates: throws xs::IoError when the file cannot be read and
// xs::InvalidArgument naming the file and the fault when its contents are wrong.
Checkpoint load_checkpoint(const std::string& path);

// The read that resumes a run: load_checkpoint, or nullopt when `path` does not exist (a first
// run, nothing to resume). It also refuses (xs::InvalidArgument) a file of another user (root's
// excepted), one that group or others may write, and one reached through another user's
// symlink: resuming takes whatever the file holds as this run's own state, so another local
// user must not be able to plant, rewrite or swap it.
std::optional<Checkpoint> load_checkpoint_if_exists(const std::string& path);

// The checkpoint parser on bytes in memory (what the loader and the fuzz target call).
Checkpoint parse_checkpoint(std::span<const uint8_t> bytes, std::string_view source);

// The file image save_checkpoint writes, in memory (for tests and tools).
std::vector<uint8_t> serialize_checkpoint(std::span<const TensorRef> tensors,
                                          const CheckpointMetadata& metadata);

}  // namespace xs
