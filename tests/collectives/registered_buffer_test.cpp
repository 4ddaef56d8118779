// Communicator::register_buffer: heap memory whose pages move into the replica's buffer arena,
// so its collectives run zero-copy. Across real forked replicas: every dtype, op and a sweep
// of element counts (operands that start and end inside the buffer's partial end pages)
// against the closed form and for bit-identity, with each ordinal's buffer at another offset
// into its page; registered and unregistered operands in one call; all_gather,
// reduce_scatter and the range phases on registered inputs. And what registration must not
// do: take memory it cannot safely share, lose a neighbour's bytes in a partial page, or leave
// the memory shared (or changed) after deregistration or the communicator's end.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <numeric>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/detail/registered_buffers.h"
#include "xla_spawn/collectives/reduce.h"
#include "tests/collectives/combination_sweep.h"
#include "tests/collectives/fork_harness.h"
#include "tests/collectives/test_data.h"

namespace xs::testing {
namespace {

constexpr size_t kStagingBytes = 64 << 10;
constexpr size_t kPage = 4096;

std::vector<size_t> counts(DType dtype) {
  return {0, 1, 7, 1023, 4099, (size_t{1} << 18) + 3, 5 * kStagingBytes / 4 / dtype_size(dtype) + 5};
}

size_t largest_bytes() {
  size_t bytes = 0;
  for (DType dtype : kSweepDTypes) bytes = std::max(bytes, counts(dtype).back() * dtype_size(dtype));
  return std::max(bytes, ((size_t{1} << 18) + 3) * 8);
}

// The mapping that holds `p` in /proc/self/maps: its permissions ("rw-p", "r--s", ...) and
// path ("" for anonymous memory); "unmapped" for both when none does.
struct Mapping {
  std::string perms = "unmapped";
  std::string path = "unmapped";
};
Mapping mapping_at(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    unsigned long from = 0, to = 0;
    char perms[5] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %4s %*s %*s %*s %n", &from, &to, perms, &path_at) < 3) {
      continue;
    }
    if (at >= from && at < to) {
      return {perms, path_at > 0 ? line.substr(static_cast<size_t>(path_at)) : ""};
    }
  }
  return {};
}
std::string mapping_of(const void* p) { return mapping_at(p).path; }
std::string perms_of(const void* p) { return mapping_at(p).perms; }

// A heap buffer of `bytes` starting `skew` bytes past a page boundary.
struct SkewedBuffer {
  SkewedBuffer(size_t bytes, size_t skew) : storage(bytes + skew + 2 * kPage) {
    const auto base = reinterpret_cast<uintptr_t>(storage.data());
    data = reinterpret_cast<std::byte*>((base + kPage - 1) / kPage * kPage + skew);
  }
  std::vector<std::byte> storage;
  std::byte* data;
};

// Registers `n` floats at `values` and all-reduces ones into them (N at N replicas); what
// failed, or "".
std::string register_and_sum_ones(ShmCommunicator& comm, float* values, size_t n) {
  if (!comm.register_buffer(values, n * sizeof(float))) return "not registered";
  std::fill(values, values + n, 1.0f);
  comm.all_reduce(values, n, DType::kF32, ReduceOp::kSum);
  return "";
}

class RegisteredAllReduceTest : public ::testing::TestWithParam<std::tuple<int, Algo>> {};

