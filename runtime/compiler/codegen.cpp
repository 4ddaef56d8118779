// Code generation for loop kernels. The shape of every generated function:
//
//   for row in [0, rows):               rows = 1 unless some load is a kTile/kSpread/kRun
//     per-row values (kSpread, kRun)    broadcast of period `cols`; one scalar load per row
//     for col in [0, cols) by kLanes:   vector body: load, apply the steps, store
//     for col in the rest:              the same body on one element
//
// A loop with a reduction (LoopReduce, [outer, reduced, inner]) takes its rows from it. Over a
// whole run (inner == 1) a row is one run: a sum adds the vector body's lanes into sixteen
// double lanes carried through the row (row_sum's lanes: column j into lane j % 16), a max,
// min or argmax folds the values into one scalar (and its column) in column order; the row's
// result is stored at its end. Otherwise a row is one r of one o and its columns the i: each
// updates acc[i] (doubles in the caller's scratch; argmax's index in the output itself) in
// r order, and the last r of each o stores them. Over axes that are not one run (LoopReduce::
// axes) a row is the loop's last run of reduced or of kept axes: a reduced run carries its
// o's sixteen sum lanes (lane-major in the scratch, loaded rotated by the row's first r % 16,
// stored back at its end) or scans on from o's max or min; a kept run updates each column's
// o; after the last row the lanes are added in order and every value stored.
//
// The vectors are explicit (kLanes elements of every register's compute type), so no
// optimiser has to prove the loop free of dependences: an in-place loop (output over its
// dying input) loads each vector before it stores it, as the interpreter loads each block
// before storing it. Ops are emitted with the interpreter's exact formulas: f32 exp and erf as
// kernels/elementary.h's arithmetic, operation for operation; other libm functions (and f64)
// called lane by lane through absolute symbols bound to this process's libm, so `log` here is
// the very `logf` the interpreter calls.
#include "xla_spawn/runtime/compiler/codegen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <bit>
#include <functional>
#include <limits>
#include <mutex>
#include <numbers>
#include <optional>
#include <span>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/Host.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/hash.h"
#include "xla_spawn/runtime/kernels/elementary.h"
#include "xla_spawn/runtime/kernels/random.h"
#include "xla_spawn/runtime/kernels/row_sum.h"
#include "xla_spawn/runtime/shape.h"

namespace xs::detail {
namespace {

constexpr unsigned kLanes = 16;  // one 512-bit register of f32; two of f64
// A sum over a whole run accumulates one vector's lanes into row_sum's lanes as they are.
static_assert(kLanes == kSumLanes, "a generated row sum needs one vector lane per row_sum lane");

std::string llvm_message(llvm::Error error) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << error;
  return os.str();
}

template <typename T>
T expect(llvm::Expected<T> value, const char* what) {
  if (!value) throw InternalError(fmt::format("codegen: {}: {}", what, llvm_message(value.takeError())));
  return std::move(*value);
}

void check(llvm::Error error, const char* what) {
  if (error) throw InternalError(fmt::format("codegen: {}: {}", what, llvm_message(std::move(error))));
}

// The libm functions the interpreter's float ops call, by the name the generated code uses.
struct LibmFunction {
  const char* name;
  void* address;
};

const std::vector<LibmFunction>& libm_functions() {
  static const std::vector<LibmFunction> functions = {
      {"xs_expf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::expf))},
      {"xs_logf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::logf))},
      {"xs_tanhf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::tanhf))},
      {"xs_erff", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::erff))},
      {"xs_sinf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::sinf))},
      {"xs_cosf", reinterpret_cast<void*>(static_cast<float (*)(float)>(&::cosf))},
      {"xs_powf", reinterpret_cast<void*>(static_cast<float (*)(float, float)>(&::powf))},
      {"xs_exp", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::exp))},
      {"xs_log", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::log))},
      {"xs_tanh", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::tanh))},
      {"xs_erf", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::erf))},
      {"xs_sin", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::sin))},
      {"xs_cos", reinterpret_cast<void*>(static_cast<double (*)(double)>(&::cos))},
      {"xs_pow", reinterpret_cast<void*>(static_cast<double (*)(double, double)>(&::pow))},
  };
  return functions;
}

// The process's JIT: one target machine for the host CPU, one LLJIT whose main library holds
// the libm symbols; each program's code lives in its own library, removed with it. Never
// destroyed (programs held by static runtimes outlive any static object).
class Jit {
 public:
  static Jit& get() {
    static Jit* jit = new Jit;
    return *jit;
  }

  std::mutex mu;  // guards everything below
  std::unique_ptr<llvm::TargetMachine> target;
  std::unique_ptr<llvm::orc::LLJIT> lljit;
  std::string description;
  uint64_t next_library = 0;

 private:
  Jit() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::orc::JITTargetMachineBuilder builder = expect(llvm::orc::JITTargetMachineBuilder::detectHost(), "host");
    builder.setCodeGenOptLevel(llvm::CodeGenOpt::Default);
    builder.setRelocationModel(llvm::Reloc::PIC_);
    builder.getOptions().AllowFPOpFusion = llvm::FPOpFusion::Strict;  // never a*b+c as one FMA
    target = expect(builder.createTargetMachine(), "target machine");
    description = builder.getCPU() + " " + builder.getFeatures().getString();
    lljit = expect(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(builder).create(), "LLJIT");
    llvm::orc::SymbolMap symbols;
    for (const LibmFunction& f : libm_functions()) {
      symbols[lljit->mangleAndIntern(f.name)] =
          llvm::JITEvaluatedSymbol(llvm::pointerToJITTargetAddress(f.address), llvm::JITSymbolFlags::Exported);
    }
    check(lljit->getMainJITDylib().define(llvm::orc::absoluteSymbols(std::move(symbols))), "libm symbols");
  }
};

enum class Kind { kFloat, kInt, kBool };

Kind kind_of(DType d) {
  switch (d) {
    case DType::kF32: case DType::kBF16: case DType::kF64: return Kind::kFloat;
    case DType::kI32: case DType::kI64: return Kind::kInt;
    case DType::kBool: return Kind::kBool;
  }
  return Kind::kBool;
}

// The loop's row structure: rows of `cols` columns, the reduction's row (the reduced run when
// inner == 1, else inner) if it has one, else the period of its first patterned load (kTile,
// kSpread, kRun), else the whole loop. A patterned load of another period is read as a general
// broadcast (kBroadcast), gathered through the operand's strides.
void row_structure(const LoopKernel& loop, std::vector<LoadPlan>& plans, int64_t& cols) {
  const int64_t n = numel(loop.shape);
  cols = n;
  bool fixed = false;
  if (const auto& r = loop.reduce) {
    cols = !r->axes.empty() ? general_reduce_row(loop.shape, r->axes).elements : r->inner == 1 ? r->reduced : r->inner;
    fixed = true;
  }
  for (const LoopLoad& l : loop.loads) {
    plans.push_back(load_plan(l, loop.shape));
    LoadPlan& p = plans.back();
    if (p.mode != LoadMode::kTile && p.mode != LoadMode::kSpread && p.mode != LoadMode::kRun) continue;
    if (!fixed) cols = p.period, fixed = true;
    if (p.period != cols) p = {LoadMode::kBroadcast};
  }
  if (cols == 0) cols = 1;  // an empty loop (n == 0) or an empty row: no iterations either way
}

