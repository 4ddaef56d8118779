#include "xla_spawn/runtime/compiler/passes.h"

#include <algorithm>
#include <initializer_list>
#include <unordered_map>

#include "xla_spawn/runtime/kernels/kernels.h"
#include "xla_spawn/runtime/kernels/loop.h"
#include "xla_spawn/runtime/element.h"
#include "xla_spawn/runtime/hash.h"
#include "xla_spawn/runtime/node.h"

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

namespace {

// The max_pool2d(y) node with `attrs` before `before`, or -1.
int find_pool(const Work& w, int y, const Attrs& attrs, int before) {
  for (int i = y + 1; i < before; ++i) {
    const GNode& n = w.nodes[i];
    if (n.op == Op::kMaxPool2d && n.operands[0] == y && n.attrs == attrs) return i;
  }
  return -1;
}

// For mul(max_pool2d_grad(y, g), cast(gt(y, 0))) (either operand order) at `i`: the grad node,
// the pool node and the zero constant; false when `i` is not of that form.
bool masked_pool_grad(const Work& w, int i, int* grad, int* pool, int* zero) {
  const GNode& n = w.nodes[i];
  if (n.op != Op::kMul || n.operands.size() != 2 || !is_float(n.type.dtype)) return false;
  for (int k = 0; k < 2; ++k) {
    const GNode& pg = w.nodes[n.operands[k]];
    const GNode& c = w.nodes[n.operands[1 - k]];
    if (pg.op != Op::kMaxPool2dGrad || pg.type != n.type) continue;
    if (c.op != Op::kCast || c.type != n.type) continue;
    const GNode& gt = w.nodes[c.operands[0]];
    if (gt.op != Op::kGt || gt.operands[0] != pg.operands[0] ||
        !is_const_value(w, gt.operands[1], 0) || !w.nodes[gt.operands[1]].type.shape.empty())
      continue;
    const int p = find_pool(w, pg.operands[0], pg.attrs, i);
    if (p < 0) continue;
    *grad = n.operands[k];
    *pool = p;
    *zero = gt.operands[1];
    return true;
  }
  return false;
}

// Whether any node of `w` is one of `ops`. The fusions below rewrite forms around pools,
// convolutions and causal softmaxes; a graph without the op leaves each of them at once
// instead of being copied node by node (a 256-layer GPT's graph has none of the first two).
bool has_op(const Work& w, std::initializer_list<Op> ops) {
  return std::any_of(w.nodes.begin(), w.nodes.end(),
                     [&](const GNode& n) { return std::find(ops.begin(), ops.end(), n.op) != ops.end(); });
}

bool covers_spatial_axes(const std::vector<int64_t>& axes) {
  return std::find(axes.begin(), axes.end(), 2) != axes.end() &&
         std::find(axes.begin(), axes.end(), 3) != axes.end();
}

}  // namespace

void fuse_pool_grad_mask(Work& w) {
  if (!has_op(w, {Op::kMaxPool2dGrad})) return;
  std::vector<GNode> out;
  std::vector<int> new_id(w.nodes.size(), -1);
  out.reserve(w.nodes.size() + 8);
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    GNode n = w.nodes[i];
    int grad = -1, pool = -1, zero = -1;
    if (masked_pool_grad(w, static_cast<int>(i), &grad, &pool, &zero)) {
      const GNode& pg = w.nodes[grad];
      const ValueType pooled = w.nodes[pool].type;
      // Field by field: GCC 12 warns (maybe-uninitialized) on brace-initialised GNodes here.
      const auto push = [&](Op op, DType dtype, std::vector<int> operands) {
        GNode& m = out.emplace_back();
        m.op = op;
        m.attrs.dtype = dtype;
        m.type = {pooled.shape, op == Op::kGt ? DType::kBool : pooled.dtype};
        m.operands = std::move(operands);
        return static_cast<int>(out.size()) - 1;
      };
      const int gt = push(Op::kGt, DType::kF32, {new_id[pool], new_id[zero]});
      const int cast = push(Op::kCast, pooled.dtype, {gt});
      const int masked = push(Op::kMul, DType::kF32, {new_id[pg.operands[1]], cast});
      n.op = Op::kMaxPool2dGrad;
      n.attrs = pg.attrs;
      n.operands = {new_id[pg.operands[0]], masked};
    } else {
      for (int& o : n.operands) o = new_id[o];
      const GNode* src = n.operands.empty() ? nullptr : &out[n.operands[0]];
      // sum over H and W of a max-pool gradient: the same sum of what it routes.
      if (n.op == Op::kSum && src && src->op == Op::kMaxPool2dGrad &&
          covers_spatial_axes(n.attrs.ints))
        n.operands[0] = src->operands[1];
    }
    new_id[i] = static_cast<int>(out.size());
    out.push_back(std::move(n));
  }
  for (int& r : w.roots) r = new_id[r];
  w.nodes = std::move(out);
}