TEST_P(RegisteredAllReduceTest, MatchesClosedFormAndIsBitIdenticalOnEveryOrdinal) {
  const auto [world_size, algo] = GetParam();
  ForkJob job(world_size, kStagingBytes);
  job.start([algo = algo](Child& child) {
    // Ordinals disagree on where their buffers start within a page.
    SkewedBuffer buffer(largest_bytes(), 40 + 8 * static_cast<size_t>(child.ordinal));
    ShmCommunicator comm = child.communicator({.algorithm = algo, .timeout_ms = {}});
    if (!comm.register_buffer(buffer.data, largest_bytes())) return std::string("not registered");
    if (!comm.in_arena(buffer.data + 8, 1000)) return std::string("registered but not in the arena");
    if (mapping_of(buffer.data + kPage).find("xla-spawn") == std::string::npos) {
      return fmt::format("interior page maps '{}', not the segment", mapping_of(buffer.data + kPage));
    }
    std::string failures =
        reduce_all_combinations(child, counts, [&](DType dtype, ReduceOp op, size_t n) {
          std::vector<std::byte> data = make_input(dtype, child.ordinal, n);
          if (!data.empty()) std::memcpy(buffer.data, data.data(), data.size());
          comm.all_reduce(buffer.data, n, dtype, op);
          if (!data.empty()) std::memcpy(data.data(), buffer.data, data.size());
          return data;
        });
    comm.deregister_buffer(buffer.data);
    return failures;
  });
  const JobResult result = job.wait(std::chrono::seconds(240));  // slow only when loaded
  ASSERT_TRUE(result.all_ok()) << result.describe();
  expect_bit_identical(job, world_size, combination_count(counts));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RegisteredAllReduceTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 8),
                                            ::testing::Values(Algo{},
                                                              Algo{AllReduceAlgorithm::kDirect})),
                         [](const auto& info) {
                           return fmt::format("N{}_{}", std::get<0>(info.param),
                                              algo_name(std::get<1>(info.param)));
                         });

TEST(RegisteredBufferTest, RegisteredAndUnregisteredOperandsInOneCallAgree) {
  ForkJob job(3, kStagingBytes);
  job.start([](Child& child) {
    SkewedBuffer buffer(largest_bytes(), 104);
    ShmCommunicator comm = child.communicator();
    if (child.ordinal != 1 && !comm.register_buffer(buffer.data, largest_bytes())) {
      return std::string("not registered");
    }
    return reduce_all_combinations(child, counts, [&](DType dtype, ReduceOp op, size_t n) {
      std::vector<std::byte> data = make_input(dtype, child.ordinal, n);
      if (!data.empty()) std::memcpy(buffer.data, data.data(), data.size());
      comm.all_reduce(buffer.data, n, dtype, op);
      if (!data.empty()) std::memcpy(data.data(), buffer.data, data.size());
      return data;
    });
  });
  const JobResult result = job.wait(std::chrono::seconds(240));
  ASSERT_TRUE(result.all_ok()) << result.describe();
  expect_bit_identical(job, 3, combination_count(counts));
}

