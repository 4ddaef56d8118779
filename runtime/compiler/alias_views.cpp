#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/compiler/compile.h"

// alias_views: a pass over the planned kernels. In the plan an arena slot holds one value from
// the kernel that writes it (without reading it) until the next such kernel; in-place kernels
// (reshape, all_reduce, loops) continue the value. Removed kernels are skipped by the scans.
namespace xs {
namespace {

bool no_loop(const Kernel& k) {
  return k.loop.steps.empty() && k.loop.loads.empty() && k.loop.stores.empty() && !k.loop.reduce;
}

bool reads(const Kernel& k, int s) {
  if (k.kind != Kernel::Kind::kLoop && std::find(k.in_storage.begin(), k.in_storage.end(), s) != k.in_storage.end()) {
    return true;
  }
  return std::any_of(k.loop.loads.begin(), k.loop.loads.end(), [s](const auto& l) { return l.storage == s; });
}

bool writes(const Kernel& k, int s) {
  if (k.kind != Kernel::Kind::kLoop && k.out_storage == s) return true;
  if (std::any_of(k.out_pieces.begin(), k.out_pieces.end(), [s](const Kernel::Piece& p) { return p.storage == s; })) {
    return true;
  }
  if (k.loop.reduce && k.loop.reduce->storage == s) return true;
  return std::any_of(k.loop.stores.begin(), k.loop.stores.end(), [s](const auto& st) { return st.storage == s; });
}

// Whether k reads the value s holds before k runs: an op's epilogue loop that loads the op's
// own output reads the op's result, not the old value.
bool reads_old_value(const Kernel& k, int s) {
  if (k.kind == Kernel::Kind::kLoop) return reads(k, s);
  if (std::find(k.in_storage.begin(), k.in_storage.end(), s) != k.in_storage.end()) return true;
  return k.out_storage != s && reads(k, s);
}

// reshape(s) -> s moves no data.
bool in_place_reshape(const Kernel& k, int s) {
  return k.kind == Kernel::Kind::kOp && k.op == Op::kReshape && k.in_storage.size() == 1 && k.in_storage[0] == s &&
         k.out_storage == s && no_loop(k);
}

void replace_reads(Kernel& k, int from, int to) {
  if (k.kind != Kernel::Kind::kLoop) std::replace(k.in_storage.begin(), k.in_storage.end(), from, to);
  for (auto& l : k.loop.loads) if (l.storage == from) l.storage = to;
}

void replace_writes(Kernel& k, int from, int to) {
  if (k.kind != Kernel::Kind::kLoop && k.out_storage == from) k.out_storage = to;
  for (auto& st : k.loop.stores) if (st.storage == from) st.storage = to;
  if (k.loop.reduce && k.loop.reduce->storage == from) k.loop.reduce->storage = to;
}

size_t bytes_of(const ValueType& t) { return numel(t.shape) * dtype_size(t.dtype); }

class ViewPass {
 public:
  explicit ViewPass(Program& p) : p_(p), removed_(p.kernels.size(), false) {}

  void run() {
    for (size_t k = 0; k < p_.kernels.size(); ++k) removed_[k] = try_concat(k);
    for (size_t k = 0; k < p_.kernels.size(); ++k) removed_[k] = removed_[k] || try_slice(k);
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      if (!removed_[k]) try_gather_pieces(k);
    }
    std::vector<Kernel> kept;
    for (size_t k = 0; k < p_.kernels.size(); ++k) {
      if (!removed_[k]) kept.push_back(std::move(p_.kernels[k]));
    }
    p_.stats.views += static_cast<int64_t>(p_.kernels.size() - kept.size());
    p_.kernels = std::move(kept);
    p_.stats.kernels = static_cast<int64_t>(p_.kernels.size());
    shrink_arena();
  }

 private:
  bool live(size_t t) const { return !removed_[t]; }
  // Storage v is `base` or a view of it.
  bool aliases(size_t v, int base) const {
    const Storage& st = p_.storages[v];
    return static_cast<int>(v) == base || (st.kind == Storage::Kind::kView && st.index == base);
  }
  bool is_arena(int s) const { return p_.storages[s].kind == Storage::Kind::kArena; }

