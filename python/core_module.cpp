// The `xla_spawn._core` extension: who this replica is, and the job's collectives in place on
// any object with the buffer protocol (NumPy arrays, torch.Tensor.numpy() views, bytearray),
// without copies, through the communicator xs::xm::init builds from the launcher's
// environment. The package's __init__.py wraps it (python/xla_spawn/__init__.py).
//
//   import numpy as np, xla_spawn as xs
//   grads = np.ones(1024, np.float32)
//   xs.all_reduce(grads, "mean")          # every replica now holds the mean
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "python/comm_api.h"
#include "xla_spawn/base/dtype.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/context.h"
#include "xla_spawn/replica/xm.h"
#include "xla_spawn/shm/wait.h"

namespace py = pybind11;

namespace {

// Serialises every call on the communicator: collectives from several Python threads (the
// GIL is released while one runs) would otherwise interleave inside the shared rounds and
// corrupt each other's results, and shutdown() would free it under a waiting call. Callers
// from Python release the GIL before taking it (Locked below).
std::timed_mutex g_mutex;
// Set by shutdown(): the process has left its job. Attaching again would restart the call
// count at 1 against peers that did not, and mix one call's data into another's.
bool g_shut_down = false;
// The process that attached the job: a process forked from it takes no part in the job, and
// may have inherited g_mutex held by a thread that does not exist in it.
std::atomic<pid_t> g_owner_pid{0};

// With g_mutex held.
xs::Communicator& communicator() {
  if (g_shut_down) {
    throw xs::InvalidArgument(
        "xla_spawn: shutdown() was called: this process has left its job and cannot rejoin it");
  }
  xs::xm::init();  // idempotent: the first call attaches the job
  g_owner_pid = ::getpid();
  return xs::xm::communicator();
}

bool forked_from_owner() {
  const pid_t owner = g_owner_pid.load();
  return owner != 0 && owner != ::getpid();
}

void check_not_forked() {
  if (forked_from_owner()) {
    throw xs::InvalidArgument(fmt::format(
        "xla_spawn: this process was forked from pid {}, which owns the communicator; only that "
        "process may call its collectives",
        g_owner_pid.load()));
  }
}

// Ctrl-C inside a collective. Python runs its signal handlers only between bytecodes, so a
// replica waiting for a peer would hear Ctrl-C only when the peer came (and then print a
// garbled traceback). The main thread's waits run them instead (shm/wait.h's interrupt
// check): when a handler raises (KeyboardInterrupt), the wait gives up, the job is poisoned,
// and the call raises what the handler raised. Main thread only: Python runs handlers there.
thread_local PyObject* t_pending_type = nullptr;  // what the handler raised, until restored
thread_local PyObject* t_pending_value = nullptr;
thread_local PyObject* t_pending_traceback = nullptr;
thread_local bool t_in_call = false;  // this thread is inside a call of this module
thread_local bool t_hears_signals = false;  // the thread that runs Python's signal handlers

void run_python_signal_handlers() {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() == 0) return;
  Py_XDECREF(t_pending_type);
  Py_XDECREF(t_pending_value);
  Py_XDECREF(t_pending_traceback);
  PyErr_Fetch(&t_pending_type, &t_pending_value, &t_pending_traceback);
  throw xs::Interrupted(fmt::format(
      "interrupted: a signal handler raised {}",
      t_pending_type != nullptr ? reinterpret_cast<PyTypeObject*>(t_pending_type)->tp_name
                                : "an exception"));
}

// With the GIL: raises in Python what the handler raised, or KeyboardInterrupt with `message`
// when that was restored already.
void restore_interrupt(const char* message) {
  if (t_pending_type == nullptr) {
    PyErr_SetString(PyExc_KeyboardInterrupt, message);
    return;
  }
  PyErr_Restore(t_pending_type, t_pending_value, t_pending_traceback);
  t_pending_type = t_pending_value = t_pending_traceback = nullptr;
}

