// The `xla_spawn._c10d` extension: a torch.distributed backend (a c10d ProcessGroup of
// PyTorch 1.13) whose collectives are the job's shared-memory ones, so that under
// `xla-spawn -n N -- python3 train.py` an unmodified DDP script runs them after
//
//   import xla_spawn                       # registers the backend when torch is installed
//   dist.init_process_group("xla_spawn")
//
// Every operation runs to completion in the calling thread and returns finished Work. Tensors
// must be CPU tensors, any layout (a non-contiguous one goes through a contiguous copy);
// reductions take float32, float64, bfloat16, int32 or int64, broadcast and allgather any
// dtype (moved as bytes). The storage of a tensor all-reduced a second time (DDP's gradient
// buckets) is registered with the communicator, zero-copy from then on (Registrations
// below). Operations this backend lacks
// (reduce, gather, scatter, all-to-all, send/recv, sub-groups, product and bitwise ops)
// raise an error that names them.
#include <pybind11/pybind11.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "python/comm_api.h"
#include "xla_spawn/base/dtype.h"

namespace py = pybind11;

namespace {

const char* kind_name(int kind) {
  switch (kind) {
    case kXsInvalidArgument: return "invalid argument";
    case kXsIoError: return "I/O error";
    case kXsPeerFailure: return "peer failure";
    case kXsTimeout: return "timeout";
    case kXsInternalError: return "internal error";
    case kXsInterrupted: return "interrupted";
    default: return "error";
  }
}

// Storages registered with the communicator (register_buffer), so that their all-reduces are
// zero-copy. A storage is registered the second time a tensor on it is all-reduced (one used
// once is not worth the copy registering makes). The group holds a reference to each: its
// memory cannot be freed while registered. One that only this reference keeps alive, or whose
// memory moved (a resize), is deregistered and let go at the next all-reduce.
class Registrations {
 public:
  static constexpr size_t kMinBytes = size_t{24} << 10;  // 16 KiB of whole pages, and its ends
  static constexpr size_t kMaxSeen = 64;

  explicit Registrations(const XsCommApi* api) : api_(api) {}

  // XLA_SPAWN_REGISTER_TENSORS=0 registers nothing: every fork then skips copying the
  // registered storages (a memcpy of each, per fork), and the all-reduces take the heap path.
  static bool enabled() {
    static const bool on = [] {
      const char* v = std::getenv("XLA_SPAWN_REGISTER_TENSORS");
      const std::string value = v == nullptr ? "1" : v;
      TORCH_CHECK(value == "0" || value == "1", "xla_spawn backend: XLA_SPAWN_REGISTER_TENSORS=",
                  value, ": expected 0 or 1");
      return value == "1";
    }();
    return on;
  }
  ~Registrations() {
    for (const Entry& e : entries_) deregister(e);  // fails quietly once the job is left
  }

  // Before t's all-reduce.
  void note(const at::Tensor& t) {
    if (!enabled()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    collect();
    const c10::Storage& storage = t.storage();
    if (storage.nbytes() < kMinBytes || storage.data() == nullptr) return;
    for (const Entry& e : entries_) {
      if (e.storage.unsafeGetStorageImpl() == storage.unsafeGetStorageImpl()) return;
    }
    auto seen = std::find_if(seen_.begin(), seen_.end(), [&](const Seen& s) {
      return s.storage.lock().get() == storage.unsafeGetStorageImpl();
    });
    if (seen == seen_.end()) {
      if (seen_.size() == kMaxSeen) seen_.erase(seen_.begin());
      seen_.push_back({storage.getWeakStorageImpl(), false});
      return;
    }
    if (seen->refused) return;
    int registered = 0;
    XsCommError error;
    if (api_->register_buffer(storage.data(), storage.nbytes(), &registered, &error) != kXsOk ||
        registered == 0) {
      seen->refused = true;  // stays an ordinary operand
      return;
    }
    entries_.push_back({storage, storage.data(), storage.nbytes()});
    seen_.erase(seen);
  }

 private:
  struct Entry {
    c10::Storage storage;
    void* data;
    size_t bytes;
  };
  struct Seen {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    bool refused;
  };

  // Lets go of what only this table keeps alive, or whose memory moved; forgets the dead.
  void collect() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->storage.use_count() > 1 && it->storage.data() == it->data &&
          it->storage.nbytes() == it->bytes) {
        ++it;
        continue;
      }
      deregister(*it);
      it = entries_.erase(it);
    }
    seen_.erase(std::remove_if(seen_.begin(), seen_.end(),
                               [](const Seen& s) { return s.storage.expired(); }),
                seen_.end());
  }

  void deregister(const Entry& e) {
    XsCommError error;
    api_->deregister_buffer(e.data, &error);
  }

  const XsCommApi* api_;
  std::mutex mutex_;
  std::vector<Entry> entries_;
  std::vector<Seen> seen_;
};

