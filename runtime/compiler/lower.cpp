// Lowering of an optimised graph to a Program: elementwise fusion into loop kernels (and
// into matmul epilogues), then storage planning by liveness.
//
// Fusion walks the nodes in topological order and creates kernels ("groups") in that order.
// An elementwise node joins the group of one of its operands when it has that group's shape
// and every other operand comes from a leaf, the same group, or an earlier group; so every
// group only reads from earlier groups and the emission order stays a valid schedule.
// A matmul whose single consumer is elementwise (bias add, activation) opens a group whose
// loop runs as its epilogue, in place over the GEMM result.
// A random op (rand_uniform, rand_normal, bernoulli: a pure function of its seed and the
// element's index) read only by elementwise ops of its own shape is not stored at all: each
// loop that reads it computes it again as a step (a dropout mask in the forward and again in
// the backward). Otherwise it is a loop of its own, like any elementwise value.
// A float sum, mean, max, min or argmax over any axes joins the loop (or
// GEMM epilogue) computing its operand (one reduction per loop, LoopReduce): the loop accumulates the operand as it goes,
// which is then not stored unless something else reads it (the squares of a gradient norm).
// Nothing that reads the reduction can join that loop, which finishes it only at its end.
//
// Planning then walks the groups: an output takes over a dying input's storage when the
// kernel is in-place safe (loops, reshape, all_reduce), else a new arena value; a root writes
// into a dying donated input (an updated parameter) or a fresh buffer. The arena values
// (each with the values that took it over in place, and the groups from its first write to
// its last read) are then packed into slots largest first, each into the smallest slot
// whose values it outlives or precedes, else a new slot of its size; so a slot is sized by
// its first value and never grown (a slot grown for one large value as it comes free in
// program order then holds small ones while the next large value needs a slot of its own).
#include <algorithm>
#include <functional>
#include <iterator>
#include <map>
#include <queue>
#include <set>

#include "xla_spawn/base/check.h"
#include "xla_spawn/runtime/compiler/passes.h"
#include "xla_spawn/runtime/kernels/row_sum.h"
#include "xla_spawn/runtime/program.h"

namespace xs::detail {
namespace {

struct Group {
  Kernel::Kind kind;
  int node = -1;             // kOp/kMatmul: the node
  std::vector<int> members;  // elementwise nodes (topological order once fuse() is done)
  Shape shape;               // loop shape
  bool epilogue_ok = false;  // kMatmul: its value has one elementwise consumer
  bool absorbed = false;     // merged into a later group: emits no kernel
  int reduce = -1;           // kLoop: the reduction node it accumulates, if any
};

size_t bytes_of(const ValueType& t) { return numel(t.shape) * dtype_size(t.dtype); }

// The most elementwise nodes one loop takes. LLVM's code generation grows faster than
// linearly with a loop body's length (a 4,000-operand scalar sum, a clipping norm's, took
// seconds in one body); chains longer than this continue in the next loop.
constexpr size_t kMaxLoopMembers = 256;

class Lowering {
 public:
  Lowering(Work& w, Program& p) : w_(w), p_(p), group_of_(w.nodes.size(), -1), is_root_(w.nodes.size(), 0),
                                  consumers_(w.nodes.size()) {
    for (int r : w_.roots) is_root_[r] = 1;
    for (size_t i = 0; i < w_.nodes.size(); ++i)
      for (int o : w_.nodes[i].operands)
        if (consumers_[o].empty() || consumers_[o].back() != static_cast<int>(i)) consumers_[o].push_back(static_cast<int>(i));
  }

  void run() {
    fuse();
    // Node ids are topological: members in id order are the loop's steps in a valid order
    // (absorb appends an earlier group's members).
    for (Group& g : groups_) std::sort(g.members.begin(), g.members.end());
    plan();
    emit();
  }

