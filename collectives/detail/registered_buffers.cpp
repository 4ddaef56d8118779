#include "xla_spawn/collectives/detail/registered_buffers.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/buffer_arena.h"

namespace xs::detail {
namespace {

constexpr uintptr_t kPageBytes = BufferArena::kAlignBytes;

std::byte* page_down(const void* p) {
  return reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(p) & ~(kPageBytes - 1));
}
std::byte* page_up(const void* p) {
  return page_down(static_cast<const std::byte*>(p) + kPageBytes - 1);
}

// Whether every mapping over [begin, end) in /proc/self/maps passes `accept(perms, inode, path)`
// and no page of it is unmapped.
template <typename Accept>
bool mapped_as(const std::byte* begin, const std::byte* end, Accept accept) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto* covered = begin;
  while (covered < end && std::getline(maps, line)) {
    unsigned long from = 0, to = 0, offset = 0, inode = 0;
    char perms[5] = {};
    char device[16] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %4s %lx %15s %lu %n", &from, &to, perms, &offset,
                    device, &inode, &path_at) < 6) {
      return false;
    }
    const auto* vma_begin = reinterpret_cast<const std::byte*>(from);
    const auto* vma_end = reinterpret_cast<const std::byte*>(to);
    if (vma_end <= covered) continue;
    if (vma_begin > covered) return false;  // a hole
    const std::string path = path_at > 0 && static_cast<size_t>(path_at) <= line.size()
                                 ? line.substr(static_cast<size_t>(path_at))
                                 : std::string();
    if (!accept(std::string_view(perms), inode, path)) return false;
    covered = vma_end;
  }
  return covered >= end;
}

// The PROCMAP_QUERY ioctl on /proc/self/maps (Linux 6.11): one mapping's bounds, flags and
// file position in a system call, cheap enough for every collective. Declared here as the
// kernel's uapi/linux/fs.h has it, for older headers.
struct ProcmapQuery {
  uint64_t size = sizeof(ProcmapQuery);
  uint64_t query_flags = 0;
  uint64_t query_addr = 0;
  uint64_t vma_start = 0;
  uint64_t vma_end = 0;
  uint64_t vma_flags = 0;
  uint64_t vma_page_size = 0;
  uint64_t vma_offset = 0;
  uint64_t inode = 0;
  uint32_t dev_major = 0;
  uint32_t dev_minor = 0;
  uint32_t vma_name_size = 0;
  uint32_t build_id_size = 0;
  uint64_t vma_name_addr = 0;
  uint64_t build_id_addr = 0;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaShared = 0x08;

// Private, anonymous (the heap, or a mapping with no file), readable and writable: the only
// memory whose pages may be swapped for shared ones without anyone noticing. A file mapping
// would stop writing its file, a read-only one would become writable, a stack would lose its
// pages' lifetime.
bool private_anonymous(const std::byte* begin, const std::byte* end) {
  return mapped_as(begin, end, [](std::string_view perms, unsigned long inode, const std::string& path) {
    return perms == "rw-p" && inode == 0 &&
           (path.empty() || path == "[heap]" || path.starts_with("[anon:"));
  });
}

}  // namespace

RegisteredBuffers::RegisteredBuffers(BufferArena& arena, std::string segment_path)
    : arena_(arena),
      segment_path_(std::move(segment_path)),
      maps_fd_(::open("/proc/self/maps", O_RDONLY | O_CLOEXEC)) {}

RegisteredBuffers::~RegisteredBuffers() {
  std::lock_guard lock(mutex_);
  for (auto& [begin, r] : by_begin_) {
    try {
      release(r);
    } catch (const std::exception& e) {
      spdlog::error("registered buffer at {}: {}", static_cast<const void*>(begin), e.what());
    }
  }
  if (maps_fd_ >= 0) ::close(maps_fd_);
}

// Where `p` maps in the segment's file, or nullopt (not the segment's pages, or no
// PROCMAP_QUERY: then `known` is false).
std::optional<uint64_t> RegisteredBuffers::segment_offset(const std::byte* p, bool& known) const {
  ProcmapQuery q;
  q.query_addr = reinterpret_cast<uint64_t>(p);
  known = maps_fd_ >= 0 && ::ioctl(maps_fd_, kProcmapQuery, &q) == 0;
  if (!known) {
    known = maps_fd_ >= 0 && errno == ENOENT;  // nothing mapped there: known, and not ours
    return std::nullopt;
  }
  if ((q.vma_flags & kVmaShared) == 0 || q.inode != segment_inode_) return std::nullopt;
  return q.vma_offset + (q.query_addr - q.vma_start);
}

bool RegisteredBuffers::alive(const Registration& r) const {
  bool known = false;
  const auto first = segment_offset(r.interior_begin, known);
  if (!known) return true;  // no cheap way to tell: trust the registration
  const auto last = segment_offset(r.interior_end - kPageBytes, known);
  return first && last && *first == r.file_offset &&
         *last == r.file_offset + static_cast<size_t>(r.interior_end - r.interior_begin) - kPageBytes;
}

