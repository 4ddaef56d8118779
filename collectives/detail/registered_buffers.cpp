#include "xla_spawn/collectives/detail/registered_buffers.h"

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/buffer_arena.h"
#include "xla_spawn/collectives/detail/fork_epoch.h"

namespace xs::detail {

// One mapping of /proc/self/maps (or /proc/self/smaps, with its VmFlags).
struct Vma {
  std::byte* begin = nullptr;
  std::byte* end = nullptr;
  std::string perms;  // "rw-p", "r--s", ...
  uint64_t offset = 0;
  uint64_t inode = 0;
  std::string path;
  std::string vm_flags;  // smaps only: " rd wr mr mw me ac sd"

  int protection() const {
    return (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
           (perms[2] == 'x' ? PROT_EXEC : 0);
  }
  bool has_flag(std::string_view flag) const {
    return vm_flags.find(fmt::format(" {}", flag)) != std::string::npos;
  }
};

namespace {

constexpr uintptr_t kPageBytes = BufferArena::kAlignBytes;

std::byte* page_down(const void* p) {
  return reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(p) & ~(kPageBytes - 1));
}
std::byte* page_up(const void* p) {
  return page_down(static_cast<const std::byte*>(p) + kPageBytes - 1);
}

// The mappings that overlap [begin, end), in order; from smaps when `with_flags`.
std::vector<Vma> mappings_over(const std::byte* begin, const std::byte* end, bool with_flags) {
  std::ifstream maps(with_flags ? "/proc/self/smaps" : "/proc/self/maps");
  std::vector<Vma> found;
  std::string line;
  while (std::getline(maps, line)) {
    if (!found.empty() && line.starts_with("VmFlags:")) {
      found.back().vm_flags = line.substr(8);
      continue;
    }
    unsigned long from = 0, to = 0, offset = 0, inode = 0;
    char perms[5] = {};
    char device[16] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %4s %lx %15s %lu %n", &from, &to, perms, &offset,
                    device, &inode, &path_at) < 6) {
      continue;  // an smaps field line
    }
    auto* vma_begin = reinterpret_cast<std::byte*>(from);
    auto* vma_end = reinterpret_cast<std::byte*>(to);
    if (vma_begin >= end) break;
    if (vma_end <= begin) continue;
    const std::string path = path_at > 0 && static_cast<size_t>(path_at) <= line.size()
                                 ? line.substr(static_cast<size_t>(path_at))
                                 : std::string();
    found.push_back({vma_begin, vma_end, perms, offset, inode, path, {}});
  }
  return found;
}

// Private, anonymous (the heap, or a mapping with no file), readable and writable, and with no
// attribute the swap would drop: the only memory whose pages may become shared ones unnoticed.
// A file mapping would stop writing its file, read-only memory would become writable, a stack
// would lose its pages' lifetime; mlock (lo), MADV_DONTFORK (dc), MADV_WIPEONFORK (wf) and
// userfaultfd (um, uw) belong to the private pages and would not carry over.
bool private_anonymous(const std::byte* begin, const std::byte* end) {
  const std::byte* covered = begin;
  for (const Vma& v : mappings_over(begin, end, true)) {
    if (v.begin > covered) return false;  // a hole
    const bool anonymous =
        v.inode == 0 && (v.path.empty() || v.path == "[heap]" || v.path.starts_with("[anon:"));
    if (!anonymous || v.perms != "rw-p") return false;
    for (const char* flag : {"lo", "dc", "wf", "um", "uw"}) {
      if (v.has_flag(flag)) return false;
    }
    covered = v.end;
  }
  return covered >= end;
}

// Every RegisteredBuffers of the process, for the fork handler.
std::mutex g_instances_mutex;
// Never destroyed: a communicator held by a static made before it outlives static destruction.
std::set<RegisteredBuffers*>& instances() {
  static auto* all = new std::set<RegisteredBuffers*>;
  return *all;
}

// The copies made for the fork under way (under g_instances_mutex, held across it).
std::vector<PrivateCopy> g_fork_copies;

// Moves each copy over its place (one mremap each, so the range is never unmapped); returns
// the bytes moved. A copy that cannot move is unmapped.
size_t move_in(const std::vector<PrivateCopy>& copies, const char* call) {
  size_t moved = 0;
  std::string failed;
  for (const PrivateCopy& c : copies) {
    if (::mremap(c.copy, c.bytes, c.bytes, MREMAP_MAYMOVE | MREMAP_FIXED, c.at) == c.at) {
      moved += c.bytes;
    } else {
      failed = fmt::format("{}: cannot move private pages onto {}: {}", call, static_cast<void*>(c.at),
                           std::strerror(errno));
      ::munmap(c.copy, c.bytes);
    }
  }
  if (!failed.empty()) throw IoError(failed);
  return moved;
}