 private:
  bool is_leaf(int v) const { return w_.nodes[v].op == Op::kData || w_.nodes[v].op == Op::kConst; }
  static bool is_random(Op op) { return op_info(op).kind == OpKind::kRandom; }
  // A random value that loops compute where they read it (no kernel, no storage).
  bool recomputed(int v) const { return is_random(w_.nodes[v].op) && group_of_[v] < 0; }

  // Whether a constant (or a random value) needs a kernel of its own: some reader is not a
  // loop, or (random) reads it at another shape, where its elements' indices differ.
  bool needs_fill(int v) const {
    if (is_root_[v]) return true;
    const bool random = is_random(w_.nodes[v].op);
    for (int c : consumers_[v]) {
      const GNode& n = w_.nodes[c];
      const bool in_a_loop = is_elementwise(n.op) || (!random && is_random(n.op));  // a draw's p
      if (!in_a_loop || (random && n.type.shape != w_.nodes[v].type.shape)) return true;
    }
    return false;
  }

  // Whether f(c) holds for some node c that reads value v where it is stored: its consumers,
  // with a random value that loops compute again (a draw from seed v) standing for the
  // consumers that compute it.
  template <typename F>
  bool any_reader(int v, const F& f) const {
    for (int c : consumers_[v]) {
      if (recomputed(c) ? any_reader(c, f) : f(c)) return true;
    }
    return false;
  }

  // Whether value q can be read by group g: computed by g or an earlier group, a leaf, or
  // recomputed from operands that are.
  bool readable_in(int q, int g) const {
    if (w_.nodes[q].op == Op::kData || (w_.nodes[q].op == Op::kConst && group_of_[q] < 0)) return true;
    if (recomputed(q)) {
      for (int r : w_.nodes[q].operands)
        if (!readable_in(r, g)) return false;
      return true;
    }
    return group_of_[q] < g || (group_of_[q] == g && q != groups_[g].reduce);
  }

  // The loop group reduction v can join (-1: none): the group computing its float operand,
  // over any axes, when the group has no reduction yet.
  int reduce_target(int v) const {
    const GNode& n = w_.nodes[v];
    if (n.op != Op::kSum && n.op != Op::kMean && n.op != Op::kMax && n.op != Op::kMin && n.op != Op::kArgmax) {
      return -1;
    }
    const int p = n.operands[0];
    const ValueType& t = w_.nodes[p].type;
    if (is_leaf(p) || !is_float(t.dtype) || numel(t.shape) == 0 || n.attrs.ints.empty()) return -1;
    // Over axes that are not one run a sum keeps sixteen double lanes per kept value: only
    // where that is no more than the operand itself in doubles (16 or more values each), and
    // not in rows of fewer than 16 reduced values (a [N, C, 2, 2] bias gradient ran 0.6x the
    // kernel's pass, each element a scalar update after its row's index arithmetic).
    const detail::LoopReduce form = detail::loop_reduce_form(t.shape, n.attrs.ints);
    if (!form.axes.empty() && (n.op == Op::kSum || n.op == Op::kMean)) {
      const detail::ReduceRow row = detail::general_reduce_row(t.shape, n.attrs.ints);
      if (form.reduced < detail::kSumLanes || (row.reduced && row.elements < detail::kSumLanes)) return -1;
    }
    const int g = group_of_[p];
    if (g < 0 || groups_[g].reduce >= 0) return -1;
    // A loop, or a GEMM's epilogue computing p (not the GEMM's own value, which its loop
    // only loads when a step reads it).
    const bool loop = groups_[g].kind == Kernel::Kind::kLoop;
    const bool epilogue = groups_[g].kind == Kernel::Kind::kMatmul && p != groups_[g].node;
    return loop || epilogue ? g : -1;
  }

  bool can_join(int v, int g) const {
    const Group& gr = groups_[g];
    if (gr.kind == Kernel::Kind::kOp || gr.shape != w_.nodes[v].type.shape || gr.members.size() >= kMaxLoopMembers) {
      return false;
    }
    if (gr.kind == Kernel::Kind::kMatmul &&
        (!gr.epilogue_ok || w_.nodes[v].type.dtype != w_.nodes[gr.node].type.dtype)) return false;
    for (int q : w_.nodes[v].operands)
      if (!readable_in(q, g)) return false;
    return true;
  }

