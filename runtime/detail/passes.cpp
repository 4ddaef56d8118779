#include "runtime/detail/passes.h"

#include <unordered_map>

#include "runtime/detail/loop.h"
#include "runtime/element.h"
#include "runtime/hash.h"
#include "runtime/node.h"

namespace xs::detail {
namespace {

bool is_const(const Work& w, int i, double* value = nullptr) {
  if (w.nodes[i].op != Op::kConst) return false;
  if (value) *value = w.nodes[i].attrs.scalar;
  return true;
}

bool is_const_value(const Work& w, int i, double v) {
  double c;
  return is_const(w, i, &c) && c == v;
}

// Evaluates elementwise `n` on constant operands with the real block kernel, so folding
// rounds exactly as execution would.
double eval_elementwise(const Work& w, const GNode& n) {
  double in[3][1] = {{0}, {0}, {0}}, out[1] = {0};
  const DType operand_dtype = w.nodes[n.operands.back()].type.dtype;
  for (size_t k = 0; k < n.operands.size(); ++k) {
    const GNode& o = w.nodes[n.operands[k]];
    DType cdt = o.type.dtype == DType::kBF16 ? DType::kF32 : o.type.dtype;
    store_element(in[k], cdt, 0, o.type.dtype == DType::kBF16
                                     ? BF16::from_float(static_cast<float>(o.attrs.scalar)).to_float()
                                     : o.attrs.scalar);
  }
  BlockFn fn = elementwise_block_fn(n.op, n.op == Op::kWhere ? w.nodes[n.operands[1]].type.dtype
                                                             : (n.op == Op::kCast ? w.nodes[n.operands[0]].type.dtype
                                                                                  : operand_dtype),
                                    n.type.dtype);
  fn(out, in[0], in[1], in[2], 1);
  const DType rdt = n.type.dtype == DType::kBF16 ? DType::kF32 : n.type.dtype;
  return load_element(out, rdt, 0);
}

// The operand `n` reduces to (x*1 -> x), or -1.
int identity_of(const Work& w, const GNode& n) {
  const auto same = [&](int i) { return w.nodes[i].type == n.type ? i : -1; };
  const auto& o = n.operands;
  switch (n.op) {
    case Op::kMul:
      if (is_const_value(w, o[1], 1)) return same(o[0]);
      if (is_const_value(w, o[0], 1)) return same(o[1]);
      return -1;
    case Op::kAdd:
      if (is_const_value(w, o[1], 0)) return same(o[0]);
      if (is_const_value(w, o[0], 0)) return same(o[1]);
      return -1;
    case Op::kSub: return is_const_value(w, o[1], 0) ? same(o[0]) : -1;
    case Op::kDiv: return is_const_value(w, o[1], 1) ? same(o[0]) : -1;
    case Op::kCast: case Op::kReshape: case Op::kBroadcast: return same(o[0]);
    default: return -1;
  }
}

}  // namespace

void fold_constants(Work& w, CompileStats& stats) {
  std::vector<int> repl(w.nodes.size());
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    repl[i] = static_cast<int>(i);
    GNode& n = w.nodes[i];
    for (int& o : n.operands) o = repl[o];
    if (n.op == Op::kConst || n.op == Op::kData) continue;
    bool all_const = !n.operands.empty();
    for (int o : n.operands) all_const &= is_const(w, o);
    const bool layout = n.op == Op::kReshape || n.op == Op::kBroadcast || n.op == Op::kPermute ||
                        n.op == Op::kSlice;
    if (all_const && (is_elementwise(n.op) || layout)) {
      const double v = layout ? w.nodes[n.operands[0]].attrs.scalar : eval_elementwise(w, n);
      n.op = Op::kConst;
      n.attrs = Attrs{};
      n.attrs.scalar = v;
      n.operands.clear();
      ++stats.folded;
    } else if (const int id = identity_of(w, n); id >= 0) {
      repl[i] = id;
      ++stats.folded;
    }
  }
  for (int& r : w.roots) r = repl[r];
}