bool RegisteredBuffers::add(void* data, size_t bytes) {
  auto* begin = static_cast<std::byte*>(data);
  XS_CHECK_ARG(data != nullptr || bytes == 0, "register_buffer: null buffer of {} bytes", bytes);
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
    if (overlaps && !(it->second.begin == begin && it->second.bytes == bytes) && !alive(it->second)) {
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
  // Copy the contents, then map the block's pages over the buffer's: an mremap of length 0
  // duplicates a shared mapping, and MREMAP_FIXED replaces the private pages in one step.
  const size_t interior_bytes = static_cast<size_t>(r.interior_end - r.interior_begin);
  std::byte* shared = r.view(r.interior_begin);
  std::memcpy(shared, r.interior_begin, interior_bytes);
  void* moved = ::mremap(shared, 0, interior_bytes, MREMAP_MAYMOVE | MREMAP_FIXED, r.interior_begin);
  if (moved != r.interior_begin) {
    spdlog::debug("register_buffer: mremap onto {}: {}", static_cast<void*>(r.interior_begin),
                  std::strerror(errno));
    ::madvise(r.block, block_bytes, MADV_REMOVE);
    arena_.deallocate(r.block);
    return false;
  }
  if (segment_inode_ == 0 && maps_fd_ >= 0) {
    ProcmapQuery q;
    q.query_addr = reinterpret_cast<uint64_t>(r.interior_begin);
    if (::ioctl(maps_fd_, kProcmapQuery, &q) == 0) segment_inode_ = q.inode;
  }
  bool known = false;
  r.file_offset = segment_offset(r.interior_begin, known).value_or(0);
  by_begin_.emplace(begin, r);
  return true;
}

void RegisteredBuffers::remove(void* data) {
  std::lock_guard lock(mutex_);
  const auto it = by_begin_.find(static_cast<const std::byte*>(data));
  XS_CHECK_ARG(it != by_begin_.end(), "deregister_buffer: no buffer is registered at {}", data);
  release(it->second);
  by_begin_.erase(it);
}

// Copies the interior into fresh private pages and moves them over the shared ones (one
// mremap: at no moment is the range unmapped), then gives the block's pages back to /dev/shm.
// A buffer unmapped while registered (freed by its owner too early) has nothing left to copy.
void RegisteredBuffers::release(const Registration& r) {
  const size_t interior_bytes = static_cast<size_t>(r.interior_end - r.interior_begin);
  const size_t block_bytes = static_cast<size_t>(page_up(r.begin + r.bytes) - r.pages_begin);
  const bool still_shared =
      alive(r) && mapped_as(r.interior_begin, r.interior_end,
                            [&](std::string_view perms, unsigned long, const std::string& path) {
                              return perms == "rw-s" && path.starts_with(segment_path_);
                            });
  if (!still_shared) {
    spdlog::warn("the buffer registered at {} ({} bytes) was unmapped before deregister_buffer",
                 static_cast<const void*>(r.begin), r.bytes);
    ::madvise(r.block, block_bytes, MADV_REMOVE);
    arena_.deallocate(r.block);
    return;
  }
  void* fresh = ::mmap(nullptr, interior_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (fresh == MAP_FAILED) {
    throw IoError(fmt::format("deregister_buffer: cannot map {} bytes: {}", interior_bytes,
                              std::strerror(errno)));
  }
  std::memcpy(fresh, r.interior_begin, interior_bytes);
  if (::mremap(fresh, interior_bytes, interior_bytes, MREMAP_MAYMOVE | MREMAP_FIXED,
               r.interior_begin) != r.interior_begin) {
    const int error = errno;
    ::munmap(fresh, interior_bytes);
    throw IoError(fmt::format("deregister_buffer: cannot move private pages onto {}: {}",
                              static_cast<void*>(r.interior_begin), std::strerror(error)));
  }
  ::madvise(r.block, block_bytes, MADV_REMOVE);
  arena_.deallocate(r.block);
}

const Registration* RegisteredBuffers::find(const void* data, size_t bytes) {
  const auto* begin = static_cast<const std::byte*>(data);
  std::lock_guard lock(mutex_);
  auto after = by_begin_.upper_bound(begin);
  if (after == by_begin_.begin()) return nullptr;
  const auto it = std::prev(after);
  const Registration& r = it->second;
  if (begin + bytes > r.begin + r.bytes) return nullptr;
  if (alive(r)) return &r;
  release(r);  // unmapped while registered: its operands are ordinary memory again
  by_begin_.erase(it);
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

size_t RegisteredBuffers::size() const {
  std::lock_guard lock(mutex_);
  return by_begin_.size();
}

}  // namespace xs::detail