// For the length of one call. A signal handler that calls again from inside the call's wait
// would wait for the lock its own thread holds: refused.
struct InCall {
  InCall() {
    if (t_in_call) {
      throw xs::InvalidArgument(
          "xla_spawn: called from a signal handler while this thread is inside another call");
    }
    t_in_call = true;
  }
  ~InCall() { t_in_call = false; }
  InCall(const InCall&) = delete;
  InCall& operator=(const InCall&) = delete;
};

// Arrays from alloc_buffer not yet given back to the arena: shutdown() would unmap the arena
// under them, so it refuses while any is alive.
std::atomic<int> g_live_buffers{0};
// Arrays whose last view went while g_mutex was held (by a call of another thread, or by the
// call a signal handler interrupted): their destructor cannot wait for it with the GIL held,
// so the next holder frees them. g_orphans_mutex is held only to add or take them.
std::mutex g_orphans_mutex;
std::vector<void*> g_orphans;

// With g_mutex held. After abandon() (a daemon thread was inside a call at exit) the arena
// goes with the process: nothing to give back.
void free_buffer_now(void* p) {
  if (!g_shut_down && xs::xm::initialized()) xs::xm::communicator().free_buffer(p);
  --g_live_buffers;
}

void free_orphans() {
  std::vector<void*> orphans;
  {
    const std::lock_guard<std::mutex> lock(g_orphans_mutex);
    orphans.swap(g_orphans);
  }
  for (void* p : orphans) free_buffer_now(p);
}

// An alloc_buffer array's destructor, with the GIL held: frees it at once when g_mutex is
// free, else leaves it to the next holder. In a forked child nothing is freed: the arena's
// blocks are the replica's.
void release_buffer(void* p) noexcept {
  if (forked_from_owner()) return;
  try {
    // Not on a thread inside a call (a signal handler's): it may hold g_mutex itself.
    std::unique_lock<std::timed_mutex> lock(g_mutex, std::defer_lock);
    if (!t_in_call && lock.try_lock()) {
      free_orphans();
      free_buffer_now(p);
      return;
    }
    const std::lock_guard<std::mutex> orphans(g_orphans_mutex);
    g_orphans.push_back(p);
  } catch (const std::exception& e) {
    PyErr_WarnEx(PyExc_RuntimeWarning,
                 fmt::format("xla_spawn: freeing an alloc_buffer array: {}", e.what()).c_str(), 1);
  }
}

// g_mutex for one call, after a call another thread is in. Meanwhile the thread that runs
// Python's signal handlers runs them, as a collective's wait does, so that Ctrl-C is heard
// (no call has begun: nothing is poisoned). A forked child is refused before it would wait
// for a lock it may have inherited held.
std::unique_lock<std::timed_mutex> take_lock() {
  check_not_forked();
  std::unique_lock<std::timed_mutex> lock(g_mutex, std::defer_lock);
  while (!lock.try_lock_for(xs::kInterruptCheckInterval)) {
    if (t_hears_signals) run_python_signal_handlers();
  }
  free_orphans();
  return lock;
}

// The GIL released, then g_mutex held, for one call from Python.
struct Locked {
  InCall in_call;
  py::gil_scoped_release release;
  std::unique_lock<std::timed_mutex> lock = take_lock();
};

xs::ReduceOp parse_op(std::string_view op) {
  if (op == "sum") return xs::ReduceOp::kSum;
  if (op == "mean") return xs::ReduceOp::kMean;
  if (op == "max") return xs::ReduceOp::kMax;
  if (op == "min") return xs::ReduceOp::kMin;
  throw xs::InvalidArgument(
      fmt::format("reduce op '{}': expected 'sum', 'mean', 'max' or 'min'", op));
}