class LoopEmitter {
 public:
  LoopEmitter(llvm::Module& module, const LoopKernel& loop, const std::string& name)
      : ctx_(module.getContext()), module_(module), b_(ctx_), loop_(loop) {
    llvm::Type* ptr = b_.getInt8PtrTy();
    auto* type = llvm::FunctionType::get(b_.getVoidTy(), {ptr->getPointerTo(), b_.getDoubleTy()->getPointerTo()}, false);
    fn_ = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, module);
    fn_->addFnAttr(llvm::Attribute::NoUnwind);
    fn_->addFnAttr("prefer-vector-width", "512");
    fn_->addFnAttr("min-legal-vector-width", "512");
  }

  // False when some step has no generated form (a bug: the ops.def walk covers every step).
  bool emit() {
    int64_t cols = 0;
    std::vector<LoadPlan> plans;
    row_structure(loop_, plans, cols);
    plans_ = std::move(plans);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    const int64_t n = numel(loop_.shape);
    if (n > 0) {
      setup();
      const bool general = loop_.reduce && !loop_.reduce->axes.empty();
      if (!(general ? emit_general_reduce_loops(n, cols)
            : loop_.reduce ? emit_reduce_loops(n, cols) : emit_body_loops(n, cols))) return false;
    }
    b_.CreateRetVoid();
    return true;
  }

 private:
  using Regs = std::vector<llvm::Value*>;

  llvm::Type* compute_type(DType d) {
    switch (d) {
      case DType::kF32: case DType::kBF16: return b_.getFloatTy();
      case DType::kF64: return b_.getDoubleTy();
      case DType::kI32: return b_.getInt32Ty();
      case DType::kI64: return b_.getInt64Ty();
      case DType::kBool: return b_.getInt8Ty();
    }
    return nullptr;
  }
  llvm::Type* stored_type(DType d) { return d == DType::kBF16 ? b_.getInt16Ty() : compute_type(d); }
  llvm::Type* lanes(llvm::Type* t, unsigned w) { return w == 1 ? t : llvm::FixedVectorType::get(t, w); }
  unsigned width(llvm::Value* v) {
    auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(v->getType());
    return vt ? vt->getNumElements() : 1;
  }
  llvm::Value* splat(llvm::Value* v, unsigned w) { return w == 1 ? v : b_.CreateVectorSplat(w, v); }

  // `for (i = begin; i < end; i += step) body(i)`, i an i64.
  void for_loop(llvm::Value* begin, llvm::Value* end, int64_t step, const std::function<void(llvm::Value*)>& body) {
    for_loop_carrying(begin, end, step, nullptr, [&](llvm::Value* i, llvm::Value*) -> llvm::Value* {
      body(i);
      return nullptr;
    });
  }

  // The same with a value carried from one iteration to the next (none when `init` is null):
  // `carried = init; for (...) carried = body(i, carried)`; returns the final value.
  llvm::Value* for_loop_carrying(llvm::Value* begin, llvm::Value* end, int64_t step, llvm::Value* init,
                                 const std::function<llvm::Value*(llvm::Value*, llvm::Value*)>& body) {
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    auto* head = llvm::BasicBlock::Create(ctx_, "head", fn_);
    auto* inside = llvm::BasicBlock::Create(ctx_, "body", fn_);
    auto* exit = llvm::BasicBlock::Create(ctx_, "exit", fn_);
    b_.CreateBr(head);
    b_.SetInsertPoint(head);
    llvm::PHINode* i = b_.CreatePHI(b_.getInt64Ty(), 2);
    i->addIncoming(begin, pre);
    llvm::PHINode* carried = init != nullptr ? b_.CreatePHI(init->getType(), 2) : nullptr;
    if (carried != nullptr) carried->addIncoming(init, pre);
    b_.CreateCondBr(b_.CreateICmpSLT(i, end), inside, exit);
    b_.SetInsertPoint(inside);
    llvm::Value* next = body(i, carried);
    i->addIncoming(b_.CreateAdd(i, b_.getInt64(step)), b_.GetInsertBlock());
    if (carried != nullptr) carried->addIncoming(next, b_.GetInsertBlock());
    b_.CreateBr(head);
    b_.SetInsertPoint(exit);
    return carried;
  }

  // The address of element `index` of storage `s`, typed as a pointer to `w` elements.
  llvm::Value* address(int s, DType d, llvm::Value* index, unsigned w) {
    llvm::Type* t = stored_type(d);
    llvm::Value* base = b_.CreatePointerCast(base_[s], t->getPointerTo());
    llvm::Value* p = b_.CreateInBoundsGEP(t, base, index);
    return b_.CreatePointerCast(p, lanes(t, w)->getPointerTo());
  }

  llvm::Value* widen_bf16(llvm::Value* bits) {
    const unsigned w = width(bits);
    llvm::Value* u = b_.CreateShl(b_.CreateZExt(bits, lanes(b_.getInt32Ty(), w)), 16);
    return b_.CreateBitCast(u, lanes(b_.getFloatTy(), w));
  }

  // BF16::from_float: round to nearest even, NaN kept quiet.
  llvm::Value* round_bf16(llvm::Value* f) {
    const unsigned w = width(f);
    llvm::Type* i32 = lanes(b_.getInt32Ty(), w);
    auto k = [&](uint32_t v) { return llvm::ConstantInt::get(i32, v); };
    llvm::Value* u = b_.CreateBitCast(f, i32);
    llvm::Value* high = b_.CreateLShr(u, k(16));
    llvm::Value* is_nan = b_.CreateICmpUGT(b_.CreateAnd(u, k(0x7fffffffu)), k(0x7f800000u));
    llvm::Value* rounding = b_.CreateAdd(k(0x7fffu), b_.CreateAnd(high, k(1)));
    llvm::Value* rounded = b_.CreateLShr(b_.CreateAdd(u, rounding), k(16));
    return b_.CreateTrunc(b_.CreateSelect(is_nan, b_.CreateOr(high, k(0x40u)), rounded), lanes(b_.getInt16Ty(), w));
  }

  llvm::Value* load(int s, DType d, llvm::Value* index, unsigned w) {
    llvm::Type* t = lanes(stored_type(d), w);
    llvm::Value* v = b_.CreateAlignedLoad(t, address(s, d, index, w), llvm::Align(dtype_size(d)));
    return d == DType::kBF16 ? widen_bf16(v) : v;
  }

  void store(int s, DType d, llvm::Value* index, llvm::Value* v) {
    const unsigned w = width(v);
    if (d == DType::kBF16) v = round_bf16(v);
    b_.CreateAlignedStore(v, address(s, d, index, w), llvm::Align(dtype_size(d)));
  }

  // The interpreter's fill_constant: the attribute's double converted to the compute type
  // (a bf16 register holds the f32 value, unrounded).
  llvm::Value* constant(DType d, double value) {
    switch (d) {
      case DType::kF32: case DType::kBF16: return llvm::ConstantFP::get(b_.getFloatTy(), static_cast<float>(value));
      case DType::kF64: return llvm::ConstantFP::get(b_.getDoubleTy(), value);
      case DType::kI32: return b_.getInt32(static_cast<uint32_t>(static_cast<int32_t>(value)));
      case DType::kI64: return b_.getInt64(static_cast<uint64_t>(static_cast<int64_t>(value)));
      case DType::kBool: return b_.getInt8(value != 0);
    }
    return nullptr;
  }

  // Storage pointers and loop-invariant loads, once at the entry.
  void setup() {
    llvm::Argument* storage = fn_->getArg(0);
    base_.assign(0, nullptr);
    auto use_storage = [&](int s) {
      if (s < 0) return;
      if (base_.size() <= static_cast<size_t>(s)) base_.resize(s + 1, nullptr);
      if (base_[s] != nullptr) return;
      llvm::Type* ptr = b_.getInt8PtrTy();
      base_[s] = b_.CreateAlignedLoad(ptr, b_.CreateConstInBoundsGEP1_64(ptr, storage, s), llvm::Align(8));
    };
    for (const LoopLoad& l : loop_.loads) use_storage(l.storage);
    for (const LoopStore& st : loop_.stores) use_storage(st.storage);
    // Loop-invariant loads: scalar once, splat once.
    fixed_.assign(loop_.loads.size(), nullptr);
    for (size_t i = 0; i < loop_.loads.size(); ++i) {
      const LoopLoad& l = loop_.loads[i];
      if (plans_[i].mode != LoadMode::kFixed) continue;
      fixed_[i] = l.storage < 0 ? constant(l.dtype, l.constant) : load(l.storage, l.dtype, b_.getInt64(0), 1);
    }
    if (loop_.reduce) use_storage(loop_.reduce->storage);
  }

  // The per-row values of row `row` (kSpread, kRun loads).
  Regs row_values(llvm::Value* row) {
    Regs per_row(loop_.loads.size(), nullptr);
    for (size_t i = 0; i < loop_.loads.size(); ++i) {
      const LoopLoad& l = loop_.loads[i];
      const LoadPlan& p = plans_[i];
      if (p.mode == LoadMode::kSpread) per_row[i] = load(l.storage, l.dtype, row, 1);
      if (p.mode == LoadMode::kRun) per_row[i] = load(l.storage, l.dtype, b_.CreateSRem(row, b_.getInt64(p.count)), 1);
    }
    return per_row;
  }

  bool emit_body_loops(int64_t n, int64_t cols) {
    const int64_t rows = n / cols;
    const int64_t vector_end = cols - cols % kLanes;
    bool ok = true;
    for_loop(b_.getInt64(0), b_.getInt64(rows), 1, [&](llvm::Value* row) {
      const Regs per_row = row_values(row);
      llvm::Value* row_start = b_.CreateMul(row, b_.getInt64(cols));
      auto body = [&](unsigned w) {
        return [&, w](llvm::Value* col) {
          if (ok) ok = emit_body(w, b_.CreateAdd(row_start, col), col, per_row);
        };
      };
      if (vector_end > 0) for_loop(b_.getInt64(0), b_.getInt64(vector_end), kLanes, body(kLanes));
      if (vector_end < cols) for_loop(b_.getInt64(vector_end), b_.getInt64(cols), 1, body(1));
    });
    return ok;
  }

  // Loads, steps and stores for `w` elements from flat index `flat` (column `col` of a row);
  // with `reduced`, also the reduction's register as doubles (LoopReduce's values).
  bool emit_body(unsigned w, llvm::Value* flat, llvm::Value* col, const Regs& per_row, llvm::Value** reduced = nullptr) {
    Regs reg(loop_.reg_dtype.size(), nullptr);
    for (size_t i = 0; i < loop_.loads.size(); ++i) {
      const LoopLoad& l = loop_.loads[i];
      switch (plans_[i].mode) {
        case LoadMode::kFixed: reg[l.reg] = splat(fixed_[i], w); break;
        case LoadMode::kDirect: case LoadMode::kConvert: reg[l.reg] = load(l.storage, l.dtype, flat, w); break;
        case LoadMode::kTile: reg[l.reg] = load(l.storage, l.dtype, col, w); break;
        case LoadMode::kSpread: case LoadMode::kRun: reg[l.reg] = splat(per_row[i], w); break;
        case LoadMode::kBroadcast: reg[l.reg] = gather(l, flat, w); break;
        case LoadMode::kIndex: reg[l.reg] = index_lanes(flat, w); break;
      }
    }
    for (const LoopStep& s : loop_.steps) {
      const DType in = loop_.reg_dtype[s.in[s.op == Op::kWhere ? 1 : 0]];
      llvm::Value* a = reg[s.in[0]];
      llvm::Value* b = s.in[1] >= 0 ? reg[s.in[1]] : nullptr;
      llvm::Value* c = s.in[2] >= 0 ? reg[s.in[2]] : nullptr;
      reg[s.out] = s.op == Op::kCast                            ? cast(a, in, loop_.reg_dtype[s.out])
                   : op_info(s.op).kind == OpKind::kRandom ? random(s.op, loop_.reg_dtype[s.out], a, b, c)
                                                            : step(s.op, kind_of(in), a, b, c);
      if (reg[s.out] == nullptr) return false;
    }
    for (const LoopStore& st : loop_.stores) store(st.storage, st.dtype, flat, reg[st.reg]);
    if (reduced != nullptr) {
      llvm::Value* v = reg[loop_.reduce->reg];
      if (loop_.reg_dtype[loop_.reduce->reg] == DType::kBF16) v = widen_bf16(round_bf16(v));
      *reduced = b_.CreateFPExt(v, lanes(b_.getDoubleTy(), w));  // f64: no-op
    }
    return true;
  }

  // Whether argmax's scan takes v over the value it holds: v is larger, or v is the first NaN.
  llvm::Value* argmax_takes(llvm::Value* v, llvm::Value* best) {
    return b_.CreateOr(b_.CreateFCmpOGT(v, best), b_.CreateAnd(b_.CreateFCmpUNO(v, v), b_.CreateFCmpORD(best, best)));
  }

  // The reduction's register as doubles for w columns from `col` of the row at `row_start`
  // (the body's loads, steps and stores emitted on the way); false in body_ok_ if a step has
  // no generated form.
  llvm::Value* reduced_value(const Regs& per_row, llvm::Value* row_start, llvm::Value* col, unsigned w) {
    llvm::Value* v = nullptr;
    if (body_ok_) body_ok_ = emit_body(w, b_.CreateAdd(row_start, col), col, per_row, &v);
    return body_ok_ ? v : llvm::UndefValue::get(lanes(b_.getDoubleTy(), w));
  }

  // acc replaced by v where reduce_typed's scan takes v: `first` (may be null), v > acc (max)
  // or v < acc (min), or v is NaN.
  llvm::Value* pick(llvm::Value* v, llvm::Value* acc, llvm::Value* first) {
    llvm::Value* better = loop_.reduce->op == Op::kMax ? b_.CreateFCmpOGT(v, acc) : b_.CreateFCmpOLT(v, acc);
    llvm::Value* take = b_.CreateOr(better, b_.CreateFCmpUNO(v, v));
    if (first != nullptr) take = b_.CreateOr(take, first);
    return b_.CreateSelect(take, v, acc);
  }

  // Stores `result` (doubles; a sum, divided by `reduced` for a mean) at out[index...].
  void finish_reduction(llvm::Value* index, llvm::Value* result) {
    const LoopReduce& r = *loop_.reduce;
    if (r.op == Op::kMean) result = b_.CreateFDiv(result, fconst(result, static_cast<double>(r.reduced)));
    if (r.dtype != DType::kF64) result = b_.CreateFPTrunc(result, lanes(b_.getFloatTy(), width(result)));
    store(r.storage, r.dtype, index, result);
  }

  // w doubles of the caller's scratch from `index`.
  llvm::Value* scratch_address(llvm::Value* index, unsigned w) {
    llvm::Type* f64 = b_.getDoubleTy();
    return b_.CreatePointerCast(b_.CreateInBoundsGEP(f64, fn_->getArg(1), index), lanes(f64, w)->getPointerTo());
  }

  // A sum's 16 lanes `acc` with the row's `cols` values added, column c into lane c % 16 (the
  // vector part as whole vectors, the tail lane by lane).
  llvm::Value* add_row_to_lanes(const Regs& per_row, llvm::Value* row_start, int64_t cols, llvm::Value* acc) {
    const int64_t vector_end = cols - cols % kLanes;
    acc = for_loop_carrying(b_.getInt64(0), b_.getInt64(vector_end), kLanes, acc, [&](llvm::Value* col, llvm::Value* a) {
      return b_.CreateFAdd(a, reduced_value(per_row, row_start, col, kLanes));
    });
    return for_loop_carrying(b_.getInt64(vector_end), b_.getInt64(cols), 1, acc, [&](llvm::Value* col, llvm::Value* a) {
      llvm::Value* lane = b_.CreateSub(col, b_.getInt64(vector_end));
      return b_.CreateInsertElement(a, b_.CreateFAdd(b_.CreateExtractElement(a, lane), reduced_value(per_row, row_start, col, 1)), lane);
    });
  }

  // The loop with its reduction (see the top of this file).
  bool emit_reduce_loops(int64_t n, int64_t cols) {
    const LoopReduce& r = *loop_.reduce;
    const int64_t rows = n / cols;
    const bool sum = r.op == Op::kSum || r.op == Op::kMean;
    llvm::Type* f64 = b_.getDoubleTy();
    const int64_t vector_end = cols - cols % kLanes;
    const bool argmax = r.op == Op::kArgmax;
    llvm::Type* i64 = b_.getInt64Ty();
    if (r.inner == 1) {
      // max, min and argmax scan the row in column order from its first value: the state is
      // the value kept (argmax: {value, its column}).
      llvm::Type* pair = llvm::StructType::get(ctx_, {f64, i64});
      auto start = [&](llvm::Value* v) {
        if (!argmax) return v;
        return b_.CreateInsertValue(b_.CreateInsertValue(llvm::UndefValue::get(pair), v, 0), b_.getInt64(0), 1);
      };
      auto fold = [&](llvm::Value* s, llvm::Value* v, llvm::Value* col) -> llvm::Value* {
        if (!argmax) return pick(v, s, nullptr);
        llvm::Value* best = b_.CreateExtractValue(s, 0);
        llvm::Value* better = argmax_takes(v, best);
        s = b_.CreateInsertValue(s, b_.CreateSelect(better, v, best), 0);
        return b_.CreateInsertValue(s, b_.CreateSelect(better, col, b_.CreateExtractValue(s, 1)), 1);
      };
      const int64_t scan_end = 1 + (cols - 1) / kLanes * kLanes;
      for_loop(b_.getInt64(0), b_.getInt64(rows), 1, [&](llvm::Value* row) {
        const Regs per_row = row_values(row);
        llvm::Value* row_start = b_.CreateMul(row, b_.getInt64(cols));
        if (sum) {
          llvm::Value* acc = add_row_to_lanes(per_row, row_start, cols, llvm::Constant::getNullValue(lanes(f64, kLanes)));
          llvm::Value* total = llvm::ConstantFP::get(f64, 0.0);
          for (unsigned lane = 0; lane < kLanes; ++lane) total = b_.CreateFAdd(total, b_.CreateExtractElement(acc, lane));
          finish_reduction(row, total);
          return;
        }
        llvm::Value* s = start(reduced_value(per_row, row_start, b_.getInt64(0), 1));
        s = for_loop_carrying(b_.getInt64(1), b_.getInt64(scan_end), kLanes, s, [&](llvm::Value* col, llvm::Value* a) {
          llvm::Value* v = reduced_value(per_row, row_start, col, kLanes);
          for (unsigned lane = 0; lane < kLanes; ++lane) {
            a = fold(a, b_.CreateExtractElement(v, lane), b_.CreateAdd(col, b_.getInt64(lane)));
          }
          return a;
        });
        s = for_loop_carrying(b_.getInt64(scan_end), b_.getInt64(cols), 1, s, [&](llvm::Value* col, llvm::Value* a) {
          return fold(a, reduced_value(per_row, row_start, col, 1), col);
        });
        if (argmax) b_.CreateAlignedStore(b_.CreateExtractValue(s, 1), address(r.storage, DType::kI64, row, 1), llvm::Align(8));
        else finish_reduction(row, s);
      });
      return body_ok_;
    }
    for_loop(b_.getInt64(0), b_.getInt64(rows), 1, [&](llvm::Value* row) {
      const Regs per_row = row_values(row);
      llvm::Value* row_start = b_.CreateMul(row, b_.getInt64(cols));
      llvm::Value* rr = b_.CreateSRem(row, b_.getInt64(r.reduced));
      llvm::Value* first = b_.CreateICmpEQ(rr, b_.getInt64(0));
      llvm::Value* out_start = b_.CreateMul(b_.CreateSDiv(row, b_.getInt64(r.reduced)), b_.getInt64(cols));
      auto update = [&](unsigned w) {
        return [&, w](llvm::Value* col) {
          llvm::Value* v = reduced_value(per_row, row_start, col, w);
          llvm::Value* at = scratch_address(col, w);
          llvm::Value* old = b_.CreateAlignedLoad(lanes(f64, w), at, llvm::Align(8));
          llvm::Value* is_first = splat(first, w);
          llvm::Value* next;
          if (argmax) {  // the index goes straight to the output, which only this loop writes
            llvm::Value* better = b_.CreateOr(is_first, argmax_takes(v, old));
            llvm::Value* index_at = address(r.storage, DType::kI64, b_.CreateAdd(out_start, col), w);
            llvm::Value* old_index = b_.CreateAlignedLoad(lanes(i64, w), index_at, llvm::Align(8));
            b_.CreateAlignedStore(b_.CreateSelect(better, splat(rr, w), old_index), index_at, llvm::Align(8));
            next = b_.CreateSelect(better, v, old);
          } else {
            next = sum ? b_.CreateFAdd(b_.CreateSelect(is_first, zero_like(old), old), v) : pick(v, old, is_first);
          }
          b_.CreateAlignedStore(next, at, llvm::Align(8));
        };
      };
      if (vector_end > 0) for_loop(b_.getInt64(0), b_.getInt64(vector_end), kLanes, update(kLanes));
      if (vector_end < cols) for_loop(b_.getInt64(vector_end), b_.getInt64(cols), 1, update(1));
      if (argmax) return;
      auto* last = llvm::BasicBlock::Create(ctx_, "last", fn_);
      auto* next_row = llvm::BasicBlock::Create(ctx_, "next_row", fn_);
      b_.CreateCondBr(b_.CreateICmpEQ(rr, b_.getInt64(r.reduced - 1)), last, next_row);
      b_.SetInsertPoint(last);
      auto store_out = [&](unsigned w) {
        return [&, w](llvm::Value* col) {
          finish_reduction(b_.CreateAdd(out_start, col), b_.CreateAlignedLoad(lanes(f64, w), scratch_address(col, w), llvm::Align(8)));
        };
      };
      if (vector_end > 0) for_loop(b_.getInt64(0), b_.getInt64(vector_end), kLanes, store_out(kLanes));
      if (vector_end < cols) for_loop(b_.getInt64(vector_end), b_.getInt64(cols), 1, store_out(1));
      b_.CreateBr(next_row);
      b_.SetInsertPoint(next_row);
    });
    return body_ok_;
  }

  // A reduction over any other axes (LoopReduce::axes; see the top of this file).
  bool emit_general_reduce_loops(int64_t n, int64_t cols) {
    const LoopReduce& r = *loop_.reduce;
    const int64_t rows = n / cols, outer = r.outer;
    const bool sum = r.op == Op::kSum || r.op == Op::kMean;
    llvm::Type* f64 = b_.getDoubleTy();
    auto load_acc = [&](llvm::Value* index, unsigned w) {
      return b_.CreateAlignedLoad(lanes(f64, w), scratch_address(index, w), llvm::Align(8));
    };
    auto store_acc = [&](llvm::Value* index, llvm::Value* v) {
      b_.CreateAlignedStore(v, scratch_address(index, width(v)), llvm::Align(8));
    };
    auto k = [&](int64_t v) { return b_.getInt64(v); };
    // Per axis, its step in o (kept) or in r (reduced), each row-major among its kind; the
    // rows' coordinates are on the axes before the last run of alike ones.
    const Shape& shape = loop_.shape;
    const auto rank = static_cast<int64_t>(shape.size());
    auto is_reduced = [&](int64_t d) { return std::binary_search(r.axes.begin(), r.axes.end(), d); };
    std::vector<int64_t> o_step(rank, 0), r_step(rank, 0);
    for (int64_t d = rank - 1, os = 1, rs = 1; d >= 0; --d) {
      if (is_reduced(d)) r_step[d] = rs, rs *= shape[d];
      else o_step[d] = os, os *= shape[d];
    }
    const ReduceRow run = general_reduce_row(shape, r.axes);
    const bool row_reduced = run.reduced;
    const int64_t leading = run.first_axis;
    // A sum's lanes (lane-major: lane L of o at L * outer + o) start at 0.0.
    if (sum) {
      for_loop(k(0), k(kSumLanes * outer), 1, [&](llvm::Value* i) { store_acc(i, llvm::ConstantFP::get(f64, 0.0)); });
    }
    const int64_t vector_end = cols - cols % kLanes;
    for_loop(k(0), k(rows), 1, [&](llvm::Value* row) {
      const Regs per_row = row_values(row);
      llvm::Value* row_start = b_.CreateMul(row, k(cols));
      llvm::Value* o = k(0);   // of the row's first element
      llvm::Value* rr = k(0);
      llvm::Value* rest = row;
      for (int64_t d = leading - 1; d >= 0; --d) {
        if (shape[d] == 1) continue;
        llvm::Value* coord = b_.CreateURem(rest, k(shape[d]));
        rest = b_.CreateUDiv(rest, k(shape[d]));
        if (o_step[d] != 0) o = b_.CreateAdd(o, b_.CreateMul(coord, k(o_step[d])));
        else rr = b_.CreateAdd(rr, b_.CreateMul(coord, k(r_step[d])));
      }
      llvm::Value* first = b_.CreateICmpEQ(rr, k(0));
      if (row_reduced && sum) {
        // r = rr + col: o's lanes carried through the row, lane (rr + col) % 16 at vector lane
        // (rr + col) % 16 - rr % 16 (mod 16), loaded rotated and stored back.
        llvm::Value* rot = b_.CreateURem(rr, k(kSumLanes));
        auto lane_index = [&](unsigned lane) {
          return b_.CreateAdd(b_.CreateMul(b_.CreateURem(b_.CreateAdd(rot, k(lane)), k(kSumLanes)), k(outer)), o);
        };
        llvm::Value* c = llvm::UndefValue::get(lanes(f64, kLanes));
        for (unsigned lane = 0; lane < kLanes; ++lane) c = b_.CreateInsertElement(c, load_acc(lane_index(lane), 1), lane);
        c = add_row_to_lanes(per_row, row_start, cols, c);
        for (unsigned lane = 0; lane < kLanes; ++lane) store_acc(lane_index(lane), b_.CreateExtractElement(c, lane));
      } else if (row_reduced) {
        // max, min: o's scan goes on through the row from its value (the row's first value
        // when this row starts o).
        llvm::Value* v0 = reduced_value(per_row, row_start, k(0), 1);
        llvm::Value* st = b_.CreateSelect(first, v0, pick(v0, load_acc(o, 1), nullptr));
        const int64_t scan_end = 1 + (cols - 1) / kLanes * kLanes;
        st = for_loop_carrying(k(1), k(scan_end), kLanes, st, [&](llvm::Value* col, llvm::Value* a) {
          llvm::Value* v = reduced_value(per_row, row_start, col, kLanes);
          for (unsigned lane = 0; lane < kLanes; ++lane) a = pick(b_.CreateExtractElement(v, lane), a, nullptr);
          return a;
        });
        st = for_loop_carrying(k(scan_end), k(cols), 1, st, [&](llvm::Value* col, llvm::Value* a) {
          return pick(reduced_value(per_row, row_start, col, 1), a, nullptr);
        });
        store_acc(o, st);
      } else {
        // o = o + col, r = rr: each column updates its o's accumulator.
        llvm::Value* base = sum ? b_.CreateAdd(b_.CreateMul(b_.CreateURem(rr, k(kSumLanes)), k(outer)), o) : o;
        auto update = [&](unsigned w) {
          return [&, w](llvm::Value* col) {
            llvm::Value* v = reduced_value(per_row, row_start, col, w);
            llvm::Value* at = b_.CreateAdd(base, col);
            llvm::Value* old = load_acc(at, w);
            store_acc(at, sum ? b_.CreateFAdd(old, v) : pick(v, old, splat(first, w)));
          };
        };
        if (vector_end > 0) for_loop(k(0), k(vector_end), kLanes, update(kLanes));
        if (vector_end < cols) for_loop(k(vector_end), k(cols), 1, update(1));
      }
    });
    // Every element is in: a sum's lanes added in lane order, divided for a mean; one rounding.
    auto finish = [&](unsigned w) {
      return [&, w](llvm::Value* o) {
        llvm::Value* result = sum ? static_cast<llvm::Value*>(llvm::ConstantFP::get(lanes(f64, w), 0.0)) : load_acc(o, w);
        if (sum) {
          for (int64_t lane = 0; lane < kSumLanes; ++lane) {
            result = b_.CreateFAdd(result, load_acc(b_.CreateAdd(k(lane * outer), o), w));
          }
        }
        finish_reduction(o, result);
      };
    };
    const int64_t outer_vector_end = outer - outer % kLanes;
    if (outer_vector_end > 0) for_loop(k(0), k(outer_vector_end), kLanes, finish(kLanes));
    if (outer_vector_end < outer) for_loop(k(outer_vector_end), k(outer), 1, finish(1));
    return body_ok_;
  }

  // A general broadcast: the operand's elements for loop elements flat .. flat + w - 1, each
  // index the sum over axes of its coordinate times the operand's stride (0 where broadcast),
  // computed in 32 bits when the loop is under 2^31 elements; lanes gathered.
  llvm::Value* gather(const LoopLoad& l, llvm::Value* flat, unsigned w) {
    const std::vector<int64_t> strides = broadcast_strides(l.shape, loop_.shape);
    const bool narrow = numel(loop_.shape) < (int64_t{1} << 31);
    llvm::Type* it = lanes(narrow ? b_.getInt32Ty() : b_.getInt64Ty(), w);
    auto k = [&](int64_t v) { return llvm::ConstantInt::get(it, static_cast<uint64_t>(v)); };
    llvm::Value* j = index_lanes(flat, w);
    if (narrow) j = b_.CreateTrunc(j, it);
    llvm::Value* index = k(0);
    int64_t inner = 1;
    for (int64_t d = static_cast<int64_t>(loop_.shape.size()) - 1; d >= 0; --d) {
      const int64_t extent = loop_.shape[d];
      if (strides[d] != 0 && extent > 1) {
        llvm::Value* coord = inner == 1 ? j : b_.CreateUDiv(j, k(inner));
        if (d > 0) coord = b_.CreateURem(coord, k(extent));
        index = b_.CreateAdd(index, b_.CreateMul(coord, k(strides[d])));
      }
      inner *= extent;
    }
    if (narrow) index = b_.CreateZExt(index, lanes(b_.getInt64Ty(), w));
    if (w == 1) return load(l.storage, l.dtype, index, 1);
    llvm::Type* t = stored_type(l.dtype);
    llvm::Value* pointers = b_.CreateInBoundsGEP(t, b_.CreatePointerCast(base_[l.storage], t->getPointerTo()), index);
    llvm::Value* v = b_.CreateMaskedGather(lanes(t, w), pointers, llvm::Align(dtype_size(l.dtype)));
    return l.dtype == DType::kBF16 ? widen_bf16(v) : v;
  }

  // Flat indices flat, flat + 1, ..., flat + w - 1.
  llvm::Value* index_lanes(llvm::Value* flat, unsigned w) {
    if (w == 1) return flat;
    std::vector<llvm::Constant*> steps;
    for (unsigned lane = 0; lane < w; ++lane) steps.push_back(b_.getInt64(lane));
    return b_.CreateAdd(splat(flat, w), llvm::ConstantVector::get(steps));
  }

  // random.h's draws, operation for operation: mix64 is splitmix64's step, the draw
  // mix64(mix64(seed) ^ mix64(i ^ salt)) (the seed's mix once, as a scalar), the unit value
  // the top 53 bits times 2^-53 (exact in a double), then the op's formula in double and one
  // conversion to the result's compute type.
  llvm::Value* mix64(llvm::Value* x) {
    auto k = [&](uint64_t v) { return llvm::ConstantInt::get(x->getType(), v); };
    x = b_.CreateAdd(x, k(kSplitMix64Increment));
    x = b_.CreateMul(b_.CreateXor(x, b_.CreateLShr(x, k(kSplitMix64Shift1))), k(kSplitMix64Mul1));
    x = b_.CreateMul(b_.CreateXor(x, b_.CreateLShr(x, k(kSplitMix64Shift2))), k(kSplitMix64Mul2));
    return b_.CreateXor(x, b_.CreateLShr(x, k(kSplitMix64Shift3)));
  }
  llvm::Value* unit(llvm::Value* seed_mix, llvm::Value* i) {
    auto k = [&](uint64_t v) { return llvm::ConstantInt::get(i->getType(), v); };
    llvm::Value* h = mix64(b_.CreateXor(seed_mix, mix64(b_.CreateXor(i, k(kRandomIndexSalt)))));
    // The 53 bits as two 32-bit halves (27 and 26 bits), each converted exactly and summed
    // exactly: without AVX-512 a 64-bit integer vector has no conversion to double, and LLVM
    // would convert it one lane at a time.
    llvm::Value* top = b_.CreateLShr(h, k(11));
    const unsigned w = width(i);
    llvm::Type* i32 = lanes(b_.getInt32Ty(), w);
    llvm::Type* f64 = lanes(b_.getDoubleTy(), w);
    llvm::Value* high = b_.CreateSIToFP(b_.CreateTrunc(b_.CreateLShr(top, k(26)), i32), f64);
    llvm::Value* low = b_.CreateSIToFP(b_.CreateTrunc(b_.CreateAnd(top, k((uint64_t{1} << 26) - 1)), i32), f64);
    llvm::Value* whole = b_.CreateFAdd(b_.CreateFMul(high, fconst(high, 0x1.0p26)), low);
    return b_.CreateFMul(whole, fconst(whole, 0x1.0p-53));
  }
  llvm::Value* random(Op op, DType out, llvm::Value* seed, llvm::Value* index, llvm::Value* p) {
    const unsigned w = width(index);
    llvm::Value* seed_mix = splat(mix64(w == 1 ? seed : b_.CreateExtractElement(seed, uint64_t{0})), w);
    llvm::Value* v;
    if (op == Op::kRandUniform) {
      v = unit(seed_mix, index);
      v = b_.CreateSelect(b_.CreateFCmpOGE(v, fconst(v, random_uniform_top(out))), zero_like(v), v);
    } else if (op == Op::kRandNormal) {
      llvm::Value* twice = b_.CreateShl(index, llvm::ConstantInt::get(index->getType(), 1));
      llvm::Value* u1 = b_.CreateFSub(llvm::ConstantFP::get(lanes(b_.getDoubleTy(), w), 1.0), unit(seed_mix, twice));
      llvm::Value* u2 = unit(seed_mix, b_.CreateAdd(twice, llvm::ConstantInt::get(index->getType(), 1)));
      llvm::Value* radius = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFMul(fconst(u1, -2.0), libm("log", u1)));
      v = b_.CreateFMul(radius, libm("cos", b_.CreateFMul(fconst(u2, 2.0 * std::numbers::pi), u2)));
    } else if (op == Op::kBernoulli) {
      llvm::Value* u = unit(seed_mix, index);
      v = b_.CreateSelect(b_.CreateFCmpOLT(u, b_.CreateFPExt(p, u->getType())), fconst(u, 1.0), fconst(u, 0.0));
    } else {
      return nullptr;
    }
    if (out == DType::kF64) return v;
    llvm::Value* f = b_.CreateFPTrunc(v, lanes(b_.getFloatTy(), w));
    return out == DType::kBF16 ? widen_bf16(round_bf16(f)) : f;  // the bf16 value the op kernel stores
  }

  llvm::Value* to_byte(llvm::Value* i1) { return b_.CreateZExt(i1, lanes(b_.getInt8Ty(), width(i1))); }
  llvm::Value* zero_like(llvm::Value* v) { return llvm::Constant::getNullValue(v->getType()); }
  llvm::Value* fconst(llvm::Value* like, double v) { return llvm::ConstantFP::get(like->getType(), v); }

  // Calls libm's `name` (f suffix for f32) lane by lane.
  llvm::Value* libm(const char* name, llvm::Value* x, llvm::Value* y = nullptr) {
    llvm::Type* t = x->getType()->getScalarType();
    const std::string symbol = fmt::format("xs_{}{}", name, t->isFloatTy() ? "f" : "");
    std::vector<llvm::Type*> params(y ? 2 : 1, t);
    llvm::FunctionCallee f = module_.getOrInsertFunction(symbol, llvm::FunctionType::get(t, params, false));
    const unsigned w = width(x);
    if (w == 1) return y ? b_.CreateCall(f, {x, y}) : b_.CreateCall(f, {x});
    llvm::Value* out = llvm::UndefValue::get(x->getType());
    for (unsigned lane = 0; lane < w; ++lane) {
      llvm::Value* xl = b_.CreateExtractElement(x, lane);
      llvm::Value* r = y ? b_.CreateCall(f, {xl, b_.CreateExtractElement(y, lane)}) : b_.CreateCall(f, {xl});
      out = b_.CreateInsertElement(out, r, lane);
    }
    return out;
  }

  // exp and erf: elementary.h's f32 formulas operation for operation (in its order, no FMA);
  // libm for f64 as the interpreter does.
  bool is_f32(llvm::Value* x) { return x->getType()->getScalarType()->isFloatTy(); }
  llvm::Value* fselect_gt(llvm::Value* x, float bound, llvm::Value* then) {
    return b_.CreateSelect(b_.CreateFCmpOGT(x, fconst(x, bound)), then, x);
  }
  llvm::Value* fselect_lt(llvm::Value* x, float bound, llvm::Value* then) {
    return b_.CreateSelect(b_.CreateFCmpOLT(x, fconst(x, bound)), then, x);
  }

  llvm::Value* exp_of(llvm::Value* x) {
    if (!is_f32(x)) return libm("exp", x);
    using E = ExpF32;
    llvm::Value* c = fselect_lt(fselect_gt(x, E::kHi, fconst(x, E::kHi)), E::kLo, fconst(x, E::kLo));
    llvm::Value* t = b_.CreateFAdd(b_.CreateFMul(c, fconst(x, E::kLog2e)), fconst(x, E::kRound));
    llvm::Value* n = b_.CreateFSub(t, fconst(x, E::kRound));
    llvm::Value* r = b_.CreateFSub(b_.CreateFSub(c, b_.CreateFMul(n, fconst(x, E::kLn2Hi))),
                                   b_.CreateFMul(n, fconst(x, E::kLn2Lo)));
    llvm::Value* p = fconst(x, E::kP[0]);
    for (int i = 1; i < 6; ++i) p = b_.CreateFAdd(b_.CreateFMul(p, r), fconst(x, E::kP[i]));
    llvm::Value* y = b_.CreateFAdd(b_.CreateFAdd(b_.CreateFMul(p, b_.CreateFMul(r, r)), r), fconst(x, 1));
    llvm::Type* i32 = lanes(b_.getInt32Ty(), width(x));
    auto int_const = [&](int32_t v) { return llvm::ConstantInt::getSigned(i32, v); };
    llvm::Value* ni = b_.CreateSub(b_.CreateBitCast(t, i32), int_const(std::bit_cast<int32_t>(E::kRound)));
    llvm::Value* n1 = b_.CreateAShr(ni, int_const(1));
    llvm::Value* n2 = b_.CreateSub(ni, n1);
    auto scale = [&](llvm::Value* k) {
      return b_.CreateBitCast(b_.CreateShl(b_.CreateAdd(k, int_const(127)), int_const(23)), x->getType());
    };
    llvm::Value* v = b_.CreateFMul(b_.CreateFMul(y, scale(n1)), scale(n2));
    llvm::Value* inf = fconst(x, std::numeric_limits<float>::infinity());
    return b_.CreateSelect(b_.CreateFCmpOGT(x, fconst(x, E::kHi)), inf,
                           b_.CreateSelect(b_.CreateFCmpOLT(x, fconst(x, E::kLo)), zero_like(x), v));
  }

  llvm::Value* erf_of(llvm::Value* x) {
    if (!is_f32(x)) return libm("erf", x);
    using E = ErfF32;
    llvm::Value* c = fselect_lt(fselect_gt(x, E::kClamp, fconst(x, E::kClamp)), -E::kClamp, fconst(x, -E::kClamp));
    llvm::Value* c2 = b_.CreateFMul(c, c);
    llvm::Value* p = fconst(x, E::kP[0]);
    for (int i = 1; i < 7; ++i) p = b_.CreateFAdd(b_.CreateFMul(p, c2), fconst(x, E::kP[i]));
    llvm::Value* q = fconst(x, E::kQ[0]);
    for (int i = 1; i < 5; ++i) q = b_.CreateFAdd(b_.CreateFMul(q, c2), fconst(x, E::kQ[i]));
    llvm::Value* e = b_.CreateFDiv(b_.CreateFMul(c, p), q);
    return fselect_lt(fselect_gt(e, 1.0f, fconst(x, 1)), -1.0f, fconst(x, -1));
  }

  // The interpreter's float_fn / numeric_fn / bool_fn, formula for formula.
  llvm::Value* step(Op op, Kind kind, llvm::Value* x, llvm::Value* y, llvm::Value* c) {
    switch (kind) {
      case Kind::kFloat: return float_step(op, x, y, c);
      case Kind::kInt: return int_step(op, x, y, c);
      case Kind::kBool: return bool_step(op, x, y, c);
    }
    return nullptr;
  }

  llvm::Value* float_step(Op op, llvm::Value* x, llvm::Value* y, llvm::Value* c) {
    llvm::Value* zero = zero_like(x);
    switch (op) {
      case Op::kNeg: return b_.CreateFNeg(x);
      case Op::kAbs: return b_.CreateSelect(b_.CreateFCmpOLT(x, zero), b_.CreateFNeg(x), x);
      case Op::kSign: {
        llvm::Type* i32 = lanes(b_.getInt32Ty(), width(x));
        llvm::Value* s = b_.CreateSub(b_.CreateZExt(b_.CreateFCmpOGT(x, zero), i32), b_.CreateZExt(b_.CreateFCmpOLT(x, zero), i32));
        return b_.CreateSIToFP(s, x->getType());
      }
      case Op::kSquare: return b_.CreateFMul(x, x);
      case Op::kRelu: return b_.CreateSelect(b_.CreateFCmpOGT(x, zero), x, zero);
      case Op::kExp: return exp_of(x);
      case Op::kLog: return libm("log", x);
      case Op::kSqrt: return b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x);
      case Op::kRsqrt: return b_.CreateFDiv(fconst(x, 1), b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x));
      case Op::kReciprocal: return b_.CreateFDiv(fconst(x, 1), x);
      case Op::kTanh: return libm("tanh", x);
      case Op::kSigmoid: return b_.CreateFDiv(fconst(x, 1), b_.CreateFAdd(fconst(x, 1), exp_of(b_.CreateFNeg(x))));
      case Op::kGelu: {
        llvm::Value* e = erf_of(b_.CreateFMul(x, fconst(x, 0.70710678118654752)));
        return b_.CreateFMul(b_.CreateFMul(fconst(x, 0.5), x), b_.CreateFAdd(fconst(x, 1), e));
      }
      case Op::kErf: return erf_of(x);
      case Op::kSin: return libm("sin", x);
      case Op::kCos: return libm("cos", x);
      case Op::kPow: return libm("pow", x, y);
      case Op::kAdd: return b_.CreateFAdd(x, y);
      case Op::kSub: return b_.CreateFSub(x, y);
      case Op::kMul: return b_.CreateFMul(x, y);
      case Op::kDiv: return b_.CreateFDiv(x, y);
      case Op::kMaximum: return b_.CreateSelect(b_.CreateOr(b_.CreateFCmpOGT(x, y), b_.CreateFCmpUNO(x, x)), x, y);
      case Op::kMinimum: return b_.CreateSelect(b_.CreateOr(b_.CreateFCmpOLT(x, y), b_.CreateFCmpUNO(x, x)), x, y);
      case Op::kEq: return to_byte(b_.CreateFCmpOEQ(x, y));
      case Op::kNe: return to_byte(b_.CreateFCmpUNE(x, y));
      case Op::kLt: return to_byte(b_.CreateFCmpOLT(x, y));
      case Op::kLe: return to_byte(b_.CreateFCmpOLE(x, y));
      case Op::kGt: return to_byte(b_.CreateFCmpOGT(x, y));
      case Op::kGe: return to_byte(b_.CreateFCmpOGE(x, y));
      case Op::kWhere: return b_.CreateSelect(b_.CreateICmpNE(x, zero_like(x)), y, c);
      default: return nullptr;
    }
  }

  llvm::Value* int_step(Op op, llvm::Value* x, llvm::Value* y, llvm::Value* c) {
    llvm::Value* zero = zero_like(x);
    switch (op) {
      case Op::kNeg: return b_.CreateSub(zero, x);
      case Op::kAbs: return b_.CreateSelect(b_.CreateICmpSLT(x, zero), b_.CreateSub(zero, x), x);
      case Op::kSign:
        return b_.CreateSub(b_.CreateZExt(b_.CreateICmpSGT(x, zero), x->getType()),
                            b_.CreateZExt(b_.CreateICmpSLT(x, zero), x->getType()));
      case Op::kSquare: return b_.CreateMul(x, x);
      case Op::kRelu: return b_.CreateSelect(b_.CreateICmpSGT(x, zero), x, zero);
      case Op::kAdd: return b_.CreateAdd(x, y);
      case Op::kSub: return b_.CreateSub(x, y);
      case Op::kMul: return b_.CreateMul(x, y);
      case Op::kDiv: {  // as int_div: x / 0 is 0, x / -1 is -x wrapping; divide by 1 in those lanes
        llvm::Value* by_zero = b_.CreateICmpEQ(y, zero);
        llvm::Value* by_minus_one = b_.CreateICmpEQ(y, llvm::ConstantInt::getSigned(y->getType(), -1));
        llvm::Value* safe = b_.CreateSelect(b_.CreateOr(by_zero, by_minus_one), llvm::ConstantInt::get(y->getType(), 1), y);
        llvm::Value* q = b_.CreateSDiv(x, safe);
        return b_.CreateSelect(by_zero, zero, b_.CreateSelect(by_minus_one, b_.CreateSub(zero, x), q));
      }
      case Op::kMaximum: return b_.CreateSelect(b_.CreateICmpSGT(x, y), x, y);
      case Op::kMinimum: return b_.CreateSelect(b_.CreateICmpSLT(x, y), x, y);
      case Op::kEq: return to_byte(b_.CreateICmpEQ(x, y));
      case Op::kNe: return to_byte(b_.CreateICmpNE(x, y));
      case Op::kLt: return to_byte(b_.CreateICmpSLT(x, y));
      case Op::kLe: return to_byte(b_.CreateICmpSLE(x, y));
      case Op::kGt: return to_byte(b_.CreateICmpSGT(x, y));
      case Op::kGe: return to_byte(b_.CreateICmpSGE(x, y));
      case Op::kWhere: return b_.CreateSelect(b_.CreateICmpNE(x, zero_like(x)), y, c);
      default: return nullptr;
    }
  }

  llvm::Value* bool_step(Op op, llvm::Value* x, llvm::Value* y, llvm::Value* c) {
    llvm::Value* zero = zero_like(x);
    switch (op) {
      case Op::kLogicalNot: return to_byte(b_.CreateICmpEQ(x, zero));
      case Op::kLogicalAnd: return to_byte(b_.CreateAnd(b_.CreateICmpNE(x, zero), b_.CreateICmpNE(y, zero)));
      case Op::kLogicalOr: return to_byte(b_.CreateOr(b_.CreateICmpNE(x, zero), b_.CreateICmpNE(y, zero)));
      case Op::kEq: return to_byte(b_.CreateICmpEQ(x, y));
      case Op::kNe: return to_byte(b_.CreateICmpNE(x, y));
      case Op::kLt: return to_byte(b_.CreateICmpULT(x, y));
      case Op::kLe: return to_byte(b_.CreateICmpULE(x, y));
      case Op::kGt: return to_byte(b_.CreateICmpUGT(x, y));
      case Op::kGe: return to_byte(b_.CreateICmpUGE(x, y));
      case Op::kWhere: return b_.CreateSelect(b_.CreateICmpNE(x, zero), y, c);
      default: return nullptr;
    }
  }

  // The interpreter's cast_block: static_cast, `!= 0` to bool, bf16 rounded (kept as f32).
  llvm::Value* cast(llvm::Value* x, DType from, DType to) {
    const unsigned w = width(x);
    const Kind fk = kind_of(from);
    if (to == DType::kBool) {
      return to_byte(fk == Kind::kFloat ? b_.CreateFCmpUNE(x, zero_like(x)) : b_.CreateICmpNE(x, zero_like(x)));
    }
    llvm::Type* t = lanes(compute_type(to), w);
    llvm::Value* v;
    if (kind_of(to) == Kind::kFloat) {
      v = fk == Kind::kFloat ? b_.CreateFPCast(x, t)
          : fk == Kind::kInt ? b_.CreateSIToFP(x, t)
                             : b_.CreateUIToFP(x, t);
      if (to == DType::kBF16) v = widen_bf16(round_bf16(v));
      return v;
    }
    if (fk == Kind::kFloat) return b_.CreateFPToSI(x, t);
    return fk == Kind::kInt ? b_.CreateSExtOrTrunc(x, t) : b_.CreateZExtOrTrunc(x, t);
  }

  llvm::LLVMContext& ctx_;
  llvm::Module& module_;
  llvm::IRBuilder<> b_;
  const LoopKernel& loop_;
  llvm::Function* fn_ = nullptr;
  std::vector<LoadPlan> plans_;
  std::vector<llvm::Value*> base_;   // per storage index: its pointer, loaded once
  std::vector<llvm::Value*> fixed_;  // per load: its loop-invariant scalar (kFixed)
  bool body_ok_ = true;              // every step of a reduction loop's body had a generated form
};

