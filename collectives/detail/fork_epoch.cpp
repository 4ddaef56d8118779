#include "xla_spawn/collectives/detail/fork_epoch.h"

#include <pthread.h>

#include <atomic>

namespace xs::detail {
namespace {

std::atomic<uint64_t> g_fork_epoch{0};

}  // namespace

uint64_t fork_epoch() {
  static const bool counting = [] {
    ::pthread_atfork(nullptr, nullptr, [] { g_fork_epoch.fetch_add(1, std::memory_order_relaxed); });
    return true;
  }();
  (void)counting;
  return g_fork_epoch.load(std::memory_order_relaxed);
}

}  // namespace xs::detail