namespace {

struct Uses {
  std::vector<uint8_t> live;                // a root depends on it
  std::vector<std::vector<int>> consumers;  // live consumers only
};

Uses live_uses(const Work& w) {
  Uses u{std::vector<uint8_t>(w.nodes.size(), 0), std::vector<std::vector<int>>(w.nodes.size())};
  for (int r : w.roots) u.live[r] = 1;
  for (int i = static_cast<int>(w.nodes.size()) - 1; i >= 0; --i) {
    if (!u.live[i]) continue;
    for (int o : w.nodes[i].operands) {
      u.live[o] = 1;
      if (u.consumers[o].empty() || u.consumers[o].back() != i) u.consumers[o].push_back(i);
    }
  }
  return u;
}

// For relu node `r` = relu(add(x, b)) with b [1, C, 1, 1] and x [N, C, H, W] (f32/f64), read
// only by max_pool2d and two-operand max_pool2d_grad (as their pooled input): x and b.
bool pooled_bias_relu(const Work& w, const Uses& u, const std::vector<uint8_t>& is_root, int r,
                      int* x, int* b) {
  const GNode& relu = w.nodes[r];
  if (relu.op != Op::kRelu || !u.live[r] || is_root[r] || relu.type.shape.size() != 4) return false;
  if (relu.type.dtype != DType::kF32 && relu.type.dtype != DType::kF64) return false;
  const int a = relu.operands[0];
  const GNode& add = w.nodes[a];
  if (add.op != Op::kAdd || is_root[a] || u.consumers[a].size() != 1) return false;
  const Shape& s = relu.type.shape;
  for (int k = 0; k < 2; ++k) {
    const GNode& xn = w.nodes[add.operands[k]];
    const GNode& bn = w.nodes[add.operands[1 - k]];
    if (xn.type != relu.type || bn.type.shape != Shape{1, s[1], 1, 1}) continue;
    bool pooled_only = !u.consumers[r].empty();
    for (int c : u.consumers[r]) {
      const GNode& n = w.nodes[c];
      pooled_only &=
          (n.op == Op::kMaxPool2d || (n.op == Op::kMaxPool2dGrad && n.operands.size() == 2)) &&
          n.operands[0] == r;
    }
    if (!pooled_only) return false;
    *x = add.operands[k];
    *b = add.operands[1 - k];
    return true;
  }
  return false;
}

}  // namespace

void fuse_pool_bias_relu(Work& w) {
  if (!has_op(w, {Op::kMaxPool2d, Op::kMaxPool2dGrad})) return;
  const Uses u = live_uses(w);
  std::vector<uint8_t> is_root(w.nodes.size(), 0);
  for (int r : w.roots) is_root[r] = 1;
  // Per pool / pool-gradient node to rewrite: the pre-activation x and the bias b.
  std::vector<std::pair<int, int>> from(w.nodes.size(), {-1, -1});
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    int x = -1, b = -1;
    if (!pooled_bias_relu(w, u, is_root, static_cast<int>(i), &x, &b)) continue;
    for (int c : u.consumers[i]) from[c] = {x, b};
  }
  std::vector<GNode> out;
  std::vector<int> new_id(w.nodes.size(), -1);
  out.reserve(w.nodes.size() + 8);
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    GNode n = w.nodes[i];
    for (int& o : n.operands) o = new_id[o];
    const auto [x, b] = from[i];
    if (x >= 0 && n.op == Op::kMaxPool2dGrad) {
      n.operands = {new_id[x], n.operands[1], new_id[b]};
    } else if (x >= 0) {
      n.operands = {new_id[x], new_id[b]};  // max_pool2d(x, b) = relu(max_pool2d(x) + b)
    }
    new_id[i] = static_cast<int>(out.size());
    out.push_back(std::move(n));
  }
  for (int& r : w.roots) r = new_id[r];
  w.nodes = std::move(out);
}