  // Moves the earlier loop holding operand `p` into group `g` when nothing scheduled between
  // them reads it: `m = v * 0.9` traced before `g = x^T dy` then joins the GEMM's epilogue
  // (`m + g`) instead of costing its own pass over a parameter-sized array.
  void absorb(int p, int g) {
    const int h = is_leaf(p) ? -1 : group_of_[p];
    if (h < 0 || h >= g || groups_[h].kind != Kernel::Kind::kLoop || groups_[h].shape != groups_[g].shape ||
        groups_[h].reduce >= 0 || groups_[h].members.size() + groups_[g].members.size() > kMaxLoopMembers) return;
    const Group& gr = groups_[g];
    // A reader in a group between them, or the GEMM itself (it must exist before the GEMM).
    auto blocks = [&](int c) {
      const int k = group_of_[c];
      return (k >= 0 && k != h && k != g && k < g) || c == gr.node;
    };
    for (int m : groups_[h].members) {
      if (gr.kind == Kernel::Kind::kMatmul &&
          (!gr.epilogue_ok || w_.nodes[m].type.dtype != w_.nodes[gr.node].type.dtype)) return;
      if (any_reader(m, blocks)) return;
    }
    for (int m : groups_[h].members) group_of_[m] = g;
    std::vector<int>& into = groups_[g].members;
    into.insert(into.end(), groups_[h].members.begin(), groups_[h].members.end());  // sorted after fuse()
    groups_[h].members.clear();
    groups_[h].kind = Kernel::Kind::kLoop;
    groups_[h].absorbed = true;
  }

  int new_group(Group g) {
    groups_.push_back(std::move(g));
    return static_cast<int>(groups_.size()) - 1;
  }

  void fuse() {
    for (size_t i = 0; i < w_.nodes.size(); ++i) {
      const int v = static_cast<int>(i);
      const GNode& n = w_.nodes[v];
      if (n.op == Op::kData) continue;
      if (n.op == Op::kConst) {
        if (needs_fill(v)) group_of_[v] = new_group({Kernel::Kind::kOp, v, {}, {}, false});
        continue;
      }
      if (is_random(n.op)) {
        if (needs_fill(v)) group_of_[v] = new_group({Kernel::Kind::kLoop, -1, {v}, n.type.shape, false});
        continue;
      }
      if (is_elementwise(n.op)) {
        int joined = -1;
        for (int p : n.operands) {
          const int g = is_leaf(p) ? -1 : group_of_[p];
          if (g >= 0 && can_join(v, g)) { joined = g; break; }
        }
        if (joined < 0) joined = new_group({Kernel::Kind::kLoop, -1, {}, n.type.shape, false});
        groups_[joined].members.push_back(v);
        group_of_[v] = joined;
        for (int p : n.operands) absorb(p, joined);
      } else if (const int g = reduce_target(v); g >= 0) {
        groups_[g].reduce = v;
        group_of_[v] = g;
      } else if (n.op == Op::kMatmul) {
        const bool ok = !is_root_[v] && consumers_[v].size() == 1 && is_elementwise(w_.nodes[consumers_[v][0]].op);
        group_of_[v] = new_group({Kernel::Kind::kMatmul, v, {}, n.type.shape, ok});
      } else {
        group_of_[v] = new_group({Kernel::Kind::kOp, v, {}, {}, false});
      }
    }
  }

  // Values a group reads (deduplicated, constants excluded unless filled) and defines.
  std::vector<int> uses(int g) const {
    const Group& gr = groups_[g];
    std::vector<int> u;
    std::function<void(int)> add = [&](int q) {
      if (w_.nodes[q].op == Op::kConst && group_of_[q] < 0) return;
      if (recomputed(q)) {
        for (int r : w_.nodes[q].operands) add(r);
        return;
      }
      if (group_of_[q] == g) return;
      if (std::find(u.begin(), u.end(), q) == u.end()) u.push_back(q);
    };
    if (gr.node >= 0 && w_.nodes[gr.node].op != Op::kConst) for (int q : w_.nodes[gr.node].operands) add(q);
    for (int m : gr.members) for (int q : w_.nodes[m].operands) if (q != gr.node) add(q);
    return u;
  }

