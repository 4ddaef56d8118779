#include "examples/train_fmnist/fault_hook.h"

#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/collectives/communicator.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/runtime/runtime.h"

namespace xs::fmnist {
namespace {

// One write(2) and the signal: nothing that allocates or locks after the decision.
[[noreturn]] void die(const std::string& why) {
  const std::string line = fmt::format("fault hook: ordinal {} SIGKILL {}\n", xm::ordinal(), why);
  [[maybe_unused]] const ssize_t n = ::write(2, line.data(), line.size());
  ::kill(::getpid(), SIGKILL);
  for (;;) ::pause();
}

FaultPoint parse_point(std::string_view name, const std::string& value) {
  if (name == "forward") return FaultPoint::kForward;
  if (name == "allreduce") return FaultPoint::kAllReduce;
  if (name == "checkpoint") return FaultPoint::kCheckpoint;
  if (name == "sleep") return FaultPoint::kSleep;
  if (name == "slow") return FaultPoint::kSlow;
  throw InvalidArgument(fmt::format("{}='{}': expected forward|allreduce|checkpoint|sleep@ORDINAL:STEP "
                                    "or slow@ORDINAL:MILLISECONDS",
                                    kTestFaultEnv, value));
}

// Waits (at most 60 s) for a file named ".<base>.tmp.*" (replica/detail/atomic_file.h) to be
// created in the checkpoint's directory, then SIGKILLs the process mid-write.
void kill_on_temporary(int inotify_fd, std::string prefix, std::string dir) {
  alignas(inotify_event) char buffer[4096];
  pollfd p{inotify_fd, POLLIN, 0};
  while (::poll(&p, 1, 60'000) > 0) {
    const ssize_t n = ::read(inotify_fd, buffer, sizeof buffer);
    for (ssize_t off = 0; off < n;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + off);
      off += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
      if (event->len == 0 || std::strncmp(event->name, prefix.c_str(), prefix.size()) != 0)
        continue;
      const std::string temp = dir + "/" + event->name;
      struct stat st {};
      const bool present = ::stat(temp.c_str(), &st) == 0;
      die(fmt::format("{} the checkpoint write (temporary {} {}, {} bytes)",
                      present ? "during" : "after", temp, present ? "present" : "gone",
                      present ? st.st_size : 0));
    }
  }
}

}  // namespace

// Forwards every call to the runtime's communicator; on the target step's first gradient
// exchange (all_reduce, or reduce_scatter under the sharded update) a thread SIGKILLs the
// process while the call runs (it says whether the call had returned).
struct FaultHook::Wrapper final : Communicator {
  Wrapper(FaultHook& hook, Communicator& inner) : hook_(hook), inner_(inner) {}
  int ordinal() const override { return inner_.ordinal(); }
  int world_size() const override { return inner_.world_size(); }
  void all_reduce(void* data, size_t n_elems, DType dtype, ReduceOp op) override {
    run_or_die("", n_elems, [&] { inner_.all_reduce(data, n_elems, dtype, op); });
  }
  // `how` tells the sharded update's reduce-scatter apart; the message still says all_reduce
  // (scripts/fault-inject and tests/reliability look for "inside all_reduce", "all_reduce of").
  template <typename Call>
  void run_or_die(const char* how, size_t n_elems, const Call& call) {
    if (hook_.step() != hook_.target_step_ || fired_.exchange(true)) return call();
    inside_.store(true);
    std::thread killer([this, how, n_elems] {
      die(fmt::format("{} all_reduce of {} elements{} on step {}",
                      inside_.load() ? "inside" : "after", n_elems, how, hook_.step()));
    });
    call();
    inside_.store(false);
    killer.join();  // never returns: the killer ends the process
  }
  void broadcast(void* data, size_t n_elems, DType dtype, int root) override {
    inner_.broadcast(data, n_elems, dtype, root);
  }
  void all_gather(const void* in, void* out, size_t n_elems, DType dtype) override {
    inner_.all_gather(in, out, n_elems, dtype);
  }
  void all_gather_pieces(const void* in, std::span<const GatherPiece> pieces, size_t n_elems,
                         DType dtype) override {
    inner_.all_gather_pieces(in, pieces, n_elems, dtype);
  }
  void reduce_scatter(const void* in, void* out, size_t n_elems, DType dtype,
                      ReduceOp op) override {
    run_or_die(" (the sharded update's reduce_scatter)", n_elems,
               [&] { inner_.reduce_scatter(in, out, n_elems, dtype, op); });
  }
  void barrier() override { inner_.barrier(); }
  std::vector<std::vector<std::byte>> rendezvous(const std::string& tag,
                                                 std::span<const std::byte> payload) override {
    return inner_.rendezvous(tag, payload);
  }