class JitLoops final : public NativeLoops {
 public:
  JitLoops(llvm::orc::JITDylib* library, std::vector<NativeLoopFn> fns, std::vector<std::vector<int>> storages,
           int64_t functions, Source source)
      : library_(library), fns_(std::move(fns)), storages_(std::move(storages)), functions_(functions), source_(source) {}
  ~JitLoops() override {
    if (library_ == nullptr) return;
    Jit& jit = Jit::get();
    std::lock_guard<std::mutex> lock(jit.mu);
    llvm::consumeError(jit.lljit->getExecutionSession().removeJITDylib(*library_));
  }
  Source source() const override { return source_; }
  NativeLoopFn fn(size_t i) const override { return i < fns_.size() ? fns_[i] : nullptr; }
  std::span<const int> storages(size_t i) const override {
    return i < storages_.size() ? std::span<const int>(storages_[i]) : std::span<const int>();
  }
  int64_t compiled() const override {
    int64_t n = 0;
    for (NativeLoopFn f : fns_) n += f != nullptr;
    return n;
  }
  int64_t functions() const override { return functions_; }

 private:
  llvm::orc::JITDylib* library_;
  std::vector<NativeLoopFn> fns_;
  std::vector<std::vector<int>> storages_;
  int64_t functions_;
  Source source_;
};