  bool stored(int v, int g) const {
    // An epilogue's last value is where its GEMM writes, even if only the group's reduction
    // reads it.
    if (is_root_[v] || (groups_[g].kind == Kernel::Kind::kMatmul && v == groups_[g].members.back())) return true;
    for (int c : consumers_[v]) if (group_of_[c] != g) return true;
    return false;
  }

  std::vector<int> defs(int g) const {
    const Group& gr = groups_[g];
    std::vector<int> d;
    for (int m : gr.members) if (stored(m, g)) d.push_back(m);
    if (gr.reduce >= 0) d.push_back(gr.reduce);
    if (gr.kind == Kernel::Kind::kMatmul && gr.members.empty()) d.push_back(gr.node);
    if (gr.kind == Kernel::Kind::kOp) d.push_back(gr.node);
    return d;
  }

  int add_storage(Storage::Kind kind, int index, size_t bytes) {
    p_.storages.push_back({kind, index, bytes});
    return static_cast<int>(p_.storages.size()) - 1;
  }

  bool in_place_ok(int g, int u, int d) const {
    if (g < 0) return false;
    const Group& gr = groups_[g];
    // A GEMM reads its operands while writing: never in place, except an accumulating GEMM
    // over its own accumulator (C = A B + beta C is what gemm does in place).
    if (gr.kind == Kernel::Kind::kMatmul) {
      const std::vector<int>& ops = w_.nodes[gr.node].operands;
      return gr.members.empty() && ops.size() == 4 && ops[2] == u && ops[0] != u && ops[1] != u;
    }
    if (bytes_of(w_.nodes[u].type) != bytes_of(w_.nodes[d].type) || d == gr.reduce) return false;
    if (gr.kind == Kernel::Kind::kLoop) return w_.nodes[u].type.shape == gr.shape;
    return gr.kind == Kernel::Kind::kOp &&
           (w_.nodes[gr.node].op == Op::kReshape || w_.nodes[gr.node].op == Op::kAllReduce);
  }

  int take_storage(int g, int d, std::vector<int>& dying) {
    const size_t bytes = bytes_of(w_.nodes[d].type);
    for (int& u : dying) {
      if (u < 0 || !in_place_ok(g, u, d)) continue;
      const Storage& s = p_.storages[storage_of_[u]];
      const bool donated_input = s.kind == Storage::Kind::kInput && donated_[s.index];
      if (is_root_[d] ? donated_input : s.kind == Storage::Kind::kArena) {
        const int sid = storage_of_[u];
        u = -1;
        ++p_.stats.in_place;
        return sid;
      }
    }
    if (is_root_[d]) {
      auto it = std::find_if(donated_pool_.begin(), donated_pool_.end(),
                             [&](int s) { return p_.storages[s].size_bytes == bytes; });
      if (it != donated_pool_.end()) {
        const int sid = *it;
        donated_pool_.erase(it);
        return sid;
      }
      p_.output_bytes.push_back(bytes);
      return add_storage(Storage::Kind::kOutput, static_cast<int>(p_.output_bytes.size()) - 1, bytes);
    }
    // A new arena value: pack_arena() gives it a slot once every lifetime is known.
    return add_storage(Storage::Kind::kArena, -1, bytes);
  }

