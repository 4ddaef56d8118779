#pragma once
// A 64-byte aligned, heap-allocated block of tensor storage. Shared by tensors and IR leaves
// through std::shared_ptr; its use count decides whether a graph may overwrite it in place
// (donation: an updated parameter reuses its old buffer).
// Freed blocks go to a size-keyed pool (like PyTorch's caching allocator) so a step's outputs
// reuse the pages of the previous step's instead of faulting fresh ones in; the pool holds at
// most XLA_SPAWN_BUFFER_POOL_BYTES (default 256 MiB) and never changes results.
//
//   auto buf = Buffer::allocate(n_elems * dtype_size(DType::kF32));
//   float* p = buf->as<float>();

#include <cstddef>
#include <cstdint>
#include <memory>

namespace xs {

class Buffer {
 public:
  static constexpr size_t kAlignment = 64;  // a cache line; also AVX-512 load alignment

  static std::shared_ptr<Buffer> allocate(size_t size_bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data_);
  }
  size_t size_bytes() const { return size_bytes_; }
  // Counts the runs that were allowed to overwrite this block in place (a donated input): IR
  // that captured an earlier version (runtime/node.h) no longer describes its contents.
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

  // Bytes currently cached in the pool, and a way to release them all.
  static size_t pooled_bytes();
  static void trim_pool();

 private:
  Buffer(void* data, size_t size_bytes) : data_(data), size_bytes_(size_bytes) {}
  void* data_;
  size_t size_bytes_;
  uint64_t version_ = 0;
};

using BufferPtr = std::shared_ptr<Buffer>;

}  // namespace xs