// `loop` with its storages numbered 0, 1, ... in order of first use (loads, stores, the
// reduction), and the program storage each number stands for. Loops that differ only in which
// buffers they touch (an optimizer's update of same-shaped parameters, a layer's loops in
// every layer) are then equal and share one function; a loop reading and writing one buffer
// stays distinct from one writing another, as the numbering keeps that equality.
struct LocalLoop {
  LoopKernel loop;
  std::vector<int> storages;
};

LocalLoop localize(const LoopKernel& loop) {
  LocalLoop local{loop, {}};
  auto number = [&](int& s) {
    if (s < 0) return;
    const auto at = std::find(local.storages.begin(), local.storages.end(), s);
    const int k = static_cast<int>(at - local.storages.begin());
    if (at == local.storages.end()) local.storages.push_back(s);
    s = k;
  };
  for (LoopLoad& l : local.loop.loads) number(l.storage);
  for (LoopStore& st : local.loop.stores) number(st.storage);
  if (local.loop.reduce) number(local.loop.reduce->storage);
  return local;
}

bool same_loop(const LoopKernel& a, const LoopKernel& b) {
  auto same_load = [](const LoopLoad& x, const LoopLoad& y) {
    return x.reg == y.reg && x.storage == y.storage && x.dtype == y.dtype && x.shape == y.shape &&
           std::bit_cast<uint64_t>(x.constant) == std::bit_cast<uint64_t>(y.constant) && x.index == y.index;
  };
  auto same_step = [](const LoopStep& x, const LoopStep& y) {
    return x.op == y.op && x.fn == y.fn && x.out == y.out && std::equal(x.in, x.in + 3, y.in);
  };
  auto same_store = [](const LoopStore& x, const LoopStore& y) {
    return x.reg == y.reg && x.storage == y.storage && x.dtype == y.dtype;
  };
  auto same_reduce = [](const LoopReduce& x, const LoopReduce& y) {
    return x.op == y.op && x.reg == y.reg && x.storage == y.storage && x.dtype == y.dtype && x.outer == y.outer &&
           x.reduced == y.reduced && x.inner == y.inner && x.axes == y.axes;
  };
  return a.shape == b.shape && a.reg_dtype == b.reg_dtype &&
         std::equal(a.loads.begin(), a.loads.end(), b.loads.begin(), b.loads.end(), same_load) &&
         std::equal(a.steps.begin(), a.steps.end(), b.steps.begin(), b.steps.end(), same_step) &&
         std::equal(a.stores.begin(), a.stores.end(), b.stores.begin(), b.stores.end(), same_store) &&
         a.reduce.has_value() == b.reduce.has_value() && (!a.reduce || same_reduce(*a.reduce, *b.reduce));
}