  // Replaces the arena values (storages of kind kArena, one per value and its in-place
  // successors, live over groups [first[s], last[s]]) by slots: largest first, each into the
  // smallest slot none of whose values it overlaps, else a new slot.
  void pack_arena(const std::vector<int>& first, const std::vector<int>& last) {
    std::vector<int> order;
    std::vector<int64_t> live_change(groups_.size() + 1, 0);
    for (size_t s = 0; s < p_.storages.size(); ++s) {
      if (p_.storages[s].kind != Storage::Kind::kArena) continue;
      order.push_back(static_cast<int>(s));
      live_change[first[s]] += static_cast<int64_t>(p_.storages[s].size_bytes);
      live_change[last[s] + 1] -= static_cast<int64_t>(p_.storages[s].size_bytes);
    }
    for (int64_t live = 0; int64_t change : live_change)
      p_.stats.peak_live_bytes = std::max(p_.stats.peak_live_bytes, live += change);
    std::vector<ArenaLifetime> values;
    for (int s : order) values.push_back({p_.storages[s].size_bytes, first[s], last[s]});
    const ArenaPacking packed = pack_arena_slots(values);
    std::vector<int> slot_of(p_.storages.size(), -1);
    for (size_t v = 0; v < order.size(); ++v) slot_of[order[v]] = packed.slot_of[v];
    // Renumber: the other storages keep their order, each slot becomes one storage.
    std::vector<Storage> kept;
    std::vector<int> renamed(p_.storages.size(), -1), slot_storage(packed.slot_bytes.size(), -1);
    for (size_t s = 0; s < p_.storages.size(); ++s) {
      if (slot_of[s] < 0) {
        renamed[s] = static_cast<int>(kept.size());
        kept.push_back(p_.storages[s]);
        continue;
      }
      int& to = slot_storage[slot_of[s]];
      if (to < 0) {
        to = static_cast<int>(kept.size());
        p_.arena_slot_bytes.push_back(packed.slot_bytes[slot_of[s]]);
        kept.push_back({Storage::Kind::kArena, static_cast<int>(p_.arena_slot_bytes.size()) - 1,
                        packed.slot_bytes[slot_of[s]]});
      }
      renamed[s] = to;
    }
    p_.storages = std::move(kept);
    for (int& s : storage_of_)
      if (s >= 0) s = renamed[s];
    for (int& s : donated_pool_) s = renamed[s];
  }

  void plan() {
    storage_of_.assign(w_.nodes.size(), -1);
    for (size_t i = 0; i < w_.nodes.size(); ++i) {
      const GNode& n = w_.nodes[i];
      if (n.op != Op::kData) continue;
      storage_of_[i] = add_storage(Storage::Kind::kInput, n.input, bytes_of(n.type));
    }
    std::vector<int> last_use(w_.nodes.size(), -1);
    for (size_t g = 0; g < groups_.size(); ++g)
      for (int u : uses(static_cast<int>(g))) last_use[u] = static_cast<int>(g);
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      const int g = static_cast<int>(gi);
      std::vector<int> dying;
      for (int u : uses(g)) if (last_use[u] == g && !is_root_[u]) dying.push_back(u);
      for (int d : defs(g)) storage_of_[d] = take_storage(g, d, dying);
      for (int u : dying) {
        if (u < 0) continue;
        const Storage& s = p_.storages[storage_of_[u]];
        if (s.kind == Storage::Kind::kInput && donated_[s.index]) donated_pool_.push_back(storage_of_[u]);
      }
    }
    // Per storage, the groups it is live over: from its first value's group to its last
    // value's last use.
    std::vector<int> first(p_.storages.size(), -1), last(p_.storages.size(), -1);
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      const int g = static_cast<int>(gi);
      for (int d : defs(g)) {
        const int s = storage_of_[d];
        if (first[s] < 0) first[s] = g;
        last[s] = std::max({last[s], g, last_use[d]});
      }
    }
    pack_arena(first, last);
    for (size_t b : p_.arena_slot_bytes) p_.stats.arena_bytes += static_cast<int64_t>(b);
    for (int r : w_.roots) {
      const Storage& s = p_.storages[storage_of_[r]];
      if (s.kind == Storage::Kind::kInput && w_.nodes[r].op != Op::kData) ++p_.stats.donated_outputs;
      p_.root_storage.push_back(storage_of_[r]);
    }
  }

  detail::LoopKernel make_loop(int g) const;
  void emit();