// A C-contiguous view of a Python buffer for the length of one call, with its element type.
// `arithmetic` calls (reductions) need one of the project's dtypes; the others move bytes and
// take any element type.
class BufferView {
 public:
  BufferView(py::handle object, bool writable, const char* call, const char* argument,
             const std::string& dtype_name, bool arithmetic)
      : call_(call), argument_(argument) {
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object.ptr(), &view_, flags) != 0) {
      py::error_already_set e;
      py::raise_from(e, PyExc_ValueError,
                     fmt::format("{}: {} must be a{} C-contiguous buffer (NumPy array, "
                                 "bytearray, memoryview, torch.Tensor.numpy())",
                                 call, argument, writable ? " writable" : "")
                         .c_str());
      throw py::error_already_set();
    }
    try {
      resolve_dtype(dtype_name, arithmetic);
    } catch (...) {
      PyBuffer_Release(&view_);
      throw;
    }
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  void* data() const { return view_.buf; }
  size_t bytes() const { return static_cast<size_t>(view_.len); }
  xs::DType dtype() const { return dtype_; }
  size_t n_elems() const { return bytes() / xs::dtype_size(dtype_); }
  std::string describe() const {
    if (as_bytes_) return fmt::format("{} of {} bytes", argument_, bytes());
    return fmt::format("{} of {} {} elements", argument_, n_elems(), xs::dtype_name(dtype_));
  }

 private:
  void resolve_dtype(const std::string& dtype_name, bool arithmetic) {
    const size_t item = static_cast<size_t>(view_.itemsize);
    std::string_view format = view_.format != nullptr ? view_.format : "B";
    if (format.find('O') != std::string_view::npos) {  // Python object pointers: not data
      throw xs::InvalidArgument(fmt::format(
          "{}: {} holds Python objects (format '{}'); only plain data can be exchanged", call_,
          argument_, format));
    }
    if (!format.empty() && std::string_view("@=<").find(format[0]) != std::string_view::npos) {
      format.remove_prefix(1);
    }
    if (!dtype_name.empty()) {
      if (dtype_name != "bf16" && dtype_name != "bfloat16") {
        throw xs::InvalidArgument(fmt::format(
            "{}: dtype='{}': only 'bf16' may be named (the others follow the buffer's format)",
            call_, dtype_name));
      }
      if (item != 2) {
        throw xs::InvalidArgument(fmt::format(
            "{}: dtype='bf16' needs 2-byte elements; {} has {}-byte elements", call_, argument_,
            item));
      }
      dtype_ = xs::DType::kBF16;
      return;
    }
    const bool signed_int = format == "i" || format == "l" || format == "q";
    if (format == "f" && item == 4) dtype_ = xs::DType::kF32;
    else if (format == "d" && item == 8) dtype_ = xs::DType::kF64;
    else if (signed_int && item == 4) dtype_ = xs::DType::kI32;
    else if (signed_int && item == 8) dtype_ = xs::DType::kI64;
    else if (format == "?" && item == 1 && !arithmetic) dtype_ = xs::DType::kBool;
    else if (!arithmetic) {
      dtype_ = xs::DType::kBool;  // moved as bytes: any element type
      as_bytes_ = true;
    } else {
      throw xs::InvalidArgument(fmt::format(
          "{}: {} has elements of format '{}' ({} bytes); reductions take float32, float64, "
          "int32, int64, or bf16 held as 2-byte elements with dtype='bf16'",
          call_, argument_, format, item));
    }
  }

  Py_buffer view_{};
  const char* call_;
  const char* argument_;
  xs::DType dtype_ = xs::DType::kBool;
  bool as_bytes_ = false;  // not one of the project's dtypes: moved as bytes
};

void all_reduce(py::handle data, const std::string& op, const std::string& dtype) {
  const BufferView view(data, true, "all_reduce", "data", dtype, true);
  const xs::ReduceOp reduce = parse_op(op);
  Locked locked;
  communicator().all_reduce(view.data(), view.n_elems(), view.dtype(), reduce);
}

void broadcast(py::handle data, int root, const std::string& dtype) {
  const BufferView view(data, true, "broadcast", "data", dtype, false);
  Locked locked;
  communicator().broadcast(view.data(), view.n_elems(), view.dtype(), root);
}