uint64_t hash_shape(uint64_t h, const Shape& shape) {
  for (int64_t d : shape) h = hash_combine(h, static_cast<uint64_t>(d));
  return hash_combine(h, shape.size());
}

// Everything the generated function of `loop` depends on (ops and dtypes by name, not by
// enum position).
uint64_t hash_loop(uint64_t h, const LoopKernel& loop) {
  h = hash_shape(h, loop.shape);
  for (DType d : loop.reg_dtype) h = hash_bytes(h, dtype_name(d));
  for (const LoopLoad& l : loop.loads) {
    h = hash_bytes(hash_combine(hash_combine(h, l.reg), static_cast<uint64_t>(l.storage)), dtype_name(l.dtype));
    h = hash_combine(hash_double(hash_shape(h, l.shape), l.constant), l.index);
  }
  for (const LoopStep& st : loop.steps) {
    h = hash_combine(hash_bytes(h, op_name(st.op)), static_cast<uint64_t>(st.out));
    for (int in : st.in) h = hash_combine(h, static_cast<uint64_t>(in));
  }
  for (const LoopStore& st : loop.stores) {
    h = hash_bytes(hash_combine(hash_combine(h, st.reg), static_cast<uint64_t>(st.storage)), dtype_name(st.dtype));
  }
  if (const auto& r = loop.reduce) {
    h = hash_bytes(hash_bytes(h, op_name(r->op)), dtype_name(r->dtype));
    for (int64_t v : {int64_t{r->reg}, int64_t{r->storage}, r->outer, r->reduced, r->inner}) h = hash_combine(h, static_cast<uint64_t>(v));
    h = hash_shape(h, r->axes);
  }
  return h;
}