  Work& w_;
  Program& p_;
  std::vector<Group> groups_;
  std::vector<int> group_of_;
  std::vector<uint8_t> is_root_;
  std::vector<std::vector<int>> consumers_;
  std::vector<int> storage_of_;
  std::vector<int> donated_pool_;

 public:
  std::vector<uint8_t> donated_;
};

detail::LoopKernel Lowering::make_loop(int g) const {
  const Group& gr = groups_[g];
  detail::LoopKernel loop;
  loop.shape = gr.shape;
  std::map<int, int> reg_of;
  auto reg_for = [&](int v) {
    auto it = reg_of.find(v);
    if (it != reg_of.end()) return it->second;
    const int r = static_cast<int>(loop.reg_dtype.size());
    loop.reg_dtype.push_back(w_.nodes[v].type.dtype);
    reg_of.emplace(v, r);
    return r;
  };
  int index_reg = -1;
  std::function<void(int)> step_for;
  // Member m's operands in registers: loaded, or (a recomputed random value) computed here.
  std::function<void(int)> operands_of = [&](int m) {
    for (int q : w_.nodes[m].operands) {
      if (reg_of.count(q) || (group_of_[q] == g && q != gr.node)) continue;
      if (recomputed(q)) {
        step_for(q);
        continue;
      }
      const GNode& n = w_.nodes[q];
      const bool constant = n.op == Op::kConst && group_of_[q] < 0;
      // The matmul's own value is read from where the GEMM wrote it: the primary output.
      const int storage = constant ? -1 : q == gr.node ? storage_of_[gr.members.back()] : storage_of_[q];
      loop.loads.push_back({reg_for(q), storage, n.type.dtype, n.type.shape, constant ? n.attrs.scalar : 0});
    }
  };
  // The step computing value m (a member, or a random value recomputed in this loop).
  step_for = [&](int m) {
    operands_of(m);
    const GNode& n = w_.nodes[m];
    detail::LoopStep step{n.op, nullptr, 0, {-1, -1, -1}};
    if (is_random(n.op)) {
      if (index_reg < 0) {
        index_reg = static_cast<int>(loop.reg_dtype.size());
        loop.reg_dtype.push_back(DType::kI64);
        loop.loads.push_back({index_reg, -1, DType::kI64, loop.shape, 0, true});
      }
      step.in[0] = reg_of.at(n.operands[0]);
      step.in[1] = index_reg;
      if (n.operands.size() > 1) step.in[2] = reg_of.at(n.operands[1]);
      step.fn = detail::random_block_fn(n.op, n.type.dtype);
    } else {
      for (size_t k = 0; k < n.operands.size(); ++k) step.in[k] = reg_of.at(n.operands[k]);
      const DType in_dtype = w_.nodes[n.operands[n.op == Op::kWhere ? 1 : 0]].type.dtype;
      step.fn = detail::elementwise_block_fn(n.op, in_dtype, n.type.dtype);
    }
    step.out = reg_for(m);
    loop.steps.push_back(step);
  };
  for (int m : gr.members) step_for(m);
  for (int d : defs(g)) {
    if (d != gr.reduce) loop.stores.push_back({reg_of.at(d), storage_of_[d], w_.nodes[d].type.dtype});
  }
  if (gr.reduce >= 0) {
    const GNode& n = w_.nodes[gr.reduce];
    loop.reduce = detail::loop_reduce_form(loop.shape, n.attrs.ints);
    loop.reduce->op = n.op;
    loop.reduce->reg = reg_of.at(n.operands[0]);
    loop.reduce->storage = storage_of_[gr.reduce];
    loop.reduce->dtype = n.type.dtype;
  }
  return loop;
}