namespace {

// The max_pool2d_grad node that operand `k` of conv gradient `c` reads, when every live reader
// of it is a conv gradient reading it there (so fusing them all leaves it dead), or -1.
int fusable_pool_grad(const Work& w, const Uses& u, const std::vector<uint8_t>& is_root, int c) {
  const GNode& n = w.nodes[c];
  const size_t k = n.op == Op::kConv2dGradInput ? 0 : 1;
  if (n.operands.size() != 2 || n.attrs.ints.size() != 6) return -1;
  const int g = n.operands[k];
  const GNode& pg = w.nodes[g];
  if (pg.op != Op::kMaxPool2dGrad || is_root[g] || pg.attrs.ints.size() != 6) return -1;
  if (pg.type.dtype != DType::kF32 && pg.type.dtype != DType::kF64) return -1;
  if (pg.type.dtype == DType::kF32 && onednn_runs_f32_conv(n.type.shape[1])) return -1;
  for (int r : u.consumers[g]) {
    const GNode& m = w.nodes[r];
    const bool input = m.op == Op::kConv2dGradInput, weight = m.op == Op::kConv2dGradWeight;
    if (!(input || weight) || m.operands.size() != 2 || m.operands[input ? 0 : 1] != g ||
        m.operands[input ? 1 : 0] == g)
      return -1;
  }
  return g;
}

}  // namespace

void fuse_conv_pool_grad(Work& w) {
  if (!has_op(w, {Op::kMaxPool2dGrad})) return;
  const Uses u = live_uses(w);
  std::vector<uint8_t> is_root(w.nodes.size(), 0);
  for (int r : w.roots) is_root[r] = 1;
  // Decide for every node first: rewriting one reader of a pool gradient changes what the
  // check sees for the next.
  std::vector<int> from(w.nodes.size(), -1);
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    const Op op = w.nodes[i].op;
    if ((op == Op::kConv2dGradInput || op == Op::kConv2dGradWeight) && u.live[i])
      from[i] = fusable_pool_grad(w, u, is_root, static_cast<int>(i));
  }
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    if (from[i] < 0) continue;
    GNode& n = w.nodes[i];
    const GNode& pg = w.nodes[from[i]];  // (y, h) or (y, h, bias)
    const size_t k = n.op == Op::kConv2dGradInput ? 0 : 1;
    n.operands[k] = pg.operands[1];
    n.operands.push_back(pg.operands[0]);
    if (pg.operands.size() == 3) n.operands.push_back(pg.operands[2]);
    n.attrs.ints.insert(n.attrs.ints.end(), pg.attrs.ints.begin(), pg.attrs.ints.end());
  }
}

