#include "xla_spawn/runtime/program.h"

#include <algorithm>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/runtime/collective_ops.h"

namespace xs {

std::vector<BufferPtr> Program::run(std::span<const BufferPtr> inputs, const detail::ExecEnv& env) {
  XS_CHECK_EQ(inputs.size(), input_types.size(), "program input count");
  for (size_t i = 0; i < inputs.size(); ++i) {
    const size_t need = numel(input_types[i].shape) * dtype_size(input_types[i].dtype);
    XS_CHECK(inputs[i]->size_bytes() >= need, "input {} has {} bytes, program expects {} ({})", i,
             inputs[i]->size_bytes(), need, type_str(input_types[i]));
  }
  if (arena_.size() != arena_slot_bytes.size()) {
    for (size_t b : arena_slot_bytes) arena_.push_back(Buffer::allocate(b));
  }
  std::vector<BufferPtr> outputs;
  outputs.reserve(output_bytes.size());
  for (size_t b : output_bytes) outputs.push_back(Buffer::allocate(b));
  std::vector<void*> ptr(storages.size());
  for (size_t s = 0; s < storages.size(); ++s) {
    const Storage& st = storages[s];
    switch (st.kind) {
      case Storage::Kind::kInput: ptr[s] = inputs[st.index]->data(); break;
      case Storage::Kind::kArena: ptr[s] = arena_[st.index]->data(); break;
      case Storage::Kind::kOutput: ptr[s] = outputs[st.index]->data(); break;
      case Storage::Kind::kView: break;  // below: its storage may come later in the list
    }
  }
  if (env.scratch != nullptr) {
    const std::vector<int>& slots = collective_slots();
    for (size_t k = 0; k < slots.size(); ++k) {
      const Storage& st = storages[slots[k]];
      ptr[slots[k]] = env.scratch->get(static_cast<int>(k), arena_slot_bytes[st.index]);
    }
  }
  for (size_t s = 0; s < storages.size(); ++s) {
    const Storage& st = storages[s];
    if (st.kind == Storage::Kind::kView) ptr[s] = static_cast<char*>(ptr[st.index]) + st.offset_bytes;
  }
  std::vector<detail::Arg> args;
  std::vector<GatherPiece> pieces;
  std::vector<double> reduce_scratch;  // for this run only: one large reduction keeps nothing
  std::vector<void*> local;            // a native loop's storages, in its own numbering
  for (size_t i = 0; i < kernels.size(); ++i) {
    const Kernel& k = kernels[i];
    if (!k.out_pieces.empty()) {
      pieces.clear();
      for (const Kernel::Piece& pc : k.out_pieces) pieces.push_back({pc.offset_bytes, pc.size_bytes, ptr[pc.storage]});
      detail::run_all_gather_pieces(k.attrs, {ptr[k.in_storage.at(0)], &k.in_types.at(0)}, pieces, env);
      continue;
    }
    if (k.kind != Kernel::Kind::kLoop) {
      args.clear();
      for (size_t i = 0; i < k.in_storage.size(); ++i) args.push_back({ptr[k.in_storage[i]], &k.in_types[i]});
      const detail::Arg out{ptr[k.out_storage], &k.out_type};
      if (k.prepared) k.prepared->run(args, out);
      else detail::run_op_kernel(k.op, k.attrs, args, out, env);
    }
    if (k.loop.steps.empty()) continue;
    if (detail::NativeLoopFn fn = native ? native->fn(i) : nullptr) {
      if (k.loop.reduce) {  // a reduction's accumulators
        const auto doubles = static_cast<size_t>(detail::reduce_scratch_doubles(*k.loop.reduce));
        if (reduce_scratch.size() < doubles) reduce_scratch.resize(doubles);
      }
      local.clear();
      for (int s : native->storages(i)) local.push_back(ptr[s]);
      fn(local.data(), reduce_scratch.data());
    }
    else detail::run_loop(k.loop, ptr.data());
  }
  std::vector<BufferPtr> results;
  for (int s : root_storage) {
    const Storage& st = storages[s];
    XS_CHECK(st.kind != Storage::Kind::kArena && st.kind != Storage::Kind::kView,
             "root planned into arena slot or view {}", st.index);
    results.push_back(st.kind == Storage::Kind::kInput ? inputs[st.index] : outputs[st.index]);
  }
  return results;
}

const std::vector<int>& Program::collective_slots() {
  if (!collective_slots_) {
    collective_slots_.emplace();
    for (const Kernel& k : kernels) {
      if (k.kind != Kernel::Kind::kOp) continue;
      // The operand a collective publishes to its peers: all_reduce's (in place: its output),
      // reduce_scatter's and all_gather's input.
      int s;
      if (k.op == Op::kAllReduce) s = k.out_storage;
      else if (k.op == Op::kReduceScatter || k.op == Op::kAllGather) s = k.in_storage.at(0);
      else continue;
      if (storages[s].kind == Storage::Kind::kView) s = storages[s].index;
      std::vector<int>& found = *collective_slots_;
      if (storages[s].kind == Storage::Kind::kArena && std::find(found.begin(), found.end(), s) == found.end()) {
        found.push_back(s);
      }
    }
  }
  return *collective_slots_;
}

std::string Program::text() const {
  std::string out = fmt::format(
      "program: {} kernels, nodes {} -> {} (folded {}, cse {}, dce {}), fused loops {} ({} ops), "
      "fused reductions {}, matmul epilogues {}, gemm accumulates {}, causal products {}, in place {}, donated outputs {}, views {}, arena {} bytes "
      "(peak live {}), native loops {} ({} functions), interpreted loops {}\n",
      stats.kernels, stats.nodes_in, stats.nodes_out, stats.folded, stats.cse_merged, stats.dce_removed,
      stats.fused_loops, stats.fused_ops, stats.fused_reductions, stats.matmul_epilogues, stats.gemm_accumulates, stats.causal_products, stats.in_place, stats.donated_outputs,
      stats.views, stats.arena_bytes, stats.peak_live_bytes, stats.native_loops, stats.native_functions, stats.interpreted_loops);
  for (size_t s = 0; s < storages.size(); ++s) {
    const Storage& st = storages[s];
    if (st.kind == Storage::Kind::kView) {
      out += fmt::format("  s{} = view of s{} at {} ({} bytes)\n", s, st.index, st.offset_bytes, st.size_bytes);
      continue;
    }
    const char* kind = st.kind == Storage::Kind::kInput ? "input" : st.kind == Storage::Kind::kArena ? "arena" : "output";
    out += fmt::format("  s{} = {}#{} ({} bytes)\n", s, kind, st.index, st.size_bytes);
  }
  for (size_t i = 0; i < kernels.size(); ++i) {
    const Kernel& k = kernels[i];
    if (!k.out_pieces.empty()) {
      out += fmt::format("  k{}: {}(s{}) : {} into", i, op_name(k.op), fmt::join(k.in_storage, ", s"), type_str(k.out_type));
      for (const Kernel::Piece& pc : k.out_pieces) out += fmt::format(" s{} <- [{}, {})", pc.storage, pc.offset_bytes, pc.offset_bytes + pc.size_bytes);
      out += "\n";
      continue;
    }
    if (k.kind != Kernel::Kind::kLoop) {
      out += fmt::format("  k{}: s{} = {}(s{}) : {}", i, k.out_storage, op_name(k.op), fmt::join(k.in_storage, ", s"),
                         type_str(k.out_type));
      if (k.prepared) out += fmt::format(" [{}]", k.prepared->text());
      if (!k.loop.steps.empty()) out += " + epilogue ";
    } else {
      out += fmt::format("  k{}: ", i);
    }
    if (!k.loop.steps.empty() && native && native->fn(i)) out += "native ";
    out += (k.loop.steps.empty() ? "" : detail::loop_text(k.loop)) + "\n";
  }
  out += fmt::format("  roots: s{}\n", fmt::join(root_storage, ", s"));
  return out;
}

}  // namespace xs