void Lowering::emit() {
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const int g = static_cast<int>(gi);
    const Group& gr = groups_[g];
    if (gr.absorbed) continue;
    Kernel k;
    k.kind = gr.kind;
    if (gr.kind != Kernel::Kind::kLoop) {
      const GNode& n = w_.nodes[gr.node];
      k.op = n.op;
      k.attrs = n.attrs;
      for (int q : n.operands) k.in_storage.push_back(storage_of_[q]), k.in_types.push_back(w_.nodes[q].type);
      k.out_type = n.type;
      k.out_storage = gr.members.empty() ? storage_of_[gr.node] : storage_of_[gr.members.back()];
      k.prepared = prepare_op_kernel(k.op, k.attrs, k.in_types, k.out_type);
    }
    if (!gr.members.empty()) k.loop = make_loop(g);
    if (gr.kind == Kernel::Kind::kMatmul && !gr.members.empty()) ++p_.stats.matmul_epilogues;
    if (gr.reduce >= 0) ++p_.stats.fused_reductions;
    if (gr.kind == Kernel::Kind::kLoop && gr.members.size() > 1) {
      ++p_.stats.fused_loops;
      p_.stats.fused_ops += static_cast<int64_t>(gr.members.size());
    }
    p_.kernels.push_back(std::move(k));
  }
  p_.stats.kernels = static_cast<int64_t>(p_.kernels.size());
}

}  // namespace

void lower_graph(Work& work, const std::vector<uint8_t>& donated, Program& program) {
  Lowering lowering(work, program);
  lowering.donated_ = donated;
  lowering.run();
}

// Slots are made in decreasing size, so equal ones are runs of indices (classes). The best
// slot is found without trying every slot for every value (a 256-layer GPT has 17,000 values
// in 4,700 slots): while the values of one size are placed, the class of that size holds only
// them, taken in order of first group, so one of its slots is free exactly when its last value
// ended before this one starts; a heap of those ends moves freed slots into a set ordered by
// index. Larger classes, smallest first, are tried slot by slot only when that class has no
// free slot.
ArenaPacking pack_arena_slots(const std::vector<ArenaLifetime>& values) {
  std::vector<int> order(values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return values[a].bytes != values[b].bytes ? values[a].bytes > values[b].bytes : values[a].first < values[b].first;
  });
  ArenaPacking out{std::vector<int>(values.size(), -1), {}};
  std::vector<std::map<int, int>> live;  // by slot: its values' [first, last], disjoint, by first
  // Whether value x's lifetime meets one in slot k: only the last one starting at or before x's
  // end can (they are disjoint, so it ends latest of those).
  const auto meets = [&](int k, const ArenaLifetime& x) {
    const auto after = live[k].upper_bound(x.last);
    return after != live[k].begin() && std::prev(after)->second >= x.first;
  };
  struct Class {
    size_t bytes;
    int begin, end;  // its slots
  };
  std::vector<Class> classes;
  std::priority_queue<std::pair<int, int>, std::vector<std::pair<int, int>>, std::greater<>> busy;  // (end, slot)
  std::set<int> idle;  // the size's own class: slots whose values have all ended
  for (int i : order) {
    const ArenaLifetime& x = values[i];
    const bool own = !classes.empty() && classes.back().bytes == x.bytes;
    if (!own) busy = {}, idle.clear();
    while (!busy.empty() && busy.top().first < x.first) idle.insert(busy.top().second), busy.pop();
    int k = -1;
    bool in_own_class = !idle.empty();
    if (in_own_class) {
      k = *idle.begin();
      idle.erase(idle.begin());
    }
    for (int c = static_cast<int>(classes.size()) - (own ? 2 : 1); k < 0 && c >= 0; --c) {
      for (int j = classes[c].begin; j < classes[c].end && k < 0; ++j)
        if (!meets(j, x)) k = j;
    }
    if (k < 0) {
      k = static_cast<int>(out.slot_bytes.size());
      out.slot_bytes.push_back(x.bytes);
      live.emplace_back();
      if (own) ++classes.back().end;
      else classes.push_back({x.bytes, k, k + 1});
      in_own_class = true;
    }
    live[k].emplace(x.first, x.last);
    if (in_own_class) busy.emplace(x.last, k);
    out.slot_of[i] = k;
  }
  return out;
}

}  // namespace xs::detail
