#pragma once
// The process's communicator as the `xla_spawn._core` extension hands it to others (the
// torch.distributed backend `xla_spawn._c10d`): a table of plain C calls in a capsule. Python
// loads each extension with its own copy of the libraries they link, so the backend must not
// build a second communicator (a second attachment to the segment) nor catch the core's C++
// exception types; it calls through this table and gets errors back as a kind and a message.
//
//   const XsCommApi* api = static_cast<const XsCommApi*>(
//       PyCapsule_Import(kXsCommApiCapsule, 0));
//   XsCommError error;
//   if (api->all_reduce(data, n, dtype, op, &error) != 0) throw ...(error.message);
//
// Dtypes and ops are the integer values of xs::DType and xs::ReduceOp (base/dtype.h).

#include <cstddef>
#include <cstdint>

inline constexpr const char* kXsCommApiCapsule = "xla_spawn._core._comm_api";
// Raised when the table changes shape; a backend built against another version refuses it.
inline constexpr uint32_t kXsCommApiVersion = 3;

// What went wrong, as xs::Error's subclasses (base/error.h).
enum XsCommErrorKind : int {
  kXsOk = 0,
  kXsInvalidArgument = 1,
  kXsIoError = 2,
  kXsPeerFailure = 3,
  kXsTimeout = 4,
  kXsInternalError = 5,
  kXsOtherError = 6,  // anything else thrown (std::bad_alloc, ...)
  // A Python signal handler raised inside the call's wait (Ctrl-C): restore_interrupt() sets
  // what it raised as the current Python error.
  kXsInterrupted = 7,
};

struct XsCommError {
  char message[2048];  // NUL-terminated, cut at the array's size
};

// Every call is collective as in xs::Communicator (collectives/communicator.h), blocks until
// done, and returns kXsOk or the kind of error with its message in `error`. The first call
// attaches the job (xs::xm::init).
struct XsCommApi {
  uint32_t version;
  int (*context)(int* ordinal, int* world_size, XsCommError* error);
  int (*all_reduce)(void* data, size_t n_elems, int dtype, int op, XsCommError* error);
  int (*broadcast)(void* data, size_t n_elems, int dtype, int root, XsCommError* error);
  int (*all_gather)(const void* in, void* out, size_t n_elems, int dtype, XsCommError* error);
  int (*reduce_scatter)(const void* in, void* out, size_t n_elems, int dtype, int op,
                        XsCommError* error);
  int (*barrier)(XsCommError* error);
  // xs::Communicator::register_buffer / deregister_buffer: *registered is 1 when the memory
  // now takes the zero-copy path, 0 when it stays ordinary (not an error).
  int (*register_buffer)(void* data, size_t bytes, int* registered, XsCommError* error);
  int (*deregister_buffer)(void* data, XsCommError* error);
  // With the GIL, after a call returned kXsInterrupted: sets the exception the signal handler
  // raised as the current Python error (KeyboardInterrupt with `message` if it is gone).
  void (*restore_interrupt)(const char* message);
};
