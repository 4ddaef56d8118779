#pragma once
// Native code for loop kernels: each LoopKernel runs as a function built as LLVM IR and
// compiled for the host CPU by ORC's LLJIT (no toolchain at run time). It computes exactly
// what the interpreter (loop.h) computes, element for element: the same IEEE operations in
// the same order with no fast-math flags and no FMA contraction, and the transcendental ops
// through the same libm functions. Every loop has a generated form; loads that fit no row
// structure (a general broadcast, broadcasts of different periods) are gathered.
//
//   std::unique_ptr<NativeLoops> native = compile_native_loops(loops, &disk_cache_or_null);
//   if (NativeLoopFn fn = native->fn(i)) {
//     for (int s : native->storages(i)) local.push_back(storage[s]);   // the loop's own numbering
//     fn(local.data(), scratch);
//   } else {
//     run_loop(*loops[i], storage);
//   }
//
// Loops equal but for the buffers they touch share one function: a function numbers its
// storages 0, 1, ... in order of first use (loads, stores, reduction), and storages(i) says
// which of the program's storages those are for loop i.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "xla_spawn/runtime/kernels/loop.h"
#include "xla_spawn/runtime/compiler/object_cache.h"

namespace xs::detail {

// Runs the whole loop over `storage` (the loop's storages in its own numbering); `scratch` holds
// `reduce->inner` doubles for a loop whose reduction has inner > 1 (else it may be null).
using NativeLoopFn = void (*)(void* const* storage, double* scratch);

// The compiled loops of one program; the code is freed with it.
class NativeLoops {
 public:
  // Where the code came from: nothing to compile, LLVM, or the persistent cache.
  enum class Source { kNone, kCompiled, kDiskCache };

  virtual ~NativeLoops() = default;
  virtual Source source() const = 0;
  // The function for loop `i` of the list it was built from, or null (interpreted).
  virtual NativeLoopFn fn(size_t i) const = 0;
  // The program storages of loop i's own numbering: fn(i)'s storage[k] is storages(i)[k].
  virtual std::span<const int> storages(size_t i) const = 0;
  virtual int64_t compiled() const = 0;   // loops with a function
  virtual int64_t functions() const = 0;  // distinct functions among them
};

// Compiles every loop of `loops` it can (null entries are skipped) into one object. With a
// `cache`, the object is looked up there first, keyed by the loops as lowered (so by the graph
// and the compiler that lowered it), the generator's source, the CPU and the LLVM version, and
// stored there once compiled.
// Never null.
std::unique_ptr<NativeLoops> compile_native_loops(const std::vector<const LoopKernel*>& loops,
                                                  const ObjectCache* cache = nullptr);

// Starts LLVM's JIT for this process (once; later calls return at once). The first
// compile_native_loops does it anyway; the runtime calls it first to time it on its own.
void start_native_jit();

}  // namespace xs::detail
