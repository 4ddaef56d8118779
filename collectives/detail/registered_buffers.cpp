#include "xla_spawn/collectives/detail/registered_buffers.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

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

}  // namespace

RegisteredBuffers::RegisteredBuffers(BufferArena& arena)
    : arena_(arena), owner_(::getpid()), maps_fd_(::open("/proc/self/maps", O_RDONLY | O_CLOEXEC)) {}

// In a child forked while buffers were registered, nothing is released: the pages and the
// block belong to the parent, which still uses them.
RegisteredBuffers::~RegisteredBuffers() {
  if (::getpid() == owner_) {
    std::lock_guard lock(mutex_);
    for (auto& [begin, r] : by_begin_) {
      try {
        release(r);
      } catch (const std::exception& e) {
        spdlog::error("registered buffer at {}: {}", static_cast<const void*>(begin), e.what());
      }
    }
  }
  if (maps_fd_ >= 0) ::close(maps_fd_);
}

// Whether the first and last interior pages still map the registration's block: one
// PROCMAP_QUERY each. Without the ioctl (kernels before 6.11) the registration is trusted.
bool RegisteredBuffers::alive(const Registration& r) const {
  if (maps_fd_ < 0) return true;
  const size_t last = static_cast<size_t>(r.interior_end - r.interior_begin) - kPageBytes;
  for (const size_t at : {size_t{0}, last}) {
    ProcmapQuery q;
    q.query_addr = reinterpret_cast<uint64_t>(r.interior_begin + at);
    if (::ioctl(maps_fd_, kProcmapQuery, &q) != 0) {
      if (errno == ENOENT) return false;  // nothing mapped there
      return true;                        // no PROCMAP_QUERY: trusted
    }
    if ((q.vma_flags & kVmaShared) == 0 || q.inode != segment_inode_ ||
        q.vma_offset + (q.query_addr - q.vma_start) != r.file_offset + at) {
      return false;
    }
  }
  return true;
}

bool RegisteredBuffers::add(void* data, size_t bytes) {
  auto* begin = static_cast<std::byte*>(data);
  XS_CHECK_ARG(data != nullptr || bytes == 0, "register_buffer: null buffer of {} bytes", bytes);
  XS_CHECK_ARG(::getpid() == owner_,
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
    if (overlaps && !alive(it->second)) {
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
  return true;
}

void RegisteredBuffers::remove(void* data) {
  std::lock_guard lock(mutex_);
  const auto it = by_begin_.find(static_cast<const std::byte*>(data));
  XS_CHECK_ARG(it != by_begin_.end(), "deregister_buffer: no buffer is registered at {}", data);
  XS_CHECK_ARG(::getpid() == owner_,
               "deregister_buffer: this process was forked from the one that owns the communicator");
  release(it->second);
  by_begin_.erase(it);
}

// Every part of the interior that still maps the block (the whole of it, unless the owner
// unmapped or replaced parts) gets private pages again: a copy of the block's bytes, with the
// protection the part had, moved over it in one mremap (the range is never unmapped). Only
// then, when nothing of this process maps the block any more, are its pages given back.
void RegisteredBuffers::release(const Registration& r) {
  const size_t block_bytes = static_cast<size_t>(page_up(r.begin + r.bytes) - r.pages_begin);
  size_t restored = 0;
  for (const Vma& v : mappings_over(r.interior_begin, r.interior_end, false)) {
    std::byte* from = std::max(v.begin, r.interior_begin);
    std::byte* to = std::min(v.end, r.interior_end);
    const uint64_t want = r.file_offset + static_cast<uint64_t>(from - r.interior_begin);
    if (v.perms[3] != 's' || v.inode != segment_inode_ ||
        v.offset + static_cast<uint64_t>(from - v.begin) != want) {
      continue;
    }
    const size_t n = static_cast<size_t>(to - from);
    void* fresh = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) {
      throw IoError(fmt::format("deregister_buffer: cannot map {} bytes: {}", n, std::strerror(errno)));
    }
    std::memcpy(fresh, r.view(from), n);
    if (v.protection() != (PROT_READ | PROT_WRITE)) ::mprotect(fresh, n, v.protection());
    if (::mremap(fresh, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, from) != from) {
      const int error = errno;
      ::munmap(fresh, n);
      throw IoError(fmt::format("deregister_buffer: cannot move private pages onto {}: {}",
                                static_cast<void*>(from), std::strerror(error)));
    }
    restored += n;
  }
  if (restored < static_cast<size_t>(r.interior_end - r.interior_begin)) {
    spdlog::warn("the buffer registered at {} ({} bytes) was unmapped before deregister_buffer",
                 static_cast<const void*>(r.begin), r.bytes);
  }
  ::madvise(r.block, block_bytes, MADV_REMOVE);
  arena_.deallocate(r.block);
}

const Registration* RegisteredBuffers::find(const void* data, size_t bytes) {
  const auto* begin = static_cast<const std::byte*>(data);
  if (::getpid() != owner_) return nullptr;  // a forked child: the registrations are not its
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
