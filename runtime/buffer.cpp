#include "runtime/buffer.h"

#include <cstdlib>
#include <new>

#include <fmt/format.h>

#include "base/error.h"

namespace xs {

std::shared_ptr<Buffer> Buffer::allocate(size_t size_bytes) {
  // aligned_alloc needs a size that is a multiple of the alignment; 0 bytes still gets a
  // valid, distinct pointer so empty tensors need no special case.
  const size_t rounded = (size_bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (p == nullptr) {
    throw Error(fmt::format("Buffer::allocate: out of memory for {} bytes", size_bytes));
  }
  return std::shared_ptr<Buffer>(new Buffer(p, size_bytes));
}

Buffer::~Buffer() { std::free(data_); }

}  // namespace xs
