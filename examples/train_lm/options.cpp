#include "examples/train_lm/options.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <boost/program_options.hpp>

#include "xla_spawn/base/env.h"
#include "xla_spawn/base/error.h"
#include "examples/cli.h"
#include "xla_spawn/replica/context.h"

namespace xs::lm {
namespace po = boost::program_options;
using examples::require;
namespace {

constexpr double kMaxVocab = 256;  // byte-level at most

std::vector<int64_t> parse_buckets(const std::string& text, int64_t context) {
  if (text == "none") return {};
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int64_t v = -1;
    try {
      v = parse_int(item, 1, INT64_MAX, "buckets");  // digits only, as every number here
    } catch (const InvalidArgument&) {
      v = -1;
    }
    require(v >= 1 && (out.empty() || v > out.back()), "buckets",
            "ascending lengths like 32,64,128, or none", "'" + text + "'");
    out.push_back(v);
  }
  require(!out.empty() && out.back() == context, "buckets", fmt::format("a list ending at --context {}", context),
          "'" + text + "'");
  return out;
}

}  // namespace

LmOptions parse_lm_options(int argc, const char* const* argv) {
  LmOptions o;
  std::string buckets = "32,64,128";
  po::options_description d("train_lm: trains a character-level GPT on text, alone or under xla-spawn\nOptions");
  d.add_options()("help,h", "this text")(
      "corpus", po::value(&o.corpus)->default_value(o.corpus), "kjv (Debian's bible-kjv) or a text file, a document a line")(
      "batching", po::value(&o.batching)->default_value(o.batching),
      "pack (fixed windows over the text) or docs (a document a row, padded to a bucket)")(
      "buckets", po::value(&buckets)->default_value(buckets), "docs: row lengths, ending at --context; none: pad each batch to its longest")(
      "context", po::value(&o.context)->default_value(o.context), "tokens per row (and position table size)")(
      "layers", po::value(&o.layers)->default_value(o.layers), "transformer blocks")(
      "d-model", po::value(&o.d_model)->default_value(o.d_model), "width")(
      "heads", po::value(&o.heads)->default_value(o.heads), "attention heads")(
      "dropout", po::value(&o.dropout)->default_value(o.dropout), "dropout after attention and MLP")(
      "batch-size", po::value(&o.batch_size)->default_value(o.batch_size), "sequences per replica")(
      "steps", po::value(&o.steps)->default_value(o.steps), "optimizer steps (the schedule's length)")(
      "max-steps", po::value(&o.max_steps)->default_value(0), "stop at this step, saving a checkpoint (0: at --steps)")(
      "lr", po::value(&o.lr)->default_value(o.lr), "peak learning rate (AdamW)")(
      "min-lr-factor", po::value(&o.min_lr_factor)->default_value(o.min_lr_factor), "cosine floor, times --lr")(
      "warmup", po::value(&o.warmup)->default_value(o.warmup), "linear warm-up steps")(
      "weight-decay", po::value(&o.weight_decay)->default_value(o.weight_decay), "AdamW decay of matrices")(
      "beta2", po::value(&o.beta2)->default_value(o.beta2), "AdamW beta2")(
      "clip", po::value(&o.clip)->default_value(o.clip), "clip gradients to this global norm (0: off)")(
      "seed", po::value(&o.seed)->default_value(o.seed), "initialisation and data order")(
      "checkpoint", po::value(&o.checkpoint), "checkpoint file (and <file>.vocab)")(
      "checkpoint-every", po::value(&o.checkpoint_every)->default_value(0), "also save every K steps")(
      "resume", po::bool_switch(&o.resume), "resume from --checkpoint if it exists")(
      "eval-every", po::value(&o.eval_every)->default_value(0), "validate every K steps (0: each epoch and at the end)")(
      "eval-batches", po::value(&o.eval_batches)->default_value(0), "validation batches per replica (0: all)")(
      "sample-chars", po::value(&o.sample_chars)->default_value(o.sample_chars), "characters sampled at the end")(
      "temperature", po::value(&o.temperature)->default_value(o.temperature), "sampling temperature")(
      "metrics", po::bool_switch(&o.metrics), "print the runtime's metrics report at the end")(
      "step-timing-csv", po::value(&o.step_timing_csv), "write per-step, per-ordinal timings");
  po::variables_map vm;
  if (std::optional<std::string> usage = examples::parse_command_line(argc, argv, d, vm)) {
    o.help = true;
    o.usage = *usage;
    return o;
  }
  require(o.batching == "pack" || o.batching == "docs", "batching", "pack or docs", "'" + o.batching + "'");
  require(o.context >= 2 && o.context <= 8192, "context", "2..8192", std::to_string(o.context));
  require(o.batching == "docs" || vm["buckets"].defaulted(), "buckets", "--batching docs with it",
          "--batching " + o.batching);
  o.buckets = o.batching == "docs" ? parse_buckets(buckets, o.context) : std::vector<int64_t>{};
  for (auto [flag, v] : {std::pair{"layers", o.layers}, {"d-model", o.d_model}, {"heads", o.heads},
                         {"batch-size", o.batch_size}, {"steps", o.steps}}) {
    require(v >= 1 && v <= 1'000'000, flag, "1..1000000", std::to_string(v));
  }
  require(o.d_model % o.heads == 0, "heads", fmt::format("a divisor of --d-model {}", o.d_model),
          std::to_string(o.heads));
  // Training keeps four f32 copies of every parameter (weights, gradients, Adam's two moments)
  // in every replica of this machine: a model whose copies alone exceed its memory is refused
  // here, not by bad_alloc or the OOM killer. (Activations come on top: a model near the
  // limit may still not fit.)
  const double width = static_cast<double>(o.d_model);
  const double parameters = (2.0 * kMaxVocab + static_cast<double>(o.context)) * width +
                            static_cast<double>(o.layers) * (12 * width * width + 13 * width) +
                            2 * width;
  const ReplicaContext place = ReplicaContext::from_env();
  const double bytes = 16 * parameters * place.local_world_size;
  const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                        static_cast<double>(::sysconf(_SC_PAGESIZE));
  require(memory <= 0 || bytes < memory, "d-model",
          fmt::format("a model whose weights, gradients and Adam state fit in this machine's "
                      "{:.1f} GiB (with --layers {}: about {:.3g} parameters, {:.3g} GiB for {} "
                      "replica(s) here)",
                      memory / (1 << 30), o.layers, parameters, bytes / (1 << 30),
                      place.local_world_size),
          std::to_string(o.d_model));
  require(o.dropout >= 0 && o.dropout < 1, "dropout", "[0, 1)", fmt::format("{}", o.dropout));
  require(o.lr > 0 && o.lr < 10, "lr", "(0, 10)", fmt::format("{}", o.lr));
  require(o.min_lr_factor >= 0 && o.min_lr_factor <= 1, "min-lr-factor", "[0, 1]", fmt::format("{}", o.min_lr_factor));
  require(o.warmup >= 0 && o.warmup < o.steps, "warmup", "0..steps-1", std::to_string(o.warmup));
  require(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "weight-decay", "a finite value >= 0",
          fmt::format("{}", o.weight_decay));
  require(o.beta2 > 0 && o.beta2 < 1, "beta2", "(0, 1)", fmt::format("{}", o.beta2));
  require(std::isfinite(o.clip) && o.clip >= 0, "clip", "a finite value >= 0", fmt::format("{}", o.clip));
  require(std::isfinite(o.temperature) && o.temperature > 0, "temperature", "a finite value > 0",
          fmt::format("{}", o.temperature));
  for (auto [flag, v] : {std::pair{"checkpoint-every", o.checkpoint_every}, {"max-steps", o.max_steps}, {"eval-every", o.eval_every},
                         {"eval-batches", o.eval_batches}, {"sample-chars", o.sample_chars}}) {
    require(v >= 0, flag, "a count >= 0", std::to_string(v));
  }
  require(!vm.count("checkpoint") || !o.checkpoint.empty(), "checkpoint", "a path", "''");
  require(!o.resume || !o.checkpoint.empty(), "resume", "--checkpoint PATH with it", "none");
  return o;
}

}  // namespace xs::lm
