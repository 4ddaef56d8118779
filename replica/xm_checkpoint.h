#pragma once
// xm.save / load for training state: the model's parameters and buffers ("model.<name>"), the
// optimizer's state ("optim.<name>") and metadata (epoch, batch, ...) in one checkpoint file
// (replica/checkpoint.h: atomic write, validated read). Saving is collective: the master
// writes, the others wait, so no replica runs ahead of a checkpoint that is not on disk. A
// sharded optimizer state (optimizer_step.h) is all-gathered by every replica first.
//
//   xs::xm::save(path, model.named_state(), &opt, {{"epoch", epoch}, {"batch", 0}});
//   if (auto meta = xs::xm::load_if_exists(path, model.named_state(), &opt)) resume(*meta);

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "xla_spawn/replica/checkpoint.h"
#include "xla_spawn/runtime/nn/module.h"
#include "xla_spawn/runtime/optim/optimizer.h"

namespace xs::xm {

// Collective; the master writes `path` atomically (the previous file stays intact on failure).
void save(const std::string& path, const NamedTensors& model_state, const Optimizer* optimizer,
          const CheckpointMetadata& metadata);

// On the master, creates and removes the temporary file a save of `path` would write: throws
// xs::IoError (naming the path and the reason) when its directory is missing or not writable,
// so that a run finds out before it trains, not at its first save. Not collective.
void check_can_save(const std::string& path);

// A file a program writes along the way or at its end (its checkpoint, a CSV), for
// check_outputs. An empty path is a file not asked for.
struct OutputFile {
  std::string_view name;  // how the user gave it, for errors: "--checkpoint"
  std::string path;
  bool may_be_stream = false;  // /dev/stdout or a FIFO is fine (detail::names_a_stream)
};
// On the master, before the first step: each file can be written (as check_can_save; none
// names a directory), and no two of them, nor one of them and the job's trace (the
// XLA_SPAWN_TRACE the launcher merges into), are the same file, where the last one written
// would silently replace the other (xs::InvalidArgument naming both). An output that may be a
// stream and is one is only checked not to be reached through another user's symlink. Not
// collective.
void check_outputs(std::initializer_list<OutputFile> files);

// Loads into the model (and optimizer, if given) and returns the metadata. Throws
// xs::InvalidArgument naming the file and the entry when the file is damaged or does not fit
// the model (a missing, extra or differently shaped tensor); nothing is changed then.
CheckpointMetadata load(const std::string& path, const NamedTensors& model_state,
                        Optimizer* optimizer);
// load() of a checkpoint already read (load_checkpoint_if_exists), once its metadata has been
// checked.
CheckpointMetadata load(const Checkpoint& checkpoint, const NamedTensors& model_state,
                        Optimizer* optimizer);
// load(), or nullopt when `path` does not exist.
std::optional<CheckpointMetadata> load_if_exists(const std::string& path,
                                                 const NamedTensors& model_state,
                                                 Optimizer* optimizer);

}  // namespace xs::xm