  // Operands stay where the real communicator puts them (its zero-copy arena).
  void* alloc_buffer(size_t bytes) override { return inner_.alloc_buffer(bytes); }
  void free_buffer(void* data) override { inner_.free_buffer(data); }

  FaultHook& hook_;
  Communicator& inner_;
  std::atomic<bool> fired_{false}, inside_{false};
};

std::unique_ptr<FaultHook> FaultHook::from_env(const std::string& checkpoint_path) {
  std::unique_ptr<FaultHook> hook(new FaultHook());
  const std::optional<std::string> value = env_string(kTestFaultEnv);
  if (!value || xm::context().attempt != 0) return hook;
  const size_t at = value->find('@'), colon = value->find(':');
  if (at == std::string::npos || colon == std::string::npos || colon < at) {
    parse_point("", *value);  // throws with the expected form
  }
  const FaultPoint point = parse_point(std::string_view(*value).substr(0, at), *value);
  const int64_t ordinal =
      parse_int(std::string_view(*value).substr(at + 1, colon - at - 1), 0, 1 << 20, kTestFaultEnv);
  hook->target_step_ =
      parse_int(std::string_view(*value).substr(colon + 1), 0, int64_t{1} << 40, kTestFaultEnv);
  if (point == FaultPoint::kSlow && hook->target_step_ > 1000) {
    throw InvalidArgument(fmt::format("{}='{}': slow's delay is at most 1000 ms", kTestFaultEnv, *value));
  }
  if (ordinal != xm::ordinal()) return hook;
  hook->point_ = point;
  hook->checkpoint_path_ = checkpoint_path;
  if (point == FaultPoint::kAllReduce) {
    hook->wrapper_ = std::make_unique<Wrapper>(*hook, xm::communicator());
    runtime().set_communicator(hook->wrapper_.get());
  }
  return hook;
}

FaultHook::~FaultHook() {
  if (wrapper_ && runtime().communicator() == wrapper_.get()) {
    runtime().set_communicator(&wrapper_->inner_);
  }
}

void FaultHook::at_forward(int64_t step) {
  step_.store(step);
  if (point_ == FaultPoint::kForward && step == target_step_) {
    die(fmt::format("in the forward pass of step {}", step));
  }
  if (point_ == FaultPoint::kSleep && step == target_step_) {
    std::fprintf(stderr, "fault hook: ordinal %d sleeps in the forward pass of step %lld\n",
                 xm::ordinal(), static_cast<long long>(step));
    std::this_thread::sleep_for(std::chrono::minutes(10));  // the job's timeouts end it first
  }
  if (point_ == FaultPoint::kSlow) std::this_thread::sleep_for(std::chrono::milliseconds(target_step_));
}

void FaultHook::before_save(int64_t step) {
  if (point_ != FaultPoint::kCheckpoint || step != target_step_ || checkpoint_path_.empty()) return;
  const size_t slash = checkpoint_path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : checkpoint_path_.substr(0, slash);
  const std::string base =
      slash == std::string::npos ? checkpoint_path_ : checkpoint_path_.substr(slash + 1);
  const int fd = ::inotify_init1(IN_CLOEXEC);
  if (fd < 0 || ::inotify_add_watch(fd, dir.c_str(), IN_CREATE) < 0) {
    throw IoError(errno_message(fmt::format("{}: inotify on {}", kTestFaultEnv, dir), errno));
  }
  // Detached: it ends the process, or gives up after its 60 s poll.
  std::thread(kill_on_temporary, fd, fmt::format(".{}.tmp.", base), dir).detach();
}

}  // namespace xs::fmnist
