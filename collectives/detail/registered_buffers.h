#pragma once
// Heap memory registered with Communicator::register_buffer: the buffer's whole pages move
// into this ordinal's buffer arena at the same virtual addresses (shared pages now, same
// contents), so peers read and write it in place as they do alloc_buffer blocks and the
// collectives on it run zero-copy. Only the owning process registers; nothing is shared but
// the pages.
//
//   RegisteredBuffers registered(arena);
//   registered.add(grads.data(), bytes);                 // false: stays an ordinary operand
//   if (const Registration* r = registered.find(p, n)) {
//     registered.edges_in(*r, p, n);                     // before peers read the operand
//     ... peers use r->offset(p) in the arena ...
//     registered.edges_out(*r, p, n);                    // after they wrote it
//   }
//   registered.remove(grads.data());                     // private pages again, contents kept
//
// A buffer rarely starts and ends on a page boundary, and its partial first and last pages
// hold other objects: those pages stay private, and the buffer's bytes in them are mirrored
// into the arena block around a zero-copy call (edges_in, edges_out). The user promises what
// an MPI or NCCL registration asks: the memory stays allocated until remove(), and nothing
// writes it while add() or remove() runs.

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace xs {
class BufferArena;
}

namespace xs::detail {

struct Vma;  // a line of /proc/self/maps

struct Registration {
  std::byte* begin = nullptr;  // the buffer as registered
  size_t bytes = 0;
  std::byte* pages_begin = nullptr;     // the pages holding the buffer, [pages_begin, pages_end)
  std::byte* interior_begin = nullptr;  // the whole pages inside it: shared with the arena
  std::byte* interior_end = nullptr;
  std::byte* block = nullptr;  // the arena block standing for [pages_begin, pages_end)
  size_t block_offset = 0;     // the block's offset in the arena, what peers are told
  uint64_t file_offset = 0;    // where interior_begin maps in the segment's file

  // The arena offset and this process's arena view of buffer byte `p`.
  uint64_t offset(const void* p) const {
    return block_offset + static_cast<size_t>(static_cast<const std::byte*>(p) - pages_begin);
  }
  std::byte* view(const void* p) const {
    return block + (static_cast<const std::byte*>(p) - pages_begin);
  }
};

// Private pages holding a copy of [at, at + bytes) of a registered buffer, to be moved there.
struct PrivateCopy {
  std::byte* at = nullptr;
  size_t bytes = 0;
  void* copy = nullptr;
};

class RegisteredBuffers {
 public:
  // Whole pages a buffer must span to be registered: registering reads /proc/self/maps and
  // copies the pages, which a few small operands would not win back.
  static constexpr size_t kMinInteriorBytes = size_t{16} << 10;

  // A child forked while buffers are registered gets private copies of their pages, as it
  // would of any private memory, not the parent's shared pages: its writes stay its own, and
  // what it reads does not change under it. pthread_atfork handlers copy the pages in the
  // parent before the fork (a memcpy of every registered buffer per fork) and move the copies
  // into place in the child.
  explicit RegisteredBuffers(BufferArena& arena);
  // Every registration removed (contents kept); in a child forked meanwhile, none (the block
  // is still the parent's).
  ~RegisteredBuffers();
  RegisteredBuffers(const RegisteredBuffers&) = delete;
  RegisteredBuffers& operator=(const RegisteredBuffers&) = delete;

  // Moves [data, data + bytes) into the arena. True when registered (or already, with the same
  // bounds); false when it cannot be: fewer than kMinInteriorBytes of whole pages, memory that
  // is not private, anonymous and writable (a file mapping must keep its file), or an arena
  // too full or a /dev/shm too small to hold it. Throws xs::InvalidArgument when it overlaps
  // another registration, or in a forked child.
  bool add(void* data, size_t bytes);
  // Gives the buffer registered at `data` private pages again, contents and protection kept.
  // Throws xs::InvalidArgument when none starts there.
  void remove(void* data);

  // The registration holding all of [data, data + bytes), or nullptr. A registration whose
  // pages are no longer the block's (the buffer was freed and unmapped without
  // deregister_buffer, and the address mapped afresh) is dropped here rather than used:
  // checked by writing a byte of the operand through the block and reading it through the
  // buffer (alive()), no system call. In a forked child, nullptr.
  const Registration* find(const void* data, size_t bytes);
  // Copies the operand's bytes in the buffer's partial end pages into the arena block, and back.
  static void edges_in(const Registration& r, const void* data, size_t bytes);
  static void edges_out(const Registration& r, void* data, size_t bytes);

  // For the fork handlers: locks the set and appends copies of its registered pages as they
  // are now; end_fork() unlocks it (in the parent and in the child).
  void copy_all_before_fork(std::vector<PrivateCopy>& copies);
  void end_fork();


 private:
  void release(const Registration& r);
  // Private copies, with their bytes and protection, of every part of the interior that
  // still maps the block (`call` names the caller in errors).
  std::vector<PrivateCopy> copy_out(const Registration& r, const char* call) const;
  static bool alive(const Registration& r, const std::byte* probe);
  bool mapped(const Registration& r) const;
  bool maps_block(const Registration& r, const Vma& v, const std::byte* from) const;
  bool in_owner() const;

  BufferArena& arena_;
  uint64_t epoch_;              // forks before this process made it (fork_epoch())
  uint64_t segment_inode_ = 0;  // the segment file's, once a registration saw it
  std::atomic<size_t> count_{0};  // by_begin_.size(), read without the lock
  mutable std::mutex mutex_;
  std::map<const std::byte*, Registration> by_begin_;
};

}  // namespace xs::detail
