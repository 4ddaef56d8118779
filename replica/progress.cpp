#include "xla_spawn/replica/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "xla_spawn/replica/xm.h"

namespace xs::xm {
namespace {

std::string format_seconds(double s) {
  const auto total = static_cast<int64_t>(s + 0.5);
  return fmt::format("{}:{:02d}", total / 60, total % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total_steps, int64_t samples_per_step,
                         int64_t first_step)
    : label_(std::move(label)),
      total_steps_(std::max<int64_t>(total_steps, 1)),
      samples_per_step_(samples_per_step),
      first_step_(first_step),
      done_(first_step),
      active_(is_master()),
      tty_(isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  finish();
}

double ProgressBar::samples_per_second() const {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return s > 0 ? static_cast<double>((done_ - first_step_) * samples_per_step_) / s : 0;
}

std::string ProgressBar::line(int64_t done, double loss) const {
  const double rate = samples_per_second();
  const double eta_s =
      rate > 0 ? static_cast<double>((total_steps_ - done) * samples_per_step_) / rate : 0;
  constexpr int kWidth = 30;  // bar characters
  const auto filled = static_cast<int>(kWidth * done / total_steps_);
  return fmt::format("{} [{:=<{}}{:<{}}] {}/{} loss {:.4f} {:.0f} samples/s ETA {}", label_, "",
                     filled, "", kWidth - filled, done, total_steps_, loss, rate,
                     format_seconds(eta_s));
}

void ProgressBar::update(int64_t done, double loss) {
  done_ = done;
  if (!active_) return;
  if (tty_) {
    // At most 10 redraws a second: a fast step loop must not spend its time on the terminal.
    const auto now = std::chrono::steady_clock::now();
    if (done < total_steps_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    fmt::print(stderr, "\r{}\x1b[K", line(done, loss));  // ESC[K: clear what a longer line left
    std::fflush(stderr);
    return;
  }
  // A plain line at each tenth of the epoch and at its end.
  const int64_t tenth = std::max<int64_t>(total_steps_ / 10, 1);
  if (done == total_steps_ || done / tenth != last_printed_ / tenth) {
    fmt::print(stderr, "{}\n", line(done, loss));
    std::fflush(stderr);
    last_printed_ = done;
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (active_ && tty_) fmt::print(stderr, "\n");
}

}  // namespace xs::xm
