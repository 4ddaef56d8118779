#pragma once
// Command-line options of train_fmnist, parsed with Boost.Program_options and validated where
// they enter: a bad value is an xs::InvalidArgument naming the flag and what it expects.
//
//   const TrainOptions opt = parse_train_options(argc, argv);   // nullopt-like: opt.help

#include <cstdint>
#include <string>

namespace xs::fmnist {

inline constexpr const char* kPrecisionEnv = "XLA_SPAWN_PRECISION";

struct TrainOptions {
  std::string model = "mlp";  // mlp | cnn
  int64_t epochs = 10;
  int64_t batch_size = 32;         // per replica
  std::string optimizer = "adam";  // sgd | adam | adamw
  double lr = 1e-3;
  double momentum = 0.9;  // sgd only
  double weight_decay = 0;
  std::string schedule = "cosine";  // cosine | constant
  std::string precision;             // f32 | bf16 (autocast); "" = $XLA_SPAWN_PRECISION or f32
  uint64_t seed = 0;
  std::string checkpoint;        // "" = no checkpoints
  int64_t checkpoint_every = 0;  // steps between mid-epoch checkpoints (0: epoch ends only)
  bool resume = false;
  std::string data_dir;  // "" = $XLA_SPAWN_DATA_DIR or the Debian package's
  bool metrics = false;
  int64_t max_steps = 0;      // 0 = no limit
  int64_t train_samples = 0;  // 0 = all (a prefix of the training set, for tests)
  int64_t test_samples = 0;   // 0 = all
  bool eval = true;
  std::string step_timing_csv;
  int64_t fail_at_step = 0;  // fault injection for tests: SIGKILL at this step, attempt 0
  bool help = false;
  std::string usage;  // filled when help is set
};

TrainOptions parse_train_options(int argc, const char* const* argv);

}  // namespace xs::fmnist
