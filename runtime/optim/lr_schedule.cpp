#include "xla_spawn/runtime/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"

namespace xs {

LrFactor step_decay(int64_t step_size, double gamma) {
  if (step_size <= 0)
    throw InvalidArgument(fmt::format("step_decay: step_size {} must be > 0", step_size));
  return [=](int64_t step) { return std::pow(gamma, static_cast<double>(step / step_size)); };
}

LrFactor cosine_decay(int64_t total_steps, double min_factor) {
  if (total_steps <= 0)
    throw InvalidArgument(fmt::format("cosine_decay: total_steps {} must be > 0", total_steps));
  return [=](int64_t step) {
    const double frac =
        static_cast<double>(std::min(step, total_steps)) / static_cast<double>(total_steps);
    return min_factor + (1 - min_factor) * (1 + std::cos(std::numbers::pi * frac)) / 2;
  };
}

LrFactor warmup(int64_t warmup_steps, LrFactor after) {
  if (warmup_steps < 0)
    throw InvalidArgument(fmt::format("warmup: warmup_steps {} must be >= 0", warmup_steps));
  return [=](int64_t step) {
    if (step < warmup_steps)
      return static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
    return after ? after(step - warmup_steps) : 1.0;
  };
}

LrScheduler::LrScheduler(Optimizer& optimizer, LrFactor factor)
    : optimizer_(optimizer), factor_(std::move(factor)), base_lr_(optimizer.lr()) {
  if (!factor_) throw InvalidArgument("LrScheduler: no schedule");
  optimizer_.set_lr(base_lr_ * factor_(0));
}

void LrScheduler::step() {
  optimizer_.set_lr(base_lr_ * factor_(++step_));
}

}  // namespace xs
