// corrupt_replica: a replica for the control-block tests. Every ordinal runs small
// all-reduces; after --after iterations the --victim ordinal maps the job's segment itself and
// writes garbage into one --field of the control block or a slot, then stops taking part
// (sleeps up to --hang-ms), as a buggy or hostile replica would. The others must see a clear
// error (the launcher's control-block check), never read out of bounds.
// --field mailbox_arena_offset is the one the replicas themselves must catch: every ordinal
// all-gathers from its buffer arena (the zero-copy direct schedule, where peers read each
// other's operands at the arena offsets their mailboxes publish), and the victim keeps
// overwriting its own published offset with garbage from a second thread while it goes on
// calling, so the peers read a wild offset sooner or later.
//
//   xla-spawn -n 3 -- corrupt_replica --field staging_bytes --victim 1 --after 20

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/shm_communicator.h"
#include "xla_spawn/replica/context.h"
#include "xla_spawn/shm/layout.h"

namespace {

namespace bip = boost::interprocess;

struct Args {
  std::string field;
  int victim = 0;
  int64_t after = 20;
  int64_t hang_ms = 30'000;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--field")
      a.field = value;
    else if (flag == "--victim")
      a.victim = static_cast<int>(xs::parse_int(value, 0, 1023, flag));
    else if (flag == "--after")
      a.after = xs::parse_int(value, 0, 1'000'000, flag);
    else if (flag == "--hang-ms")
      a.hang_ms = xs::parse_int(value, 0, 600'000, flag);
    else
      throw xs::InvalidArgument("corrupt_replica: unknown flag " + flag);
  }
  return a;
}

// Garbage a scribbling replica might leave: large, odd, not a pid, not a size.
constexpr uint32_t kGarbage32 = 0x7badf00d;
constexpr uint64_t kGarbage64 = 0x7badf00ddeadbeefull;

template <class T>
void store(T& field, T value) {
  __atomic_store_n(&field, value, __ATOMIC_RELAXED);
}
template <class T>
void store(std::atomic<T>& field, T value) {
  field.store(value);
}

void scribble(const std::string& field, int victim) {
  const char* name = std::getenv("XLA_SPAWN_SEGMENT");
  if (name == nullptr) throw xs::InvalidArgument("corrupt_replica: no XLA_SPAWN_SEGMENT");
  bip::shared_memory_object object(bip::open_only, name, bip::read_write);
  bip::mapped_region region(object, bip::read_write);
  auto* base = static_cast<std::byte*>(region.get_address());
  auto& c = *reinterpret_cast<xs::shm::ControlBlock*>(base);
  auto* slots = reinterpret_cast<xs::shm::OrdinalSlot*>(base + xs::shm::slots_offset());
  const int peer = victim == 0 ? 1 : 0;
  if (field == "magic")
    store(c.magic, kGarbage64);
  else if (field == "world_size")
    store(c.world_size, kGarbage32);
  else if (field == "staging_bytes")
    store(c.staging_bytes, kGarbage64);
  else if (field == "arena_bytes")
    store(c.arena_bytes, kGarbage64);
  else if (field == "total_bytes")
    store(c.total_bytes, kGarbage64);
  else if (field == "launcher_pid")
    store(c.launcher_pid, static_cast<int32_t>(kGarbage32));
  else if (field == "launcher_start")
    store(c.launcher_start, kGarbage64);
  else if (field == "job_id")
    std::memset(c.job_id, 'x', sizeof c.job_id);
  else if (field == "poisoned")
    store(c.poisoned, kGarbage32);
  else if (field == "poison_claim")
    store(c.poison_claim, kGarbage32);
  else if (field == "poison_reason")
    std::memset(c.poison_reason, 'y', sizeof c.poison_reason);
  else if (field == "forged_poison") {  // a whole record blaming the peer, but not its pid
    store(c.poison_claim, 1u);
    std::snprintf(c.poison_reason, sizeof c.poison_reason, "forged by ordinal %d", victim);
    store(c.poisoned, static_cast<uint32_t>(peer + 1));
  }
  else if (field == "sleepers")
    store(c.sleepers, kGarbage32);
  else if (field == "barrier_count")
    store(c.barrier_count, kGarbage64);
  else if (field == "peer_pid")
    store(slots[peer].pid, static_cast<int32_t>(kGarbage32));
  else if (field == "peer_state")
    store(slots[peer].state, kGarbage32);
  else if (field == "peer_round")
    store(slots[peer].mailbox[0].round, kGarbage32);
  else
    throw xs::InvalidArgument("corrupt_replica: unknown --field " + field);
  std::printf("corrupt_replica: ordinal %d wrote garbage into %s\n", victim, field.c_str());
  std::fflush(stdout);
}

}  // namespace

