#include "runtime/program.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/check.h"
#include "base/error.h"

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
    }
  }
  std::vector<detail::Arg> args;
  for (const Kernel& k : kernels) {
    if (k.kind != Kernel::Kind::kLoop) {
      args.clear();
      for (size_t i = 0; i < k.in_storage.size(); ++i) args.push_back({ptr[k.in_storage[i]], &k.in_types[i]});
      detail::run_op_kernel(k.op, k.attrs, args, {ptr[k.out_storage], &k.out_type}, env);
    }
    if (!k.loop.steps.empty()) detail::run_loop(k.loop, ptr.data());
  }
  std::vector<BufferPtr> results;
  for (int s : root_storage) {
    const Storage& st = storages[s];
    XS_CHECK(st.kind != Storage::Kind::kArena, "root planned into arena slot {}", st.index);
    results.push_back(st.kind == Storage::Kind::kInput ? inputs[st.index] : outputs[st.index]);
  }
  return results;
}

std::string Program::text() const {
  std::string out = fmt::format(
      "program: {} kernels, nodes {} -> {} (folded {}, cse {}, dce {}), fused loops {} ({} ops), "
      "matmul epilogues {}, gemm accumulates {}, in place {}, donated outputs {}, arena {} bytes\n",
      stats.kernels, stats.nodes_in, stats.nodes_out, stats.folded, stats.cse_merged, stats.dce_removed,
      stats.fused_loops, stats.fused_ops, stats.matmul_epilogues, stats.gemm_accumulates, stats.in_place, stats.donated_outputs,
      stats.arena_bytes);
  for (size_t s = 0; s < storages.size(); ++s) {
    const Storage& st = storages[s];
    const char* kind = st.kind == Storage::Kind::kInput ? "input" : st.kind == Storage::Kind::kArena ? "arena" : "output";
    out += fmt::format("  s{} = {}#{} ({} bytes)\n", s, kind, st.index, st.size_bytes);
  }
  for (size_t i = 0; i < kernels.size(); ++i) {
    const Kernel& k = kernels[i];
    if (k.kind != Kernel::Kind::kLoop) {
      out += fmt::format("  k{}: s{} = {}(s{}) : {}", i, k.out_storage, op_name(k.op), fmt::join(k.in_storage, ", s"),
                         type_str(k.out_type));
      if (!k.loop.steps.empty()) out += " + epilogue ";
    } else {
      out += fmt::format("  k{}: ", i);
    }
    out += (k.loop.steps.empty() ? "" : detail::loop_text(k.loop)) + "\n";
  }
  out += fmt::format("  roots: s{}\n", fmt::join(root_storage, ", s"));
  return out;
}

}  // namespace xs