void before_fork() {
  g_instances_mutex.lock();
  for (RegisteredBuffers* set : instances()) set->copy_all_before_fork(g_fork_copies);
}

void after_fork(bool in_child) {
  if (in_child) {
    try {
      move_in(g_fork_copies, "fork");
    } catch (const std::exception& e) {
      spdlog::error("in a forked child, registered buffers still share the parent's pages: {}", e.what());
    }
  } else {
    for (const PrivateCopy& c : g_fork_copies) ::munmap(c.copy, c.bytes);
  }
  g_fork_copies.clear();
  for (RegisteredBuffers* set : instances()) set->end_fork();
  g_instances_mutex.unlock();
}

}  // namespace

RegisteredBuffers::RegisteredBuffers(BufferArena& arena) : arena_(arena), epoch_(fork_epoch()) {
  static const bool handler = [] {
    ::pthread_atfork(before_fork, [] { after_fork(false); }, [] { after_fork(true); });
    return true;
  }();
  (void)handler;
  std::lock_guard lock(g_instances_mutex);
  instances().insert(this);
}

bool RegisteredBuffers::in_owner() const {
  return fork_epoch() == epoch_;
}

// In a child forked while buffers were registered, nothing is released: the pages and the
// block belong to the parent, which still uses them.
RegisteredBuffers::~RegisteredBuffers() {
  {
    std::lock_guard lock(g_instances_mutex);
    instances().erase(this);
  }
  if (in_owner()) {
    std::lock_guard lock(mutex_);
    for (auto& [begin, r] : by_begin_) {
      try {
        release(r);
      } catch (const std::exception& e) {
        spdlog::error("registered buffer at {}: {}", static_cast<const void*>(begin), e.what());
      }
    }
  }
}

// Whether the buffer's byte at `probe` (an interior byte) is still the block's: written through
// the block, it must read back through the buffer. Two different values, so that stale memory
// cannot match both by chance; then the byte is put back. No system call: a few loads and
// stores. Called inside a collective (the operand is the call's) or under the registration
// lock before one; peers touch the operand only after it is published.
bool RegisteredBuffers::alive(const Registration& r, const std::byte* probe) {
  auto* through_block = reinterpret_cast<volatile unsigned char*>(r.view(probe));
  const auto* through_buffer = reinterpret_cast<const volatile unsigned char*>(probe);
  const unsigned char kept = *through_block;
  bool same = true;
  for (const unsigned char flip : {0xffu, 0x0fu}) {
    *through_block = static_cast<unsigned char>(kept ^ flip);
    same = same && *through_buffer == static_cast<unsigned char>(kept ^ flip);
  }
  *through_block = kept;
  return same;
}