// Overwrites the victim's published arena offset (inline payload bytes 8..15 of both
// mailboxes) with garbage until `stop`.
void scribble_mailbox_offsets(int victim, const std::atomic<bool>& stop) {
  const char* name = std::getenv("XLA_SPAWN_SEGMENT");
  if (name == nullptr) throw xs::InvalidArgument("corrupt_replica: no XLA_SPAWN_SEGMENT");
  bip::shared_memory_object object(bip::open_only, name, bip::read_write);
  bip::mapped_region region(object, bip::read_write);
  auto* base = static_cast<std::byte*>(region.get_address());
  auto* slots = reinterpret_cast<xs::shm::OrdinalSlot*>(base + xs::shm::slots_offset());
  while (!stop.load()) {
    for (xs::shm::Mailbox& box : slots[victim].mailbox) {
      std::memcpy(box.inline_data + 8, &kGarbage64, sizeof kGarbage64);
    }
  }
}

// The mailbox_arena_offset run: arena all-gathers until the job stops this replica.
int gather_while_scribbling(const Args& args, const xs::ReplicaContext& ctx,
                            xs::ShmCommunicator& comm) {
  constexpr size_t kElems = 4096;
  auto* in = static_cast<float*>(comm.alloc_buffer(kElems * sizeof(float)));
  std::vector<float> out(kElems * static_cast<size_t>(ctx.world_size));
  std::fill(in, in + kElems, static_cast<float>(ctx.ordinal));
  std::atomic<bool> stop{false};
  std::thread scribbler;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(args.hang_ms);
  for (int64_t i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
    if (i == args.after && ctx.ordinal == args.victim) {
      scribbler = std::thread(scribble_mailbox_offsets, args.victim, std::cref(stop));
      std::printf("corrupt_replica: ordinal %d wrote garbage into mailbox_arena_offset\n",
                  args.victim);
      std::fflush(stdout);
    }
    try {
      comm.all_gather(in, out.data(), kElems, xs::DType::kF32);
    } catch (...) {
      stop.store(true);
      if (scribbler.joinable()) scribbler.join();
      throw;
    }
  }
  stop.store(true);
  if (scribbler.joinable()) scribbler.join();
  return 0;
}

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const xs::ReplicaContext ctx = xs::ReplicaContext::from_env();
  xs::ShmCommunicator comm(
      xs::Segment::attach(ctx.segment_name, ctx.ordinal, ctx.world_size, ctx.job_id));
  if (args.field == "mailbox_arena_offset") return gather_while_scribbling(args, ctx, comm);
  std::vector<float> data(64, 1.0f);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(args.hang_ms);
  for (int64_t i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
    if (i == args.after && ctx.ordinal == args.victim) {
      scribble(args.field, args.victim);
      std::this_thread::sleep_until(deadline);  // a hung scribbler: others must not wait forever
      return 0;
    }
    comm.all_reduce(data.data(), data.size(), xs::DType::kF32, xs::ReduceOp::kMean);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "corrupt_replica: %s\n", e.what());
  return 1;
}