  int add_storage(Storage::Kind kind, int index, size_t bytes, size_t offset = 0) {
    p_.storages.push_back({kind, index, bytes, offset});
    return static_cast<int>(p_.storages.size()) - 1;
  }

  // The kernel before `at` that writes the value of `s` the kernel `at` reads, when nothing
  // between them touches `s` but reshapes in place (collected in `chain`) and the producer
  // does not read the previous value of `s` (a GEMM epilogue reads its own result). -1: none.
  int producer_of(size_t at, int s, std::vector<size_t>& chain) const {
    for (size_t t = at; t-- > 0;) {
      const Kernel& k = p_.kernels[t];
      if (!live(t) || (!reads(k, s) && !writes(k, s))) continue;
      if (in_place_reshape(k, s)) {
        chain.push_back(t);
        continue;
      }
      if (!writes(k, s)) return -1;
      return reads_old_value(k, s) ? -1 : static_cast<int>(t);
    }
    return -1;
  }

  // No kernel after `at` reads the value of `s` that `at` read.
  bool dead_after(size_t at, int s) const {
    for (size_t t = at + 1; t < p_.kernels.size(); ++t) {
      if (!live(t)) continue;
      if (reads(p_.kernels[t], s)) return false;
      if (writes(p_.kernels[t], s)) return true;
    }
    return true;
  }

  bool try_concat(size_t at);
  bool try_slice(size_t at);
  void try_gather_pieces(size_t at);
  std::optional<Kernel::Piece> copied_piece(const Kernel& k, int g) const;
  // Bytes [offset, offset + size) of its operand that slice kernel `sl` copies, when they are
  // contiguous (only the leading axis is cut, with step 1, or a single row).
  std::optional<std::pair<size_t, size_t>> contiguous_slice(const Kernel& sl) const;
  // Whether kernels [from, to) read or write storage `s` or a view of it.
  bool touched_between(size_t from, size_t to, int s) const;

  // An arena slot that held a concat's value now holds smaller ones only: resize every slot
  // to its largest remaining occupant (a view's buffer to the view's end).
  void shrink_arena() {
    std::vector<size_t> need(p_.storages.size(), 0);
    auto note = [&](int s, size_t bytes) {
      const Storage& st = p_.storages[s];
      if (st.kind == Storage::Kind::kView) s = st.index, bytes += st.offset_bytes;
      need[s] = std::max(need[s], bytes);
    };
    for (const Kernel& k : p_.kernels) {
      if (k.kind != Kernel::Kind::kLoop) {
        for (size_t i = 0; i < k.in_storage.size(); ++i) note(k.in_storage[i], bytes_of(k.in_types[i]));
        if (k.out_storage >= 0) note(k.out_storage, bytes_of(k.out_type));
      }
      for (const Kernel::Piece& pc : k.out_pieces) note(pc.storage, pc.size_bytes);
      for (const auto& l : k.loop.loads) {
        if (l.storage >= 0) note(l.storage, numel(l.shape) * dtype_size(l.dtype));
      }
      for (const auto& st : k.loop.stores) note(st.storage, numel(k.loop.shape) * dtype_size(st.dtype));
      if (const auto& r = k.loop.reduce) note(r->storage, r->outer * r->inner * dtype_size(r->dtype));
    }
    p_.stats.arena_bytes = 0;
    for (size_t s = 0; s < p_.storages.size(); ++s) {
      Storage& st = p_.storages[s];
      if (st.kind != Storage::Kind::kArena) continue;
      st.size_bytes = std::min(st.size_bytes, std::max<size_t>(need[s], 1));
      p_.arena_slot_bytes[st.index] = st.size_bytes;
      p_.stats.arena_bytes += static_cast<int64_t>(st.size_bytes);
    }
  }