bool RegisteredBuffers::add(void* data, size_t bytes) {
  auto* begin = static_cast<std::byte*>(data);
  XS_CHECK_ARG(data != nullptr || bytes == 0, "register_buffer: null buffer of {} bytes", bytes);
  XS_CHECK_ARG(in_owner(),
               "register_buffer: this process was forked from the one that owns the communicator");
  Registration r{begin, bytes, page_down(begin), page_up(begin), page_down(begin + bytes)};
  if (r.interior_end <= r.interior_begin ||
      static_cast<size_t>(r.interior_end - r.interior_begin) < kMinInteriorBytes) {
    return false;
  }
  std::lock_guard lock(mutex_);
  // Registrations are disjoint. Any this one overlaps whose buffer was freed and unmapped
  // without deregister_buffer (the memory now reused) are dropped first.
  for (auto it = by_begin_.lower_bound(r.pages_begin - kPageBytes);
       it != by_begin_.end() && it->first < begin + bytes;) {
    const bool overlaps = it->first + it->second.bytes > begin;
    if (overlaps && !mapped(it->second)) {
      release(it->second);
      it = by_begin_.erase(it);
    } else {
      ++it;
    }
  }
  // The one starting last at or before `begin`, and the first after.
  auto after = by_begin_.upper_bound(begin);
  if (after != by_begin_.begin()) {
    const Registration& before = std::prev(after)->second;
    if (before.begin == begin && before.bytes == bytes) return true;
    XS_CHECK_ARG(before.begin + before.bytes <= begin,
                 "register_buffer: [{}, +{}) overlaps the registered buffer [{}, +{})", data, bytes,
                 static_cast<const void*>(before.begin), before.bytes);
  }
  XS_CHECK_ARG(after == by_begin_.end() || begin + bytes <= after->first,
               "register_buffer: [{}, +{}) overlaps the registered buffer [{}, +{})", data, bytes,
               static_cast<const void*>(after->first), after->second.bytes);
  if (!private_anonymous(r.interior_begin, r.interior_end)) return false;
  const size_t block_bytes = static_cast<size_t>(page_up(begin + bytes) - r.pages_begin);
  r.block = static_cast<std::byte*>(arena_.allocate(block_bytes));
  if (r.block == nullptr) return false;
  if (!populate_arena_pages(r.block, block_bytes)) {
    arena_.deallocate(r.block);
    return false;
  }
  r.block_offset = arena_.offset(r.block);
  const std::vector<Vma> arena_map = mappings_over(r.block, r.block + 1, false);
  if (arena_map.size() != 1 || arena_map[0].perms != "rw-s") {
    arena_.deallocate(r.block);
    return false;
  }
  segment_inode_ = arena_map[0].inode;
  r.file_offset = arena_map[0].offset + static_cast<uint64_t>(r.view(r.interior_begin) - arena_map[0].begin);
  // Copy the contents, then map the block's pages over the buffer's: an mremap of length 0
  // duplicates a shared mapping, and MREMAP_FIXED replaces the private pages in one step.
  const size_t interior_bytes = static_cast<size_t>(r.interior_end - r.interior_begin);
  std::byte* shared = r.view(r.interior_begin);
  std::memcpy(shared, r.interior_begin, interior_bytes);
  void* moved = ::mremap(shared, 0, interior_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, r.interior_begin);
  if (moved != r.interior_begin) {
    const int error = errno;
    // A kernel may have unmapped the destination before failing: then the contents, which
    // are in the block, go back into fresh private pages.
    void* hole = ::mmap(r.interior_begin, interior_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (hole == r.interior_begin) std::memcpy(r.interior_begin, shared, interior_bytes);
    spdlog::debug("register_buffer: mremap onto {}: {}", static_cast<void*>(r.interior_begin),
                  std::strerror(error));
    ::madvise(r.block, block_bytes, MADV_REMOVE);
    arena_.deallocate(r.block);
    return false;
  }
  by_begin_.emplace(begin, r);
  count_.store(by_begin_.size(), std::memory_order_relaxed);
  return true;
}

void RegisteredBuffers::remove(void* data) {
  std::lock_guard lock(mutex_);
  const auto it = by_begin_.find(static_cast<const std::byte*>(data));
  XS_CHECK_ARG(it != by_begin_.end(), "deregister_buffer: no buffer is registered at {}", data);
  XS_CHECK_ARG(in_owner(),
               "deregister_buffer: this process was forked from the one that owns the communicator");
  release(it->second);
  by_begin_.erase(it);
  count_.store(by_begin_.size(), std::memory_order_relaxed);
}

// Every part of the interior that still maps the block (the whole of it, unless the owner
// unmapped or replaced parts) gets private pages again: a copy of the block's bytes, with the
// protection the part had, moved over it in one mremap (the range is never unmapped). Only
// then, when nothing of this process maps the block any more, are its pages given back.
// Whether the part [from, ...) of mapping `v` maps the registration's block at the right place.
bool RegisteredBuffers::maps_block(const Registration& r, const Vma& v, const std::byte* from) const {
  const uint64_t want = r.file_offset + static_cast<uint64_t>(from - r.interior_begin);
  return v.perms[3] == 's' && v.inode == segment_inode_ &&
         v.offset + static_cast<uint64_t>(from - v.begin) == want;
}

// Whether all of the interior still maps the block, by /proc/self/maps (slow: registering).
bool RegisteredBuffers::mapped(const Registration& r) const {
  const std::byte* covered = r.interior_begin;
  for (const Vma& v : mappings_over(r.interior_begin, r.interior_end, false)) {
    if (v.begin > covered || !maps_block(r, v, std::max(v.begin, r.interior_begin))) return false;
    covered = v.end;
  }
  return covered >= r.interior_end;
}

std::vector<PrivateCopy> RegisteredBuffers::copy_out(const Registration& r, const char* call) const {
  std::vector<PrivateCopy> copies;
  for (const Vma& v : mappings_over(r.interior_begin, r.interior_end, false)) {
    std::byte* from = std::max(v.begin, r.interior_begin);
    std::byte* to = std::min(v.end, r.interior_end);
    if (!maps_block(r, v, from)) continue;
    const size_t n = static_cast<size_t>(to - from);
    void* fresh = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) {
      for (const PrivateCopy& c : copies) ::munmap(c.copy, c.bytes);
      throw IoError(fmt::format("{}: cannot map {} bytes: {}", call, n, std::strerror(errno)));
    }
    std::memcpy(fresh, r.view(from), n);
    if (v.protection() != (PROT_READ | PROT_WRITE)) ::mprotect(fresh, n, v.protection());
    copies.push_back({from, n, fresh});
  }
  return copies;
}