// The persistent cache's key: everything the object depends on. The loops in their own
// storage numbering (localize), which also decides which loops share a function; this
// generator's source (XS_CODEGEN_SOURCE_HASH, made by CMake from the files that decide the
// generated code and the op and dtype lists), the CPU and the LLVM version. Computed from the
// loops, so a hit builds no IR at all.
// `loop_hashes`: hash_loop(0, ...) of each localized loop, nullopt where there is none.
uint64_t object_key(const std::vector<std::optional<uint64_t>>& loop_hashes, const std::string& cpu) {
  uint64_t h = hash_bytes(kHashSeed, XS_CODEGEN_SOURCE_HASH);
  h = hash_bytes(h, cpu + " LLVM " LLVM_VERSION_STRING);
  for (size_t i = 0; i < loop_hashes.size(); ++i) {
    h = hash_combine(h, loop_hashes[i] ? i : ~uint64_t{0});
    if (loop_hashes[i]) h = hash_combine(h, *loop_hashes[i]);
  }
  return h;
}

std::vector<char> emit_object(llvm::TargetMachine& target, llvm::Module& module) {
  llvm::SmallVector<char, 0> object;
  llvm::raw_svector_ostream out(object);
  llvm::legacy::PassManager passes;
  XS_CHECK(!target.addPassesToEmitFile(passes, out, nullptr, llvm::CGFT_ObjectFile),
           "codegen: the target cannot emit object files");
  passes.run(module);
  return {object.begin(), object.end()};
}