// Inputs of all_gather and reduce_scatter and the operand of the range phases, registered
// with their first and last bytes in partial pages.
TEST(RegisteredBufferTest, GatherScatterAndRangesOnRegisteredOperands) {
  constexpr int kWorld = 3;
  constexpr size_t kElems = 50'001;  // per ordinal
  ForkJob job(kWorld, kStagingBytes);
  job.start([](Child& child) {
    const int n = child.world_size;
    const size_t total = kElems * static_cast<size_t>(n);
    SkewedBuffer in(total * sizeof(float), 12);
    ShmCommunicator comm = child.communicator();
    auto* values = reinterpret_cast<float*>(in.data);
    if (!comm.register_buffer(in.data, total * sizeof(float))) return std::string("not registered");
    for (size_t i = 0; i < total; ++i) values[i] = static_cast<float>(child.ordinal * 1000 + i % 997);
    std::vector<float> gathered(total * static_cast<size_t>(n));
    comm.all_gather(values, gathered.data(), total, DType::kF32);
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < total; ++i) {
        const float want = static_cast<float>(k * 1000 + i % 997);
        if (gathered[static_cast<size_t>(k) * total + i] != want) {
          return fmt::format("all_gather: ordinal {}'s element {} is {}, want {}", k, i,
                             gathered[static_cast<size_t>(k) * total + i], want);
        }
      }
    }
    std::vector<float> mine(kElems);
    comm.reduce_scatter(values, mine.data(), kElems, DType::kF32, ReduceOp::kSum);
    for (size_t i = 0; i < kElems; ++i) {
      const size_t at = static_cast<size_t>(child.ordinal) * kElems + i;
      const float want = static_cast<float>((0 + 1000 + 2000) + 3 * (at % 997));
      if (mine[i] != want) return fmt::format("reduce_scatter: element {} is {}, want {}", i, mine[i], want);
    }
    std::vector<size_t> bounds(static_cast<size_t>(n) + 1);
    for (int k = 0; k <= n; ++k) bounds[k] = static_cast<size_t>(k) * total / static_cast<size_t>(n);
    comm.reduce_ranges(values, total, DType::kF32, ReduceOp::kSum, bounds);
    comm.gather_ranges(values, total, DType::kF32, bounds);
    for (size_t i = 0; i < total; ++i) {
      const float want = static_cast<float>(3000 + 3 * (i % 997));
      if (values[i] != want) return fmt::format("ranges: element {} is {}, want {}", i, values[i], want);
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(120));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

// The bytes around a registered buffer in its partial pages belong to other objects: they
// keep private pages, so what this process writes there stays there, all_reduce leaves
// them alone, and peers never see them.
TEST(RegisteredBufferTest, NeighboursInPartialPagesAreNeitherSharedNorTouched) {
  constexpr size_t kElems = 40'000;
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    SkewedBuffer buffer(kElems * sizeof(float) + 2 * 64, 1000);
    ShmCommunicator comm = child.communicator();
    std::byte* before = buffer.data;  // 64 neighbour bytes on each side, in the partial pages
    auto* values = reinterpret_cast<float*>(buffer.data + 64);
    std::byte* after = buffer.data + 64 + kElems * sizeof(float);
    if (!comm.register_buffer(values, kElems * sizeof(float))) return std::string("not registered");
    if (mapping_of(before) != mapping_of(buffer.storage.data())) {
      return fmt::format("the partial first page maps '{}'", mapping_of(before));
    }
    const auto mark = static_cast<std::byte>(0x50 + child.ordinal);
    std::memset(before, static_cast<int>(mark), 64);
    std::memset(after, static_cast<int>(mark), 64);
    for (size_t i = 0; i < kElems; ++i) values[i] = static_cast<float>(child.ordinal + 1);
    comm.all_reduce(values, kElems, DType::kF32, ReduceOp::kSum);
    for (size_t i = 0; i < kElems; ++i) {
      if (values[i] != 3.0f) return fmt::format("element {} is {}", i, values[i]);
    }
    for (size_t i = 0; i < 64; ++i) {
      if (before[i] != mark || after[i] != mark) {
        return fmt::format("neighbour byte {} changed: {:#x} / {:#x}, want {:#x}", i,
                           static_cast<int>(before[i]), static_cast<int>(after[i]),
                           static_cast<int>(mark));
      }
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

// Deregistration and the communicator's end both give the memory private pages again with the
// last contents: later writes are this process's alone.
TEST(RegisteredBufferTest, DeregisteringOrEndingKeepsContentsAndUnshares) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    constexpr size_t kElems = 100'000;
    SkewedBuffer first(kElems * sizeof(float), 16), second(kElems * sizeof(float), 16);
    auto* a = reinterpret_cast<float*>(first.data);
    auto* b = reinterpret_cast<float*>(second.data);
    {
      ShmCommunicator comm = child.communicator();
      if (!comm.register_buffer(a, kElems * sizeof(float)) ||
          !comm.register_buffer(b, kElems * sizeof(float))) {
        return std::string("not registered");
      }
      std::fill(a, a + kElems, 1.0f);
      std::fill(b, b + kElems, 2.0f);
      comm.all_reduce(a, kElems, DType::kF32, ReduceOp::kSum);
      comm.all_reduce(b, kElems, DType::kF32, ReduceOp::kSum);
      comm.deregister_buffer(a);
      if (!mapping_of(first.data + kPage).empty()) {
        return fmt::format("after deregister_buffer the buffer maps '{}'", mapping_of(first.data + kPage));
      }
      try {
        comm.deregister_buffer(a);
        return std::string("deregistered the same buffer twice");
      } catch (const InvalidArgument&) {
      }
      comm.barrier();
    }  // b is still registered here
    if (!mapping_of(second.data + kPage).empty()) {
      return fmt::format("after the communicator's end the buffer maps '{}'",
                         mapping_of(second.data + kPage));
    }
    for (size_t i = 0; i < kElems; ++i) {
      if (a[i] != 2.0f || b[i] != 4.0f) return fmt::format("element {}: {} / {}", i, a[i], b[i]);
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

// Memory whose pages cannot be swapped for shared ones is refused, unchanged: too few whole
// pages, a file mapping (its writes must reach the file), a read-only mapping. Overlapping
// registrations are an error; the same one twice is not.
TEST(RegisteredBufferTest, RefusesWhatItCannotShare) {
  ForkJob job(1, kStagingBytes);
  job.start([](Child& child) {
    SkewedBuffer buffer(1 << 20, 8);
    ShmCommunicator comm = child.communicator();
    std::vector<std::byte> small(detail::RegisteredBuffers::kMinInteriorBytes - 1);
    if (comm.register_buffer(small.data(), small.size())) return std::string("registered a small buffer");

    char path[] = "/tmp/xs-registered-XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0 || ::ftruncate(fd, 1 << 20) != 0) return std::string("cannot make a temporary file");
    ::unlink(path);
    void* file = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const bool file_registered = comm.register_buffer(file, 1 << 20);
    void* read_only = ::mmap(nullptr, 1 << 20, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    const bool read_only_registered = comm.register_buffer(read_only, 1 << 20);
    ::munmap(file, 1 << 20);
    ::munmap(read_only, 1 << 20);
    ::close(fd);
    if (file_registered) return std::string("registered a file mapping");
    if (read_only_registered) return std::string("registered a read-only mapping");
    void* locked = ::mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED, -1, 0);
    const bool locked_registered = locked != MAP_FAILED && comm.register_buffer(locked, 1 << 20);
    if (locked != MAP_FAILED) ::munmap(locked, 1 << 20);
    if (locked_registered) return std::string("registered mlocked memory (the lock would be lost)");
    void* arena = comm.alloc_buffer(1 << 20);
    const bool arena_registered = comm.register_buffer(arena, 1 << 20);
    comm.free_buffer(arena);
    if (arena_registered) return std::string("registered an alloc_buffer block");

    if (!comm.register_buffer(buffer.data, 1 << 20)) return std::string("not registered");
    if (!comm.register_buffer(buffer.data, 1 << 20)) return std::string("the same registration twice refused");
    try {
      comm.register_buffer(buffer.data + 4096, 1 << 20);
      return std::string("an overlapping registration was accepted");
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("overlaps") == std::string::npos) return std::string(e.what());
    }
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

// Protection the owner set while the buffer was registered survives deregistration, and so do
// the contents (not taken for an unmapped buffer).
TEST(RegisteredBufferTest, DeregisteringKeepsTheProtectionTheOwnerSet) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    constexpr size_t kElems = 100'000;
    SkewedBuffer buffer(kElems * sizeof(float), 16);
    auto* values = reinterpret_cast<float*>(buffer.data);
    ShmCommunicator comm = child.communicator();
    if (std::string failed = register_and_sum_ones(comm, values, kElems); !failed.empty()) return failed;
    std::byte* interior = buffer.data + kPage;
    const size_t frozen = 8 * kPage;
    std::byte* page = reinterpret_cast<std::byte*>(reinterpret_cast<uintptr_t>(interior) & ~(kPage - 1));
    if (::mprotect(page, frozen, PROT_READ) != 0) return std::string("mprotect failed");
    comm.deregister_buffer(values);
    if (perms_of(page) != "r--p" || perms_of(page + frozen) != "rw-p") {
      return fmt::format("after deregister_buffer: {} / {}, want r--p / rw-p", perms_of(page),
                         perms_of(page + frozen));
    }
    for (size_t i = 0; i < kElems; ++i) {
      if (values[i] != 2.0f) return fmt::format("element {} is {}, want 2", i, values[i]);
    }
    ::mprotect(page, frozen, PROT_READ | PROT_WRITE);
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

// A child forked while a buffer is registered, which then tears down its copy of the
// communicator (exit() runs destructors), must leave the parent's buffer, slot and job alone.
TEST(RegisteredBufferTest, AForkedChildsTeardownLeavesTheParentAlone) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    constexpr size_t kElems = 100'000;
    SkewedBuffer buffer(kElems * sizeof(float), 16);
    auto* values = reinterpret_cast<float*>(buffer.data);
    std::optional<ShmCommunicator> comm;
    comm.emplace(child.attach());
    if (!comm->register_buffer(values, kElems * sizeof(float))) return std::string("not registered");
    std::fill(values, values + kElems, 1.0f);
    comm->all_reduce(values, kElems, DType::kF32, ReduceOp::kSum);
    const pid_t pid = ::fork();
    if (pid == 0) {
      comm.reset();
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    for (size_t i = 0; i < kElems; ++i) {
      if (values[i] != 2.0f) return fmt::format("after the child: element {} is {}, want 2", i, values[i]);
    }
    comm->all_reduce(values, kElems, DType::kF32, ReduceOp::kSum);
    for (size_t i = 0; i < kElems; ++i) {
      if (values[i] != 4.0f) return fmt::format("element {} is {}, want 4", i, values[i]);
    }
    comm->deregister_buffer(values);
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

// A child forked while a buffer is registered gets a copy of its pages, as of any private
// memory: its writes do not reach the parent (fork-based checkpoints, data-loader workers), and
// the parent's later writes do not reach what it holds.
TEST(RegisteredBufferTest, AForkedChildGetsACopyNotTheParentsPages) {
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    constexpr size_t kElems = 100'000;
    SkewedBuffer buffer(kElems * sizeof(float), 16);
    auto* values = reinterpret_cast<float*>(buffer.data);
    ShmCommunicator comm = child.communicator();
    if (std::string failed = register_and_sum_ones(comm, values, kElems); !failed.empty()) return failed;
    int to_child[2], to_parent[2];
    if (::pipe(to_child) != 0 || ::pipe(to_parent) != 0) return std::string("pipe failed");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(to_child[1]);  // a parent that dies then ends the read below instead of hanging it
      char go = 0;
      // The parent has overwritten its buffer when this byte arrives.
      const bool got = ::read(to_child[0], &go, 1) == 1;
      bool kept = got;
      for (size_t i = 0; i < kElems && kept; ++i) kept = values[i] == 2.0f;
      std::fill(values, values + kElems, 7.0f);
      (void)!::write(to_parent[1], "x", 1);
      ::_exit(kept ? 0 : 1);
    }
    ::close(to_parent[1]);  // likewise for a child that dies
    std::fill(values, values + kElems, 5.0f);
    (void)!::write(to_child[1], "x", 1);
    char done = 0;
    (void)!::read(to_parent[0], &done, 1);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return fmt::format("the child saw the parent's later writes (status {:#x})", status);
    }
    for (size_t i = 0; i < kElems; ++i) {
      if (values[i] != 5.0f) return fmt::format("after the child: element {} is {}, want 5", i, values[i]);
    }
    comm.all_reduce(values, kElems, DType::kF32, ReduceOp::kSum);
    for (size_t i = 0; i < kElems; ++i) {
      if (values[i] != 10.0f) return fmt::format("element {} is {}, want 10", i, values[i]);
    }
    comm.deregister_buffer(values);
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

// Memory freed and unmapped without deregister_buffer, and mapped afresh at the same address:
// the stale registration must not capture the new memory's collectives (their results would
// land in the old pages).
TEST(RegisteredBufferTest, AStaleRegistrationIsDroppedNotUsed) {
  constexpr size_t kBytes = 1 << 20;
  ForkJob job(2, kStagingBytes);
  job.start([](Child& child) {
    ShmCommunicator comm = child.communicator();
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!comm.register_buffer(p, kBytes)) return std::string("not registered");
    ::munmap(p, kBytes);
    void* q = ::mmap(p, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0);
    if (q != p) return std::string("could not map the same address again");
    auto* values = static_cast<float*>(q);
    std::fill(values, values + kBytes / sizeof(float), static_cast<float>(child.ordinal + 1));
    comm.all_reduce(values, kBytes / sizeof(float), DType::kF32, ReduceOp::kSum);
    for (size_t i = 0; i < kBytes / sizeof(float); ++i) {
      if (values[i] != 3.0f) return fmt::format("element {} is {}, want 3", i, values[i]);
    }
    ::munmap(q, kBytes);  // and again, now registering the same bounds
    q = ::mmap(p, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (q != p || !comm.register_buffer(q, kBytes)) return std::string("the new memory cannot register");
    if (!comm.in_arena(q, kBytes)) return std::string("registered again but not in the arena");
    comm.deregister_buffer(q);
    ::munmap(q, kBytes);
    return std::string();
  });
  const JobResult result = job.wait(std::chrono::seconds(60));
  ASSERT_TRUE(result.all_ok()) << result.describe();
}

}  // namespace
}  // namespace xs::testing