// The operands of all_gather and reduce_scatter: `large` holds world size times `small`'s
// elements of the same dtype (the communicator refuses overlaps other than in place).
void check_chunked(const char* call, const BufferView& small, const BufferView& large,
                   const xs::Communicator& comm) {
  const auto world = static_cast<size_t>(comm.world_size());
  if (large.dtype() != small.dtype() || large.n_elems() != world * small.n_elems()) {
    throw xs::InvalidArgument(fmt::format("{}: {} must be world size {} times {}", call,
                                          large.describe(), world, small.describe()));
  }
}

void all_gather(py::handle in, py::handle out, const std::string& dtype) {
  const BufferView input(in, false, "all_gather", "input", dtype, false);
  const BufferView output(out, true, "all_gather", "output", dtype, false);
  Locked locked;
  xs::Communicator& comm = communicator();
  check_chunked("all_gather", input, output, comm);
  comm.all_gather(input.data(), output.data(), input.n_elems(), input.dtype());
}

void reduce_scatter(py::handle in, py::handle out, const std::string& op,
                    const std::string& dtype) {
  const BufferView input(in, false, "reduce_scatter", "input", dtype, true);
  const BufferView output(out, true, "reduce_scatter", "output", dtype, true);
  const xs::ReduceOp reduce = parse_op(op);
  Locked locked;
  xs::Communicator& comm = communicator();
  check_chunked("reduce_scatter", output, input, comm);
  comm.reduce_scatter(input.data(), output.data(), output.n_elems(), output.dtype(), reduce);
}

std::vector<py::bytes> rendezvous(const std::string& tag, const py::bytes& payload) {
  const std::string_view mine = payload;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(mine.data()),
                                         mine.size());
  std::vector<std::vector<std::byte>> all;
  {
    Locked locked;
    all = communicator().rendezvous(tag, bytes);
  }
  std::vector<py::bytes> out;
  for (const std::vector<std::byte>& p : all) {
    out.emplace_back(reinterpret_cast<const char*>(p.data()), p.size());
  }
  return out;
}

py::array alloc_buffer(const std::vector<py::ssize_t>& shape, const py::dtype& dtype) {
  if (dtype.attr("hasobject").cast<bool>()) {
    throw xs::InvalidArgument(fmt::format(
        "alloc_buffer: dtype {} holds Python objects; only plain data can live in the arena",
        std::string(py::str(static_cast<const py::handle&>(dtype)))));
  }
  size_t bytes = static_cast<size_t>(dtype.itemsize());
  for (py::ssize_t d : shape) {
    if (d < 0) throw xs::InvalidArgument(fmt::format("alloc_buffer: negative dimension {}", d));
    bytes *= static_cast<size_t>(d);
  }
  void* data = nullptr;
  {
    Locked locked;
    data = communicator().alloc_buffer(bytes);
    ++g_live_buffers;  // under the lock: a shutdown() on another thread sees it alive
  }
  // The array's base frees the memory when the last view of it goes.
  py::capsule owner(data, &release_buffer);
  return py::array(dtype, shape, {}, data, owner);
}

void shutdown() {
  Locked locked;  // after a call another thread is in
  if (g_shut_down) return;
  const int live = g_live_buffers.load();
  if (live > 0) {
    throw xs::InvalidArgument(fmt::format(
        "shutdown: {} array(s) from alloc_buffer are still alive; the arena they live in "
        "would be unmapped under them (del them first)",
        live));
  }
  xs::xm::shutdown();
  g_shut_down = true;
}

