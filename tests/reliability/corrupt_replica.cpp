// corrupt_replica: a replica for the control-block tests. Every ordinal runs small
// all-reduces; after --after iterations the --victim ordinal maps the job's segment itself and
// writes garbage into one --field of the control block or a slot, then stops taking part
// (sleeps up to --hang-ms), as a buggy or hostile replica would. The others must see a clear
// error (the launcher's control-block check), never read out of bounds.
//
//   xla-spawn -n 3 -- corrupt_replica --field staging_bytes --victim 1 --after 20

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "base/env.h"
#include "base/error.h"
#include "collectives/shm_communicator.h"
#include "replica/context.h"
#include "shm/layout.h"

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
  else if (field == "job_id")
    std::memset(c.job_id, 'x', sizeof c.job_id);
  else if (field == "poisoned")
    store(c.poisoned, kGarbage32);
  else if (field == "poison_claim")
    store(c.poison_claim, kGarbage32);
  else if (field == "poison_reason")
    std::memset(c.poison_reason, 'y', sizeof c.poison_reason);
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

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  const xs::ReplicaContext ctx = xs::ReplicaContext::from_env();
  xs::ShmCommunicator comm(
      xs::Segment::attach(ctx.segment_name, ctx.ordinal, ctx.world_size, ctx.job_id));
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
