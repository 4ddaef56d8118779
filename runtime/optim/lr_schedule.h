#pragma once
// Learning-rate schedules: a factor of the base rate per step, applied by LrScheduler through
// Optimizer::set_lr (a data scalar, so a changing rate never recompiles).
//
//   LrScheduler sched(opt, warmup(100, cosine_decay(10000)));
//   for (...) { ...; opt.step(); sched.step(); mark_step(); }

#include <cstdint>
#include <functional>

#include "xla_spawn/runtime/optim/optimizer.h"

namespace xs {

// factor(step), step counting from 0 (before the first scheduler step).
using LrFactor = std::function<double(int64_t step)>;

// gamma^(step / step_size) (PyTorch StepLR).
LrFactor step_decay(int64_t step_size, double gamma);
// min_factor + (1 - min_factor) * (1 + cos(pi * min(step, total) / total)) / 2 (CosineAnnealingLR).
LrFactor cosine_decay(int64_t total_steps, double min_factor = 0);
// Linear ramp from 1/(warmup+1) to 1 over `warmup_steps`, then `after` (counted from the end of
// the warm-up); `after` defaults to constant 1.
LrFactor warmup(int64_t warmup_steps, LrFactor after = {});

class LrScheduler {
 public:
  // Sets the optimizer's rate to base * factor(0) now; base is its current rate.
  LrScheduler(Optimizer& optimizer, LrFactor factor);
  // Advances one step and sets base * factor(step).
  void step();
  int64_t current_step() const { return step_; }

 private:
  Optimizer& optimizer_;
  LrFactor factor_;
  double base_lr_;
  int64_t step_ = 0;
};

}  // namespace xs
