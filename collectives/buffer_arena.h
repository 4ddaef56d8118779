#pragma once
// The allocator of one ordinal's buffer arena in the job segment (Communicator::alloc_buffer):
// operands placed here can be read and written in place by peers, so all_reduce skips the
// staging copies. Only the owning process allocates in its arena; the bookkeeping is private.
//
//   BufferArena arena(segment.arena(me), segment.arena_bytes());
//   void* p = arena.allocate(bytes);      // nullptr when it does not fit
//   arena.contains(p, bytes);             // true;  arena.offset(p) is what peers are told
//   arena.deallocate(p);

#include <cstddef>
#include <map>
#include <mutex>

namespace xs {

class BufferArena {
 public:
  // Blocks are aligned to (and sized in multiples of) kAlignBytes: operands then never share
  // a page or a cache line with another block.
  static constexpr size_t kAlignBytes = 4096;

  BufferArena(std::byte* base, size_t bytes);

  // First fit; nullptr when no free range holds `bytes` (0 bytes still get a block).
  void* allocate(size_t bytes);
  // Returns a block from allocate(); throws xs::InvalidArgument for anything else.
  void deallocate(void* block);

  bool contains(const void* data, size_t bytes) const;
  size_t offset(const void* data) const;
  size_t capacity_bytes() const { return bytes_; }
  size_t free_bytes() const;

 private:
  std::byte* base_;
  size_t bytes_;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
};

// The arena is sparse: /dev/shm backs its pages only when first written, and a full /dev/shm
// then raises SIGBUS in whichever process touches the page. So a block's pages are backed
// before it is handed out (MADV_POPULATE_WRITE, Linux 5.14): false when /dev/shm cannot back
// them, after giving back what was backed. On an older kernel (EINVAL) nothing is checked.
bool populate_arena_pages(void* block, size_t bytes);

}  // namespace xs