class ProcessGroupXlaSpawn : public c10d::ProcessGroup {
 public:
  ProcessGroupXlaSpawn(const XsCommApi* api, int rank, int size)
      : ProcessGroup(rank, size), api_(api), registrations_(api) {}

  const std::string getBackendName() const override { return "xla_spawn"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const xs::ReduceOp op = reduce_op("allreduce", opts.reduceOp);
    for (at::Tensor& t : tensors) {
      in_place("allreduce", t, [&](at::Tensor& c) {
        registrations_.note(c);
        call("allreduce", [&](XsCommError* e) {
          return api_->all_reduce(c.data_ptr(), c.numel(), dtype("allreduce", c), int(op), e);
        });
      });
    }
    return done(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return allreduce(tensors, opts);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    TORCH_CHECK(opts.rootTensor == 0 && tensors.size() == 1,
                "xla_spawn backend: broadcast takes one tensor per process (got ",
                tensors.size(), ", root tensor ", opts.rootTensor, ")");
    in_place("broadcast", tensors[0], [&](at::Tensor& c) {
      call("broadcast", [&](XsCommError* e) {
        const Moved m = moved(c);
      return api_->broadcast(c.data_ptr(), m.count, m.dtype, static_cast<int>(opts.rootRank), e);
      });
    });
    return done(tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    TORCH_CHECK(inputs.size() == 1 && outputs.size() == 1,
                "xla_spawn backend: allgather takes one input tensor per process");
    const at::Tensor input = cpu("allgather", inputs[0]).contiguous();
    std::vector<at::Tensor>& out = outputs[0];
    TORCH_CHECK(static_cast<int>(out.size()) == getSize(), "xla_spawn backend: allgather needs ",
                getSize(), " output tensors, got ", out.size());
    at::Tensor flat = at::empty({getSize(), input.numel()}, input.options());
    gather_into(input, flat);
    for (int k = 0; k < getSize(); ++k) {
      TORCH_CHECK(out[k].numel() == input.numel() && out[k].scalar_type() == input.scalar_type(),
                  "xla_spawn backend: allgather output ", k, " does not match the input");
      out[k].copy_(flat[k].view(out[k].sizes()));
    }
    return done(out);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    const at::Tensor in = cpu("_allgather_base", input).contiguous();
    TORCH_CHECK(output.numel() == in.numel() * getSize() &&
                    output.scalar_type() == in.scalar_type(),
                "xla_spawn backend: _allgather_base output must hold world size times the input");
    in_place("_allgather_base", output, [&](at::Tensor& c) { gather_into(in, c); });
    std::vector<at::Tensor> result{output};
    return done(result);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    TORCH_CHECK(outputs.size() == 1 && inputs.size() == 1,
                "xla_spawn backend: reduce_scatter takes one output tensor per process");
    TORCH_CHECK(static_cast<int>(inputs[0].size()) == getSize(),
                "xla_spawn backend: reduce_scatter needs ", getSize(), " input tensors, got ",
                inputs[0].size());
    std::vector<at::Tensor> flat_inputs;
    for (size_t k = 0; k < inputs[0].size(); ++k) {
      const at::Tensor& t = cpu("reduce_scatter", inputs[0][k]);
      // Rank k's chunk: a list of other sizes would reduce chunks across the ranks' borders.
      TORCH_CHECK(t.numel() == outputs[0].numel() && t.scalar_type() == outputs[0].scalar_type(),
                  "xla_spawn backend: reduce_scatter input ", k, " must have the output's ",
                  outputs[0].numel(), " elements of ", outputs[0].scalar_type(), "; got ",
                  t.numel(), " of ", t.scalar_type());
      flat_inputs.push_back(t.reshape({-1}));
    }
    at::Tensor input = at::cat(flat_inputs);
    scatter_into(input, outputs[0], opts.reduceOp);
    return done(outputs);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    scatter_into(cpu("_reduce_scatter_base", input).contiguous(), output, opts.reduceOp);
    std::vector<at::Tensor> result{output};
    return done(result);
  }

  // torch's own message for this one lacks a space ("xla_spawndoes not support reduce").
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>&, const c10d::ReduceOptions&) override {
    TORCH_CHECK(false, "xla_spawn backend does not support reduce (all_reduce is supported)");
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    call("barrier", [&](XsCommError* e) { return api_->barrier(e); });
    std::vector<at::Tensor> none;
    return done(none);
  }

 private:
  // Runs one call of the table; its error becomes a c10::Error (RuntimeError in Python), or,
  // when a signal handler raised during the call (Ctrl-C), what the handler raised.
  template <typename Call>
  void call(const char* what, Call body) {
    XsCommError error;
    const int kind = body(&error);
    if (kind == kXsInterrupted) {
      python_error raised;
      {
        py::gil_scoped_acquire gil;
        api_->restore_interrupt(error.message);
        raised.persist();
      }
      throw raised;
    }
    TORCH_CHECK(kind == kXsOk, "xla_spawn backend: ", what, ": ", kind_name(kind), ": ",
                error.message);
  }

  const at::Tensor& cpu(const char* what, const at::Tensor& t) const {
    TORCH_CHECK(t.layout() == at::kStrided, "xla_spawn backend: ", what,
                " takes dense tensors; got a ", t.layout(), " one (sparse tensors are not supported)");
    TORCH_CHECK(t.device().is_cpu(), "xla_spawn backend: ", what,
                " takes CPU tensors; got one on ", t.device());
    return t;
  }

  // The project's dtype of a tensor, or none for dtypes the collectives do not reduce.
  static std::optional<xs::DType> our_dtype(const at::Tensor& t) {
    switch (t.scalar_type()) {
      case at::kFloat: return xs::DType::kF32;
      case at::kDouble: return xs::DType::kF64;
      case at::kBFloat16: return xs::DType::kBF16;
      case at::kInt: return xs::DType::kI32;
      case at::kLong: return xs::DType::kI64;
      default: return std::nullopt;
    }
  }

  int dtype(const char* what, const at::Tensor& t) const {
    const std::optional<xs::DType> d = our_dtype(t);
    TORCH_CHECK(d.has_value(), "xla_spawn backend: ", what, " does not support dtype ",
                t.scalar_type(), " (float32, float64, bfloat16, int32, int64 are supported)");
    return int(*d);
  }

  // broadcast and allgather only move data: a tensor of another dtype (uint8 for
  // all_gather_object, bool, float16, ...) goes as its bytes.
  struct Moved {
    size_t count;
    int dtype;
  };
  static Moved moved(const at::Tensor& t) {
    const std::optional<xs::DType> d = our_dtype(t);
    if (d) return {size_t(t.numel()), int(*d)};
    return {size_t(t.numel()) * t.element_size(), int(xs::DType::kBool)};
  }

  static xs::ReduceOp reduce_op(const char* what, const c10d::ReduceOp& op) {
    switch (op.op_) {
      case c10d::ReduceOp::SUM: return xs::ReduceOp::kSum;
      case c10d::ReduceOp::AVG: return xs::ReduceOp::kMean;
      case c10d::ReduceOp::MAX: return xs::ReduceOp::kMax;
      case c10d::ReduceOp::MIN: return xs::ReduceOp::kMin;
      case c10d::ReduceOp::PRODUCT:
      case c10d::ReduceOp::BAND:
      case c10d::ReduceOp::BOR:
      case c10d::ReduceOp::BXOR:
      case c10d::ReduceOp::PREMUL_SUM:
      case c10d::ReduceOp::UNUSED: break;
    }
    TORCH_CHECK(false, "xla_spawn backend: ", what, " does not support reduce op ",
                static_cast<int>(op.op_), " (SUM, AVG, MAX and MIN are supported)");
  }

  // Runs `body` on `t` itself when it is contiguous, else on a contiguous copy that is then
  // copied back.
  template <typename Body>
  void in_place(const char* what, at::Tensor& t, Body body) {
    cpu(what, t);
    if (t.is_contiguous()) {
      body(t);
      return;
    }
    at::Tensor c = t.contiguous();
    body(c);
    t.copy_(c);
  }

  // `out` (contiguous, world size times `in`'s elements) gets every process's `in`.
  void gather_into(const at::Tensor& in, at::Tensor& out) {
    call("allgather", [&](XsCommError* e) {
      const Moved m = moved(in);
      return api_->all_gather(in.data_ptr(), out.data_ptr(), m.count, m.dtype, e);
    });
  }

  // `out` gets this process's chunk of `in` (contiguous) reduced over the processes.
  void scatter_into(const at::Tensor& in, at::Tensor& out, const c10d::ReduceOp& op) {
    const xs::ReduceOp reduce = reduce_op("reduce_scatter", op);
    TORCH_CHECK(in.numel() == out.numel() * getSize() && in.scalar_type() == out.scalar_type(),
                "xla_spawn backend: reduce_scatter input must hold world size times the output");
    in_place("reduce_scatter", out, [&](at::Tensor& c) {
      call("reduce_scatter", [&](XsCommError* e) {
        return api_->reduce_scatter(in.data_ptr(), c.data_ptr(), c.numel(),
                                    dtype("reduce_scatter", c), int(reduce), e);
      });
    });
  }

  // Finished Work: result() gives `tensors`, and its future holds them (what DDP's reducer
  // reads back). Work::create_from_future's result() expects a Python object in the future
  // and failed an internal assert in torch.
  class DoneWork : public c10d::Work {
   public:
    explicit DoneWork(std::vector<at::Tensor> tensors)
        : tensors_(std::move(tensors)),
          future_(c10::make_intrusive<c10::ivalue::Future>(
              c10::ListType::create(c10::TensorType::get()))) {
      future_->markCompleted(c10::IValue(tensors_));
      finish();
    }
    std::vector<at::Tensor> result() override { return tensors_; }
    c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

   private:
    std::vector<at::Tensor> tensors_;
    c10::intrusive_ptr<c10::ivalue::Future> future_;
  };
  static c10::intrusive_ptr<c10d::Work> done(std::vector<at::Tensor>& tensors) {
    return c10::make_intrusive<DoneWork>(tensors);
  }

  const XsCommApi* api_;
  Registrations registrations_;
};

const XsCommApi* comm_api() {
  const auto* api = static_cast<const XsCommApi*>(PyCapsule_Import(kXsCommApiCapsule, 0));
  if (api == nullptr) throw py::error_already_set();
  TORCH_CHECK(api->version == kXsCommApiVersion, "xla_spawn backend: xla_spawn._core has table "
              "version ", api->version, ", this backend was built for ", kXsCommApiVersion);
  return api;
}

// torch.distributed's creator signature: (store, rank, world_size, timeout). The store and
// timeout are not used: the job's segment is the meeting point, and its collectives have the
// launcher's deadline (--timeout).
c10::intrusive_ptr<c10d::ProcessGroup> create(const py::object& /*store*/, int rank, int size,
                                              const py::object& /*timeout*/) {
  const XsCommApi* api = comm_api();
  int ordinal = 0;
  int world = 0;
  XsCommError error;
  const int kind = api->context(&ordinal, &world, &error);
  TORCH_CHECK(kind == kXsOk, "xla_spawn backend: ", kind_name(kind), ": ", error.message);
  TORCH_CHECK(rank == ordinal && size == world, "xla_spawn backend: the group of rank ", rank,
              " of ", size, " is not the job's (ordinal ", ordinal, " of ", world,
              "); only the whole job is supported, not sub-groups, and RANK/WORLD_SIZE must "
              "be those xla-spawn set");
  return c10::make_intrusive<ProcessGroupXlaSpawn>(api, rank, size);
}

}  // namespace

PYBIND11_MODULE(_c10d, m) {
  m.doc() = "torch.distributed backend 'xla_spawn' on the job's shared-memory collectives";
  py::module_::import("torch.distributed");  // registers c10d.ProcessGroup, our base
  py::class_<ProcessGroupXlaSpawn, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupXlaSpawn>>(
      m, "ProcessGroupXlaSpawn");
  m.def("create", &create, py::arg("store"), py::arg("rank"), py::arg("world_size"),
        py::arg("timeout"));
}
