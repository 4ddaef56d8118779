#pragma once
// Training progress on the master only: a one-line bar redrawn in place (samples/s, loss,
// ETA) when stderr is a terminal, else a plain line every tenth of the epoch (so a log or
// xla-spawn's piped output gets a few lines, not thousands). Other ordinals print nothing.
//
//   xs::xm::ProgressBar bar("epoch 3/10", steps_per_epoch, global_batch);
//   for (...) { ...; bar.update(step + 1, loss); }
//   bar.finish();

#include <chrono>
#include <cstdint>
#include <string>

namespace xs::xm {

class ProgressBar {
 public:
  // `samples_per_step`: the global batch, for samples/s. Inactive off the master.
  ProgressBar(std::string label, int64_t total_steps, int64_t samples_per_step,
              int64_t first_step = 0);
  // `done`: steps completed so far in this epoch (first_step + steps run here).
  void update(int64_t done, double loss);
  // Ends the bar (a newline on a terminal). Called by the destructor if not before.
  void finish();
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  double samples_per_second() const;

 private:
  std::string line(int64_t done, double loss) const;

  std::string label_;
  int64_t total_steps_, samples_per_step_, first_step_;
  int64_t done_ = 0;
  bool active_, tty_, finished_ = false;
  int64_t last_printed_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace xs::xm
