#include "xla_spawn/collectives/buffer_arena.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/shm/layout.h"

namespace xs {

BufferArena::BufferArena(std::byte* base, size_t bytes)
    : base_(base), bytes_(bytes / kAlignBytes * kAlignBytes) {
  if (bytes_ != 0) free_.emplace(0, bytes_);
}

void* BufferArena::allocate(size_t bytes) {
  if (bytes > bytes_) return nullptr;  // also keeps the rounding below from wrapping to 0
  const size_t want = shm::round_up(bytes == 0 ? 1 : bytes, kAlignBytes);
  std::lock_guard lock(mutex_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const size_t offset = it->first;
    const size_t rest = it->second - want;
    free_.erase(it);
    if (rest != 0) free_.emplace(offset + want, rest);
    used_.emplace(offset, want);
    return base_ + offset;
  }
  return nullptr;
}

void BufferArena::deallocate(void* block) {
  std::lock_guard lock(mutex_);
  const auto* p = static_cast<const std::byte*>(block);
  const auto used =
      p >= base_ && p < base_ + bytes_ ? used_.find(static_cast<size_t>(p - base_)) : used_.end();
  if (used == used_.end()) {
    throw InvalidArgument(fmt::format("free_buffer: {} is not a live block of this arena",
                                      static_cast<const void*>(block)));
  }
  size_t offset = used->first;
  size_t bytes = used->second;
  used_.erase(used);
  // Coalesce with the free neighbours on both sides.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first == offset + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(offset, bytes);
}

bool BufferArena::contains(const void* data, size_t bytes) const {
  const auto* p = static_cast<const std::byte*>(data);
  if (bytes_ == 0 || p == nullptr) return false;
  return p >= base_ && p <= base_ + bytes_ && bytes <= static_cast<size_t>(base_ + bytes_ - p);
}

size_t BufferArena::offset(const void* data) const {
  return static_cast<size_t>(static_cast<const std::byte*>(data) - base_);
}

bool populate_arena_pages(void* block, size_t bytes) {
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, absent from older headers
  const size_t span = shm::round_up(std::max<size_t>(bytes, 1), BufferArena::kAlignBytes);
  if (::madvise(block, span, kPopulateWrite) == 0) return true;
  if (errno == EINVAL) return true;
  ::madvise(block, span, MADV_REMOVE);  // give back the pages it did back, for other blocks
  return false;
}

size_t BufferArena::free_bytes() const {
  std::lock_guard lock(mutex_);
  size_t total = 0;
  for (const auto& [offset, bytes] : free_) total += bytes;
  return total;
}

}  // namespace xs
