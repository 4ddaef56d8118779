#include "xla_spawn/runtime/buffer.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"

namespace xs {
namespace {

// Size class: 64-byte multiples below 4 KiB, whole pages above, so steady-state steps
// (same shapes every time) always hit an exact class.
size_t size_class(size_t size_bytes) {
  const size_t unit = size_bytes < 4096 ? Buffer::kAlignment : 4096;
  const size_t rounded = (size_bytes + unit - 1) / unit * unit;
  return rounded == 0 ? Buffer::kAlignment : rounded;
}

class Pool {
 public:
  Pool() : capacity_(static_cast<size_t>(env_int("XLA_SPAWN_BUFFER_POOL_BYTES", 0, int64_t{1} << 40)
                                             .value_or(int64_t{256} << 20))) {}
  ~Pool() { trim(); }

  void* take(size_t cls) {
    std::lock_guard lock(mu_);
    auto it = free_.find(cls);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* p = it->second.back();
    it->second.pop_back();
    bytes_ -= cls;
    return p;
  }

  void give(void* p, size_t cls) {
    {
      std::lock_guard lock(mu_);
      if (bytes_ + cls <= capacity_) {
        free_[cls].push_back(p);
        bytes_ += cls;
        return;
      }
    }
    std::free(p);
  }

  void trim() {
    std::lock_guard lock(mu_);
    for (auto& [cls, ptrs] : free_)
      for (void* p : ptrs) std::free(p);
    free_.clear();
    bytes_ = 0;
  }

  size_t bytes() {
    std::lock_guard lock(mu_);
    return bytes_;
  }

 private:
  std::mutex mu_;  // buffers may be released from any thread holding the last reference
  size_t capacity_;
  size_t bytes_ = 0;
  std::map<size_t, std::vector<void*>> free_;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: buffers may outlive static destruction
  return *p;
}

}  // namespace

std::shared_ptr<Buffer> Buffer::allocate(size_t size_bytes) {
  const size_t cls = size_class(size_bytes);
  void* p = pool().take(cls);
  if (p == nullptr) p = std::aligned_alloc(kAlignment, cls);
  if (p == nullptr) {
    throw Error(fmt::format("Buffer::allocate: out of memory for {} bytes", size_bytes));
  }
  return std::shared_ptr<Buffer>(new Buffer(p, size_bytes));
}

Buffer::~Buffer() { pool().give(data_, size_class(size_bytes_)); }

size_t Buffer::pooled_bytes() { return pool().bytes(); }
void Buffer::trim_pool() { pool().trim(); }

}  // namespace xs