// The C table for the torch.distributed backend (comm_api.h).
template <typename Body>
int guarded(XsCommError* error, Body body) {
  const auto fail = [&](int kind, const char* what) {
    const size_t n = std::min(std::strlen(what), sizeof(error->message) - 1);
    std::memcpy(error->message, what, n);
    error->message[n] = '\0';
    return kind;
  };
  try {
    InCall in_call;
    check_not_forked();
    const std::lock_guard<std::timed_mutex> lock(g_mutex);  // the caller's GIL is torch's affair
    free_orphans();
    body();
    return kXsOk;
  } catch (const xs::Interrupted& e) {
    return fail(kXsInterrupted, e.what());
  } catch (const xs::InvalidArgument& e) {
    return fail(kXsInvalidArgument, e.what());
  } catch (const xs::IoError& e) {
    return fail(kXsIoError, e.what());
  } catch (const xs::PeerFailure& e) {
    return fail(kXsPeerFailure, e.what());
  } catch (const xs::Timeout& e) {
    return fail(kXsTimeout, e.what());
  } catch (const xs::InternalError& e) {
    return fail(kXsInternalError, e.what());
  } catch (const std::exception& e) {
    return fail(kXsOtherError, e.what());
  }
}

const XsCommApi kCommApi = {
    kXsCommApiVersion,
    [](int* ordinal, int* world_size, XsCommError* error) {
      return guarded(error, [&] {
        const xs::Communicator& comm = communicator();
        *ordinal = comm.ordinal();
        *world_size = comm.world_size();
      });
    },
    [](void* data, size_t n, int dtype, int op, XsCommError* error) {
      return guarded(error, [&] {
        communicator().all_reduce(data, n, static_cast<xs::DType>(dtype),
                                  static_cast<xs::ReduceOp>(op));
      });
    },
    [](void* data, size_t n, int dtype, int root, XsCommError* error) {
      return guarded(error, [&] {
        communicator().broadcast(data, n, static_cast<xs::DType>(dtype), root);
      });
    },
    [](const void* in, void* out, size_t n, int dtype, XsCommError* error) {
      return guarded(error, [&] {
        communicator().all_gather(in, out, n, static_cast<xs::DType>(dtype));
      });
    },
    [](const void* in, void* out, size_t n, int dtype, int op, XsCommError* error) {
      return guarded(error, [&] {
        communicator().reduce_scatter(in, out, n, static_cast<xs::DType>(dtype),
                                      static_cast<xs::ReduceOp>(op));
      });
    },
    [](XsCommError* error) { return guarded(error, [&] { communicator().barrier(); }); },
    [](void* data, size_t bytes, int* registered, XsCommError* error) {
      return guarded(error, [&] { *registered = communicator().register_buffer(data, bytes); });
    },
    [](void* data, XsCommError* error) {
      return guarded(error, [&] { communicator().deregister_buffer(data); });
    },
    &restore_interrupt,
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "xla_spawn's replica context and shared-memory collectives (see xla_spawn)";

  // Errors: xs::Error's hierarchy (base/error.h). Later registrations are tried first, so the
  // base goes first.
  static py::exception<xs::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<xs::InvalidArgument> invalid(m, "InvalidArgument", error.ptr());
  static py::exception<xs::IoError> io(m, "IoError", error.ptr());
  static py::exception<xs::PeerFailure> peer(m, "PeerFailure", error.ptr());
  static py::exception<xs::Timeout> timeout(m, "Timeout", error.ptr());
  static py::exception<xs::InternalError> internal(m, "InternalError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const xs::InvalidArgument& e) {
      invalid(e.what());
    } catch (const xs::IoError& e) {
      io(e.what());
    } catch (const xs::PeerFailure& e) {
      peer(e.what());
    } catch (const xs::Timeout& e) {
      timeout(e.what());
    } catch (const xs::InternalError& e) {
      internal(e.what());
    } catch (const xs::Interrupted& e) {
      restore_interrupt(e.what());
    } catch (const xs::Error& e) {
      error(e.what());
    }
  });

  py::class_<xs::ReplicaContext>(m, "ReplicaContext", "Who this replica is in its job.")
      .def_readonly("ordinal", &xs::ReplicaContext::ordinal, "Global rank, 0..world_size-1.")
      .def_readonly("local_ordinal", &xs::ReplicaContext::local_ordinal, "Rank on this host.")
      .def_readonly("world_size", &xs::ReplicaContext::world_size)
      .def_readonly("local_world_size", &xs::ReplicaContext::local_world_size)
      .def_readonly("node", &xs::ReplicaContext::node, "This host's node rank.")
      .def_readonly("nnodes", &xs::ReplicaContext::nnodes)
      .def_readonly("attempt", &xs::ReplicaContext::attempt,
                    "0 on the first run, k after the k-th --max-restarts restart.")
      .def_readonly("job_id", &xs::ReplicaContext::job_id, "Empty when started alone.")
      .def_property_readonly("standalone", &xs::ReplicaContext::standalone)
      .def("is_master", [](const xs::ReplicaContext& c, bool local) {
            return local ? c.is_local_master() : c.is_master();
          }, py::arg("local") = false, "Ordinal 0 of the job (or of this host, local=True).")
      .def("__repr__", [](const xs::ReplicaContext& c) {
        return fmt::format("ReplicaContext(ordinal={}, local_ordinal={}, world_size={}, "
                           "local_world_size={}, node={}, nnodes={}, job_id='{}')",
                           c.ordinal, c.local_ordinal, c.world_size, c.local_world_size, c.node,
                           c.nnodes, c.job_id);
      });

  m.def("init", [] {
    Locked locked;
    communicator();
  },
        "Attaches this process to its job (idempotent; every other call does it first).");
  m.def("context", [] {
    Locked locked;
    communicator();
    return xs::xm::context();
  }, "This replica's ReplicaContext.");
  m.def("shutdown", &shutdown, "Detaches from the job; refuses while alloc_buffer arrays live.");
  m.def("all_reduce", &all_reduce, py::arg("data"), py::arg("op") = "sum",
        py::arg("dtype") = "", "Reduces `data` over the replicas in place.");
  m.def("broadcast", &broadcast, py::arg("data"), py::arg("root") = 0, py::arg("dtype") = "",
        "Copies the root's `data` into every replica's.");
  m.def("all_gather", &all_gather, py::arg("input"), py::arg("output"), py::arg("dtype") = "",
        "output[k * len(input):(k + 1) * len(input)] = ordinal k's input.");
  m.def("reduce_scatter", &reduce_scatter, py::arg("input"), py::arg("output"),
        py::arg("op") = "sum", py::arg("dtype") = "",
        "output = this ordinal's chunk of `input` reduced over the replicas.");
  m.def("barrier", [] {
    Locked locked;
    communicator().barrier();
  }, "Waits until every replica has called barrier().");
  m.def("rendezvous", &rendezvous, py::arg("tag"), py::arg("payload") = py::bytes(),
        "Waits for every replica to reach `tag`; returns each ordinal's payload.");
  m.def("alloc_buffer", &alloc_buffer, py::arg("shape"), py::arg("dtype"),
        "A NumPy array in the job's shared-memory arena: collectives on it copy nothing.");
  m.attr("_comm_api") = py::capsule(&kCommApi, kXsCommApiCapsule);

  // A daemon thread may still be inside a collective when the interpreter finishes: the
  // communicator must then outlive the exit's destructors, or that thread reads unmapped
  // memory (SIGSEGV). The process leaves the job by exiting; the peers see it gone.
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    std::unique_lock<std::timed_mutex> lock(g_mutex, std::try_to_lock);
    if (!lock.owns_lock()) xs::xm::abandon();
  }));
  // Signal handlers run from the main thread's waits until the interpreter starts to finish
  // (atexit runs this before it tears anything down; later-registered handlers run first).
  const auto main_ident =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  if (PyThread_get_thread_ident() == main_ident) {
    xs::set_thread_interrupt_check(&run_python_signal_handlers);
    t_hears_signals = true;
    py::module_::import("atexit").attr("register")(py::cpp_function([] {
      xs::set_thread_interrupt_check(nullptr);
      t_hears_signals = false;
    }));
  }
}