// Links `object` into a new library and finds every named loop; null when the object does
// not link or lacks a symbol (the library is then removed again).
std::unique_ptr<JitLoops> link(Jit& jit, const std::vector<char>& object, const std::vector<std::string>& names,
                               std::vector<std::vector<int>> storages, NativeLoops::Source source, std::string* problem) {
  llvm::orc::ExecutionSession& session = jit.lljit->getExecutionSession();
  llvm::Expected<llvm::orc::JITDylib&> created = session.createJITDylib(fmt::format("program_{}", jit.next_library++));
  if (!created) throw InternalError("codegen: creating a library: " + llvm_message(created.takeError()));
  llvm::orc::JITDylib& library = *created;
  library.addToLinkOrder(jit.lljit->getMainJITDylib());
  std::vector<NativeLoopFn> fns(names.size(), nullptr);
  llvm::Error error = jit.lljit->addObjectFile(
      library, llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size())));
  std::unordered_map<std::string, NativeLoopFn> found;
  for (size_t i = 0; !error && i < names.size(); ++i) {
    if (names[i].empty()) continue;
    if (const auto at = found.find(names[i]); at != found.end()) {
      fns[i] = at->second;
      continue;
    }
    llvm::Expected<llvm::JITEvaluatedSymbol> symbol = jit.lljit->lookup(library, names[i]);
    if (!symbol) error = symbol.takeError();
    else fns[i] = found[names[i]] = reinterpret_cast<NativeLoopFn>(symbol->getAddress());
  }
  if (error) {
    *problem = llvm_message(std::move(error));
    llvm::consumeError(session.removeJITDylib(library));
    return nullptr;
  }
  return std::make_unique<JitLoops>(&library, std::move(fns), std::move(storages), static_cast<int64_t>(found.size()),
                                    source);
}

}  // namespace