namespace {

const std::vector<int64_t> kPool2x2{2, 2, 2, 2, 0, 0};

// For conv2d node `c` = conv2d(x, w) (f32/f64, even output): the bias b when its live readers
// are one max_pool2d(c, b) with 2x2 / stride 2 attrs and, after it, conv gradients fused with
// that pool (.., c, b); else -1.
int fusable_conv(const Work& w, const Uses& u, const std::vector<uint8_t>& is_root, int c) {
  const GNode& n = w.nodes[c];
  if (n.op != Op::kConv2d || n.operands.size() != 2 || is_root[c] || !u.live[c]) return -1;
  if (n.type.dtype != DType::kF32 && n.type.dtype != DType::kF64) return -1;
  if (n.type.dtype == DType::kF32 && onednn_runs_f32_conv(w.nodes[n.operands[0]].type.shape[1])) return -1;
  if (n.type.shape[2] % 2 != 0 || n.type.shape[3] % 2 != 0) return -1;
  int b = -1, pool = -1;
  for (int r : u.consumers[c]) {
    const GNode& m = w.nodes[r];
    const std::vector<int>& o = m.operands;
    int mb = -1;
    if (m.op == Op::kMaxPool2d && o.size() == 2 && o[0] == c && o[1] != c && m.attrs.ints == kPool2x2) {
      if (pool >= 0) return -1;
      pool = r;
      mb = o[1];
    } else if ((m.op == Op::kConv2dGradInput || m.op == Op::kConv2dGradWeight) && o.size() == 4 &&
               o[2] == c && o[0] != c && o[1] != c && o[3] != c && m.attrs.ints.size() == 12 &&
               std::equal(kPool2x2.begin(), kPool2x2.end(), m.attrs.ints.begin() + 6)) {
      mb = o[3];
    } else {
      return -1;
    }
    if (b >= 0 && mb != b) return -1;
    b = mb;
  }
  if (pool < 0) return -1;
  for (int r : u.consumers[c])
    if (r < pool) return -1;
  return b;
}

// At the pool's place: f = conv2d(x, w, b) and the pool node becomes reshape(slice(f)[0]).
// Returns f's index in `out`.
int emit_fused_conv(const GNode& conv, int x, int wt, int b, std::vector<GNode>& out, GNode& pool_node) {
  const Shape& y = conv.type.shape;  // [n, o, h, w]
  const Shape pooled{y[0], y[1], y[2] / 2, y[3] / 2};
  GNode& f = out.emplace_back();
  f.op = Op::kConv2d;
  f.attrs = conv.attrs;
  f.attrs.ints.insert(f.attrs.ints.end(), kPool2x2.begin(), kPool2x2.end());
  f.operands = {x, wt, b};
  f.type = {{2, pooled[0], pooled[1], pooled[2], pooled[3]}, conv.type.dtype};
  const int fid = static_cast<int>(out.size()) - 1;
  GNode& sl = out.emplace_back();
  sl.op = Op::kSlice;
  sl.attrs.ints = {0, 1, 1};
  for (int64_t d : pooled) sl.attrs.ints.insert(sl.attrs.ints.end(), {0, d, 1});
  sl.operands = {fid};
  sl.type = {{1, pooled[0], pooled[1], pooled[2], pooled[3]}, conv.type.dtype};
  pool_node.op = Op::kReshape;
  pool_node.attrs = Attrs{};
  pool_node.attrs.ints = pooled;
  pool_node.operands = {static_cast<int>(out.size()) - 1};
  return fid;
}

}  // namespace

void fuse_conv_pool_forward(Work& w) {
  if (!has_op(w, {Op::kConv2d})) return;
  const Uses u = live_uses(w);
  std::vector<uint8_t> is_root(w.nodes.size(), 0);
  for (int r : w.roots) is_root[r] = 1;
  std::vector<int> bias_of(w.nodes.size(), -1), conv_of(w.nodes.size(), -1);
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    bias_of[i] = fusable_conv(w, u, is_root, static_cast<int>(i));
    if (bias_of[i] >= 0)
      for (int r : u.consumers[i]) conv_of[r] = static_cast<int>(i);
  }
  std::vector<GNode> out;
  std::vector<int> new_id(w.nodes.size(), -1), fused(w.nodes.size(), -1);
  out.reserve(w.nodes.size() + 8);
  for (size_t i = 0; i < w.nodes.size(); ++i) {
    GNode n = w.nodes[i];
    for (int& o : n.operands) o = new_id[o];
    if (const int c = conv_of[i]; c >= 0 && n.op == Op::kMaxPool2d) {
      const GNode& conv = w.nodes[c];
      fused[c] = emit_fused_conv(conv, new_id[conv.operands[0]], new_id[conv.operands[1]],
                                 new_id[bias_of[c]], out, n);
    } else if (c >= 0) {  // (h, w, y, b) / (x, h, y, b) -> (h, w, f) / (x, h, f)
      n.operands = {n.operands[0], n.operands[1], fused[c]};
    }
    new_id[i] = static_cast<int>(out.size());
    out.push_back(std::move(n));
  }
  for (int& r : w.roots) r = new_id[r];
  w.nodes = std::move(out);
}

}  // namespace xs::detail