  Program& p_;
  std::vector<bool> removed_;
};

bool ViewPass::try_concat(size_t at) {
  const Kernel& cat = p_.kernels[at];
  if (cat.kind != Kernel::Kind::kOp || cat.op != Op::kConcat || cat.attrs.ints.empty() || cat.attrs.ints[0] != 0 ||
      !no_loop(cat) || !is_arena(cat.out_storage)) {
    return false;
  }
  const int c = cat.out_storage;
  std::vector<int> producers;
  std::vector<std::vector<size_t>> chains(cat.in_storage.size());
  for (size_t j = 0; j < cat.in_storage.size(); ++j) {
    const int s = cat.in_storage[j];
    if (!is_arena(s) || s == c || std::count(cat.in_storage.begin(), cat.in_storage.end(), s) != 1) return false;
    const int t = producer_of(at, s, chains[j]);
    if (t < 0 || !dead_after(at, s)) return false;
    producers.push_back(t);
  }
  // The concat's value moves to a fresh slot: the old one may hold other values while the
  // operands are being produced.
  const size_t total = bytes_of(cat.out_type);
  p_.arena_slot_bytes.push_back(total);
  p_.stats.arena_bytes += static_cast<int64_t>(total);
  const int fresh = add_storage(Storage::Kind::kArena, static_cast<int>(p_.arena_slot_bytes.size()) - 1, total);
  for (size_t t = at + 1; t < p_.kernels.size(); ++t) {
    Kernel& k = p_.kernels[t];
    if (!live(t)) continue;
    const bool r = reads(k, c), w = writes(k, c);
    if (w && !r) break;  // a new value in the old slot
    replace_reads(k, c, fresh);
    replace_writes(k, c, fresh);
  }
  size_t offset = 0;
  for (size_t j = 0; j < cat.in_storage.size(); ++j) {
    const int s = cat.in_storage[j];
    const size_t bytes = bytes_of(cat.in_types[j]);
    const int view = add_storage(Storage::Kind::kView, fresh, bytes, offset);
    offset += bytes;
    chains[j].push_back(static_cast<size_t>(producers[j]));
    for (size_t t : chains[j]) {
      replace_reads(p_.kernels[t], s, view);  // a GEMM epilogue's own result, a reshape's input
      replace_writes(p_.kernels[t], s, view);
    }
  }
  return true;
}

bool ViewPass::try_slice(size_t at) {
  const Kernel& sl = p_.kernels[at];
  if (removed_[at] || sl.kind != Kernel::Kind::kOp || sl.op != Op::kSlice || !no_loop(sl)) return false;
  const int b = sl.in_storage[0], s = sl.out_storage;
  if (!is_arena(s) || b == s || sl.in_types[0].shape.empty()) return false;
  const auto bytes = contiguous_slice(sl);
  if (!bytes) return false;
  int base = b;
  size_t offset = bytes->first;
  if (p_.storages[b].kind == Storage::Kind::kView) {
    base = p_.storages[b].index;
    offset += p_.storages[b].offset_bytes;
  }
  std::vector<size_t> users;
  size_t last_read = at;
  for (size_t t = at + 1; t < p_.kernels.size(); ++t) {
    const Kernel& k = p_.kernels[t];
    if (!live(t)) continue;
    if (in_place_reshape(k, s)) {
      users.push_back(t);
      continue;
    }
    if (reads_old_value(k, s)) {
      users.push_back(t);
      last_read = t;
    }
    if (writes(k, s)) break;  // a new value in s from here
  }
  // The sliced bytes must stay as they are while the view is read.
  for (size_t t = at + 1; t <= last_read; ++t) {
    if (!live(t)) continue;
    for (size_t v = 0; v < p_.storages.size(); ++v) {
      if (aliases(v, base) && writes(p_.kernels[t], static_cast<int>(v)) && !in_place_reshape(p_.kernels[t], static_cast<int>(v))) {
        return false;
      }
    }
  }
  const int view = add_storage(Storage::Kind::kView, base, bytes_of(sl.out_type), offset);
  for (size_t t : users) {
    Kernel& k = p_.kernels[t];
    if (in_place_reshape(k, s)) replace_writes(k, s, view);
    replace_reads(k, s, view);
  }
  return true;
}

std::optional<std::pair<size_t, size_t>> ViewPass::contiguous_slice(const Kernel& sl) const {
  const Shape& in = sl.in_types[0].shape;
  const Shape& out = sl.out_type.shape;
  if (in.empty()) return std::nullopt;
  for (size_t d = 1; d < in.size(); ++d) {
    if (sl.attrs.ints[3 * d] != 0 || out[d] != in[d]) return std::nullopt;
  }
  if (out[0] > 1 && sl.attrs.ints[2] != 1) return std::nullopt;
  const size_t row_bytes = numel(Shape(in.begin() + 1, in.end())) * dtype_size(sl.in_types[0].dtype);
  return std::make_pair(static_cast<size_t>(sl.attrs.ints[0]) * row_bytes, bytes_of(sl.out_type));
}

bool ViewPass::touched_between(size_t from, size_t to, int s) const {
  for (size_t t = from; t < to; ++t) {
    if (!live(t)) continue;
    for (size_t v = 0; v < p_.storages.size(); ++v) {
      if (aliases(v, s) && (reads(p_.kernels[t], static_cast<int>(v)) || writes(p_.kernels[t], static_cast<int>(v)))) return true;
    }
  }
  return false;
}

// An all_gather's value g (an arena slot) that is only copied out, each piece into storage of
// its own outside the arena (a sharded update's gathered parameters, donated), by slices of g
// or by reshapes of views of g (try_slice made those): the all_gather writes the pieces there
// itself. That moves each piece's write earlier, to the all_gather, so nothing between the
// two may touch the piece's storage.
void ViewPass::try_gather_pieces(size_t at) {
  Kernel& ag = p_.kernels[at];
  if (ag.kind != Kernel::Kind::kOp || ag.op != Op::kAllGather || !no_loop(ag) || !ag.out_pieces.empty()) return;
  const int g = ag.out_storage;
  if (!is_arena(g)) return;
  std::vector<size_t> copies;
  std::vector<Kernel::Piece> pieces;
  for (size_t t = at + 1; t < p_.kernels.size(); ++t) {
    if (!live(t)) continue;
    const Kernel& k = p_.kernels[t];
    if (writes(k, g) && !reads(k, g)) break;  // a new value in g from here
    const std::optional<Kernel::Piece> piece = copied_piece(k, g);
    if (!piece) {
      if (touched_between(t, t + 1, g)) return;  // g read (or written) otherwise
      continue;
    }
    const int o = piece->storage;
    if (touched_between(at, t, o)) return;
    for (const Kernel::Piece& pc : pieces) {
      if (pc.storage == o) return;  // two values in one storage: the later copy must win
    }
    copies.push_back(t);
    pieces.push_back(*piece);
  }
  if (pieces.empty()) return;
  ag.out_pieces = std::move(pieces);
  ag.out_storage = -1;
  for (size_t t : copies) removed_[t] = true;
  p_.stats.gather_pieces += static_cast<int64_t>(copies.size());
}

// When kernel `k` copies contiguous bytes of g into a storage outside the arena (a slice of g
// or a reshape of a view of g): that storage and the bytes.
std::optional<Kernel::Piece> ViewPass::copied_piece(const Kernel& k, int g) const {
  if (k.kind != Kernel::Kind::kOp || !no_loop(k) || k.in_storage.size() != 1) return std::nullopt;
  const int o = k.out_storage;
  const Storage::Kind kind = p_.storages[o].kind;
  if (kind != Storage::Kind::kInput && kind != Storage::Kind::kOutput) return std::nullopt;
  const Storage& in = p_.storages[k.in_storage[0]];
  if (k.op == Op::kSlice && k.in_storage[0] == g) {
    const auto bytes = contiguous_slice(k);
    if (bytes) return Kernel::Piece{o, bytes->first, bytes->second};
  }
  if (k.op == Op::kReshape && in.kind == Storage::Kind::kView && in.index == g) {
    return Kernel::Piece{o, in.offset_bytes, bytes_of(k.out_type)};
  }
  return std::nullopt;
}

}  // namespace

void alias_views(Program& program) { ViewPass(program).run(); }

}  // namespace xs