void start_native_jit() { Jit::get(); }

std::unique_ptr<NativeLoops> compile_native_loops(const std::vector<const LoopKernel*>& loops,
                                                  const ObjectCache* cache) {
  Jit& jit = Jit::get();
  std::lock_guard<std::mutex> lock(jit.mu);
  // Each loop in its own storage numbering; equal ones share the function named after the
  // first of them.
  std::vector<std::optional<LocalLoop>> local(loops.size());
  std::vector<std::optional<uint64_t>> hashes(loops.size());
  std::vector<std::string> names(loops.size());
  std::vector<std::vector<int>> storages(loops.size());
  std::vector<size_t> owners;  // the loops whose functions are emitted
  std::unordered_multimap<uint64_t, size_t> by_hash;
  for (size_t i = 0; i < loops.size(); ++i) {
    if (loops[i] == nullptr) continue;
    local[i] = localize(*loops[i]);
    storages[i] = local[i]->storages;
    const uint64_t h = *(hashes[i] = hash_loop(0, local[i]->loop));
    size_t owner = i;
    for (auto [at, end] = by_hash.equal_range(h); at != end; ++at) {
      if (same_loop(local[at->second]->loop, local[i]->loop)) {
        owner = at->second;
        break;
      }
    }
    if (owner == i) by_hash.emplace(h, i), owners.push_back(i);
    names[i] = fmt::format("loop_{}", owner);
  }
  if (owners.empty()) {
    return std::make_unique<JitLoops>(nullptr, std::vector<NativeLoopFn>(loops.size(), nullptr),
                                      std::vector<std::vector<int>>(), 0, NativeLoops::Source::kNone);
  }
  std::string problem;
  const bool use_cache = cache != nullptr && cache->usable();
  const uint64_t key = use_cache ? object_key(hashes, jit.description) : 0;
  if (use_cache) {
    if (std::optional<std::vector<char>> object = cache->load(key)) {
      if (auto from_disk = link(jit, *object, names, storages, NativeLoops::Source::kDiskCache, &problem)) return from_disk;
      spdlog::warn("compile cache: {} does not link ({}); compiling again and replacing it", cache->path(key), problem);
    }
  }
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>("xs_loops", *context);
  module->setDataLayout(jit.target->createDataLayout());
  module->setTargetTriple(jit.target->getTargetTriple().str());
  for (size_t i : owners) {
    XS_CHECK(LoopEmitter(*module, local[i]->loop, names[i]).emit(), "codegen: a step of {} has no generated form",
             loop_text(*loops[i]));
  }
  std::string errors;
  llvm::raw_string_ostream os(errors);
  XS_CHECK(!llvm::verifyModule(*module, &os), "codegen: invalid IR: {}", os.str());
  const std::vector<char> object = emit_object(*jit.target, *module);
  std::unique_ptr<JitLoops> compiled = link(jit, object, names, std::move(storages), NativeLoops::Source::kCompiled, &problem);
  XS_CHECK(compiled != nullptr, "codegen: a freshly compiled object does not link: {}", problem);
  if (use_cache) cache->store(key, object);
  return compiled;
}

}  // namespace xs::detail