void eliminate_common_subexpressions(Work& w, CompileStats& stats) {
  std::vector<int> repl(w.nodes.size());
  std::unordered_multimap<uint64_t, int> seen;
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    repl[i] = static_cast<int>(i);
    GNode& n = w.nodes[i];
    for (int& o : n.operands) o = repl[o];
    if (n.op == Op::kData) continue;  // inputs are already unique per buffer
    uint64_t h = hash_type(hash_attrs(hash_combine(kHashSeed, static_cast<uint64_t>(n.op)), n.attrs), n.type);
    for (int o : n.operands) h = hash_combine(h, static_cast<uint64_t>(o));
    auto [lo, hi] = seen.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      const GNode& m = w.nodes[it->second];
      if (m.op == n.op && m.attrs == n.attrs && m.type == n.type && m.operands == n.operands) {
        repl[i] = it->second;
        ++stats.cse_merged;
        break;
      }
    }
    if (repl[i] == static_cast<int>(i)) seen.emplace(h, static_cast<int>(i));
  }
  for (int& r : w.roots) r = repl[r];
}

void eliminate_dead_code(Work& w, CompileStats& stats) {
  std::vector<uint8_t> live(w.nodes.size(), 0);
  for (int r : w.roots) live[r] = 1;
  for (int i = static_cast<int>(w.nodes.size()) - 1; i >= 0; --i) {
    if (!live[i]) continue;
    for (int o : w.nodes[i].operands) live[o] = 1;
  }
  std::vector<int> new_id(w.nodes.size(), -1);
  std::vector<GNode> kept;
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    // Inputs stay (dead or not): the program's input list must match the graph's.
    if (!live[i] && w.nodes[i].op != Op::kData) {
      ++stats.dce_removed;
      continue;
    }
    new_id[i] = static_cast<int>(kept.size());
    kept.push_back(std::move(w.nodes[i]));
    for (int& o : kept.back().operands) o = new_id[o];
  }
  for (int& r : w.roots) r = new_id[r];
  w.nodes = std::move(kept);
  stats.nodes_out = static_cast<int64_t>(w.nodes.size());
}

namespace {

// The accumulating form applies when `m` is a plain 2-D f32/f64 matmul used only by `add` and
// `scaled` is x * s (either order) with x of the matmul's type and s 0-d, used only by `add`.
bool accumulate_operands(const Work& w, const std::vector<int>& uses, const std::vector<uint8_t>& is_root, int m,
                         int scaled, int* x, int* s) {
  const GNode& mm = w.nodes[m];
  const GNode& mul = w.nodes[scaled];
  if (mm.op != Op::kMatmul || mm.operands.size() != 2 || mul.op != Op::kMul) return false;
  if (uses[m] != 1 || uses[scaled] != 1 || is_root[m] || is_root[scaled]) return false;
  if (mm.type.shape.size() != 2 || w.nodes[mm.operands[0]].type.shape.size() != 2 ||
      w.nodes[mm.operands[1]].type.shape.size() != 2) return false;
  if (mm.type.dtype != DType::kF32 && mm.type.dtype != DType::kF64) return false;
  for (int k = 0; k < 2; ++k) {
    const GNode& a = w.nodes[mul.operands[k]];
    const GNode& b = w.nodes[mul.operands[1 - k]];
    if (a.type == mm.type && b.type.shape.empty() && b.type.dtype == mm.type.dtype) {
      *x = mul.operands[k];
      *s = mul.operands[1 - k];
      return true;
    }
  }
  return false;
}

}  // namespace

void fuse_gemm_accumulate(Work& w, CompileStats& stats) {
  std::vector<int> uses(w.nodes.size(), 0);
  std::vector<uint8_t> is_root(w.nodes.size(), 0);
  for (const GNode& n : w.nodes) for (int o : n.operands) ++uses[o];
  for (int r : w.roots) is_root[r] = 1;
  for (GNode& n : w.nodes) {
    if (n.op != Op::kAdd || n.operands.size() != 2) continue;
    for (int k = 0; k < 2; ++k) {
      const int m = n.operands[k], scaled = n.operands[1 - k];
      int x = -1, s = -1;
      if (!accumulate_operands(w, uses, is_root, m, scaled, &x, &s)) continue;
      const GNode mm = w.nodes[m];
      if (mm.type != n.type) continue;
      n.op = Op::kMatmul;
      n.attrs = mm.attrs;
      n.operands = {mm.operands[0], mm.operands[1], x, s};
      ++stats.gemm_accumulates;
      break;
    }
  }
}

}  // namespace xs::detail