namespace xs::detail {
namespace {

bool is_causal_softmax(const GNode& n) {
  return (n.op == Op::kSoftmax || n.op == Op::kSoftmaxGrad) && n.attrs.flag == 1;
}

// For elementwise `n` that maps each element on its own and keeps zeros and the shape (a
// product by or division by a 0-d value, a negation, a cast): its operand carrying the
// element, or -1.
int element_carrier(const Work& w, const GNode& n) {
  const auto scalar = [&](int i) { return w.nodes[i].type.shape.empty(); };
  const auto same_shape = [&](int i) { return w.nodes[i].type.shape == n.type.shape ? i : -1; };
  switch (n.op) {
    case Op::kNeg: case Op::kCast: return same_shape(n.operands[0]);
    case Op::kDiv: return scalar(n.operands[1]) ? same_shape(n.operands[0]) : -1;
    case Op::kMul:
      if (scalar(n.operands[1])) return same_shape(n.operands[0]);
      if (scalar(n.operands[0])) return same_shape(n.operands[1]);
      return -1;
    default: return -1;
  }
}

// A float two-operand matmul with no structure bits yet (a plain product of rank >= 2).
bool plain_float_product(const GNode& mm, const Work& w) {
  if (mm.op != Op::kMatmul || mm.operands.size() != 2 || !is_float(mm.type.dtype)) return false;
  if ((mm.attrs.flag & ~int64_t{3}) != 0) return false;
  const Shape& s = mm.type.shape;
  return s.size() >= 2 && !w.nodes[mm.operands[0]].type.shape.empty();
}

}  // namespace

void mark_causal_products(Work& w, CompileStats& stats) {
  if (std::none_of(w.nodes.begin(), w.nodes.end(), is_causal_softmax)) return;
  const Uses u = live_uses(w);
  std::vector<uint8_t> is_root(w.nodes.size(), 0);
  for (int r : w.roots) is_root[r] = 1;
  const size_t count = w.nodes.size();
  // lower[i]: node i's value is exactly zero above the diagonal of its last two dims.
  std::vector<uint8_t> lower(count, 0);
  for (size_t i = 0; i < count; ++i) {
    const GNode& n = w.nodes[i];
    if (is_causal_softmax(n)) lower[i] = 1;
    else if (const int c = element_carrier(w, n); c >= 0) lower[i] = lower[c];
  }
  // causal_reads[i]: every live reader of node i reads only its entries with j <= i (reverse
  // order: readers come after what they read).
  std::vector<uint8_t> causal_reads(count, 0);
  for (size_t i = count; i-- > 0;) {
    if (!u.live[i] || is_root[i] || u.consumers[i].empty()) continue;
    bool all = true;
    for (int c : u.consumers[i]) {
      const GNode& r = w.nodes[c];
      // A causal softmax reads its input, its gradient grad_y (never y), only where j <= i.
      const bool reads = (is_causal_softmax(r) && (r.op == Op::kSoftmax || (r.operands[1] == static_cast<int>(i) &&
                                                                            r.operands[0] != static_cast<int>(i)))) ||
                         (element_carrier(w, r) == static_cast<int>(i) && causal_reads[c]);
      all = all && reads;
    }
    causal_reads[i] = all;
  }
  for (size_t i = 0; i < count; ++i) {
    GNode& mm = w.nodes[i];
    if (!u.live[i] || !plain_float_product(mm, w)) continue;
    const Shape& s = mm.type.shape;
    const int64_t m = s[s.size() - 2], n = s[s.size() - 1];
    const Shape& as = w.nodes[mm.operands[0]].type.shape;
    const bool ta = mm.attrs.flag & 1;
    const int64_t k = as[as.size() - (ta ? 2 : 1)];
    int64_t structure = 0;
    if (causal_reads[i] && m == n) structure = kMatmulCausalOut;
    else if (lower[mm.operands[0]] && m == k) structure = ta ? kMatmulUpperA : kMatmulLowerA;
    if (structure == 0 || m <= kCausalBlock) continue;  // one block: nothing to skip
    mm.attrs.flag |= structure;
    ++stats.causal_products;
  }
}

}  // namespace xs::detail