void RegisteredBuffers::release(const Registration& r) {
  const size_t block_bytes = static_cast<size_t>(page_up(r.begin + r.bytes) - r.pages_begin);
  if (move_in(copy_out(r, "deregister_buffer"), "deregister_buffer") <
      static_cast<size_t>(r.interior_end - r.interior_begin)) {
    spdlog::warn("the buffer registered at {} ({} bytes) was unmapped before deregister_buffer",
                 static_cast<const void*>(r.begin), r.bytes);
  }
  ::madvise(r.block, block_bytes, MADV_REMOVE);
  arena_.deallocate(r.block);
}

// Before a fork, in the parent: the private copies the child will take, made while every
// set's lock is held (so no registration changes), kept until the fork is over.
void RegisteredBuffers::copy_all_before_fork(std::vector<PrivateCopy>& copies) {
  mutex_.lock();  // until end_fork(), in the parent and in the child
  for (const auto& [begin, r] : by_begin_) {
    try {
      std::vector<PrivateCopy> mine = copy_out(r, "fork");
      copies.insert(copies.end(), mine.begin(), mine.end());
    } catch (const std::exception& e) {
      spdlog::error("registered buffer at {}: a child forked now shares its pages: {}",
                    static_cast<const void*>(begin), e.what());
    }
  }
}

void RegisteredBuffers::end_fork() { mutex_.unlock(); }

const Registration* RegisteredBuffers::find(const void* data, size_t bytes) {
  if (count_.load(std::memory_order_relaxed) == 0 || !in_owner()) return nullptr;
  const auto* begin = static_cast<const std::byte*>(data);
  std::lock_guard lock(mutex_);
  auto after = by_begin_.upper_bound(begin);
  if (after == by_begin_.begin()) return nullptr;
  const auto it = std::prev(after);
  const Registration& r = it->second;
  if (begin + bytes > r.begin + r.bytes) return nullptr;
  // An operand wholly in the partial end pages needs no check: those bytes are copied in and out.
  const std::byte* probe = std::max<const std::byte*>(begin, r.interior_begin);
  if (probe >= std::min<const std::byte*>(begin + bytes, r.interior_end) || alive(r, probe)) {
    return &r;
  }
  release(r);  // unmapped while registered: its operands are ordinary memory again
  by_begin_.erase(it);
  count_.store(by_begin_.size(), std::memory_order_relaxed);
  return nullptr;
}

namespace {

// Calls copy(at, n) for the operand's parts in the buffer's partial first and last pages.
template <typename Copy>
void for_each_edge(const Registration& r, const std::byte* begin, size_t bytes, Copy copy) {
  const std::byte* end = begin + bytes;
  const std::byte* ranges[2][2] = {{r.begin, r.interior_begin},
                                   {r.interior_end, r.begin + r.bytes}};
  for (const auto& range : ranges) {
    const std::byte* from = std::max(begin, range[0]);
    const std::byte* to = std::min(end, range[1]);
    if (from < to) copy(from, static_cast<size_t>(to - from));
  }
}

}  // namespace

void RegisteredBuffers::edges_in(const Registration& r, const void* data, size_t bytes) {
  for_each_edge(r, static_cast<const std::byte*>(data), bytes,
                [&](const std::byte* at, size_t n) { std::memcpy(r.view(at), at, n); });
}

void RegisteredBuffers::edges_out(const Registration& r, void* data, size_t bytes) {
  for_each_edge(r, static_cast<const std::byte*>(data), bytes, [&](const std::byte* at, size_t n) {
    std::memcpy(const_cast<std::byte*>(at), r.view(at), n);
  });
}

}  // namespace xs::detail
