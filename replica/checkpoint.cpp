#include "xla_spawn/replica/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <unordered_set>

#include <unistd.h>

#include <fmt/format.h>
#include <zlib.h>

#include "xla_spawn/base/check.h"
#include "xla_spawn/base/error.h"
#include "xla_spawn/base/trace.h"
#include "xla_spawn/replica/detail/atomic_file.h"
#include "xla_spawn/replica/detail/checkpoint_format.h"
#include "xla_spawn/replica/detail/checkpoint_reader.h"
#include "xla_spawn/replica/detail/file_bytes.h"

namespace xs {
namespace {

namespace ck = detail::ckpt;

void put_u8(std::vector<uint8_t>& out, uint8_t v) {
  out.push_back(v);
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_bytes(std::vector<uint8_t>& out, std::string_view s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}
void set_u64(std::vector<uint8_t>& out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t align_up(uint64_t n) {
  return (n + ck::kDataAlignment - 1) / ck::kDataAlignment * ck::kDataAlignment;
}

// Rejects what a reader would reject, before anything is written.
void validate_for_save(std::span<const TensorRef> tensors, const CheckpointMetadata& metadata) {
  std::unordered_set<std::string_view> names;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorRef& t = tensors[i];
    XS_CHECK_ARG(!t.name.empty() && t.name.size() <= kMaxTensorNameBytes,
                 "save_checkpoint: tensor {} has a name of {} bytes, expected 1..{}", i,
                 t.name.size(), kMaxTensorNameBytes);
    XS_CHECK_ARG(names.insert(t.name).second, "save_checkpoint: tensor name '{}' appears twice",
                 t.name);
    XS_CHECK_ARG(t.shape.size() <= static_cast<size_t>(kMaxTensorRank),
                 "save_checkpoint: tensor '{}' has rank {}, at most {}", t.name, t.shape.size(),
                 kMaxTensorRank);
    const auto need = detail::tensor_bytes(t.shape, t.dtype);
    XS_CHECK_ARG(need.has_value() && *need == t.bytes.size(),
                 "save_checkpoint: tensor '{}' of shape [{}] {} needs {} bytes, given {}", t.name,
                 fmt::join(t.shape, ", "), dtype_name(t.dtype),
                 need ? fmt::format("{}", *need) : std::string("an invalid count of"),
                 t.bytes.size());
  }
  for (const auto& [key, value] : metadata) {
    XS_CHECK_ARG(!key.empty() && key.size() <= kMaxTensorNameBytes,
                 "save_checkpoint: metadata key of {} bytes, expected 1..{}", key.size(),
                 kMaxTensorNameBytes);
    if (const auto* s = std::get_if<std::string>(&value)) {
      XS_CHECK_ARG(s->size() <= kMaxMetaStringBytes,
                   "save_checkpoint: metadata '{}' is {} bytes, at most {}", key, s->size(),
                   kMaxMetaStringBytes);
    }
  }
}

// The fixed header and index, with each tensor's data offset and the total file size.
struct Layout {
  std::vector<uint8_t> header;
  std::vector<uint64_t> offsets;
  uint64_t file_size = 0;
};

Layout plan_layout(std::span<const TensorRef> tensors, const CheckpointMetadata& metadata) {
  validate_for_save(tensors, metadata);
  Layout layout;
  std::vector<uint8_t>& h = layout.header;
  h.reserve(4096);
  for (const uint8_t b : ck::kMagic) put_u8(h, b);  // (insert() trips a GCC 12 false warning)
  put_u32(h, ck::kVersion);
  put_u32(h, 0);  // flags
  put_u64(h, 0);  // file size: set below
  put_u64(h, 0);  // index end: set below
  put_u32(h, static_cast<uint32_t>(tensors.size()));
  put_u32(h, static_cast<uint32_t>(metadata.size()));
  std::vector<size_t> offset_slots;
  for (const TensorRef& t : tensors) {
    put_bytes(h, t.name);
    put_u8(h, static_cast<uint8_t>(t.dtype));
    put_u8(h, static_cast<uint8_t>(t.shape.size()));
    for (int64_t d : t.shape) put_u64(h, static_cast<uint64_t>(d));
    offset_slots.push_back(h.size());
    put_u64(h, 0);  // offset: set below
    put_u64(h, t.bytes.size());
  }
  for (const auto& [key, value] : metadata) {
    put_bytes(h, key);
    if (const auto* i = std::get_if<int64_t>(&value)) {
      put_u8(h, ck::kMetaInt);
      put_u64(h, static_cast<uint64_t>(*i));
    } else {
      put_u8(h, ck::kMetaString);
      put_bytes(h, std::get<std::string>(value));
    }
  }
  set_u64(h, 24, h.size());
  uint64_t at = h.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    at = align_up(at);
    layout.offsets.push_back(at);
    set_u64(h, offset_slots[i], at);
    at += tensors[i].bytes.size();
  }
  layout.file_size = at + ck::kChecksumBytes;
  set_u64(h, 16, layout.file_size);
  return layout;
}

// Emits the file image through `sink` in order, ending with the CRC-32 of all before it.
template <typename Sink>
void emit(std::span<const TensorRef> tensors, const Layout& layout, Sink&& sink) {
  uLong crc = crc32_z(0L, Z_NULL, 0);
  uint64_t at = 0;
  auto out = [&](std::span<const uint8_t> bytes) {
    // An empty tensor's data() may be null, and crc32_z(crc, NULL, 0) returns the initial
    // value, not crc: skip it.
    if (bytes.empty()) return;
    crc = crc32_z(crc, bytes.data(), bytes.size());
    at += bytes.size();
    sink(bytes);
  };
  static const std::array<uint8_t, ck::kDataAlignment> kZeros{};
  out(layout.header);
  for (size_t i = 0; i < tensors.size(); ++i) {
    out(std::span<const uint8_t>(kZeros.data(), layout.offsets[i] - at));
    out(tensors[i].bytes);
  }
  std::vector<uint8_t> trailer;
  put_u32(trailer, static_cast<uint32_t>(crc));
  sink(trailer);
}

}  // namespace

int64_t HostTensor::n_elems() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const HostTensor& Checkpoint::tensor(std::string_view name) const {
  for (const HostTensor& t : tensors) {
    if (t.name == name) return t;
  }
  std::vector<std::string_view> names;
  for (const HostTensor& t : tensors) names.push_back(t.name);
  throw InvalidArgument(fmt::format("checkpoint {}: no tensor '{}' (it has: {})", source, name,
                                    fmt::join(names, ", ")));
}

int64_t Checkpoint::meta_int(std::string_view key) const {
  const auto it = metadata.find(key);
  if (it == metadata.end() || !std::holds_alternative<int64_t>(it->second)) {
    throw InvalidArgument(fmt::format("checkpoint {}: metadata '{}' is {}, expected an integer",
                                      source, key, it == metadata.end() ? "missing" : "a string"));
  }
  return std::get<int64_t>(it->second);
}

const std::string& Checkpoint::meta_string(std::string_view key) const {
  const auto it = metadata.find(key);
  if (it == metadata.end() || !std::holds_alternative<std::string>(it->second)) {
    throw InvalidArgument(fmt::format("checkpoint {}: metadata '{}' is {}, expected a string",
                                      source, key,
                                      it == metadata.end() ? "missing" : "an integer"));
  }
  return std::get<std::string>(it->second);
}

std::vector<uint8_t> serialize_checkpoint(std::span<const TensorRef> tensors,
                                          const CheckpointMetadata& metadata) {
  TraceScope span("checkpoint write", "checkpoint");
  const Layout layout = plan_layout(tensors, metadata);
  std::vector<uint8_t> image;
  image.reserve(layout.file_size);
  emit(tensors, layout,
       [&](std::span<const uint8_t> b) { image.insert(image.end(), b.begin(), b.end()); });
  XS_CHECK_EQ(image.size(), layout.file_size, "serialize_checkpoint: file size");
  return image;
}

void save_checkpoint(const std::string& path, std::span<const TensorRef> tensors,
                     const CheckpointMetadata& metadata) {
  TraceScope span("checkpoint write", "checkpoint");
  const Layout layout = plan_layout(tensors, metadata);
  detail::remove_stale_temps(path);
  detail::AtomicFileWriter out(path, "checkpoint");
  emit(tensors, layout, [&](std::span<const uint8_t> b) { out.write(b); });
  XS_CHECK_EQ(out.size_bytes(), layout.file_size, "save_checkpoint: file size");
  out.commit();
  span.arg("bytes", static_cast<int64_t>(layout.file_size));
}

void save_checkpoint(const std::string& path, const std::vector<HostTensor>& tensors,
                     const CheckpointMetadata& metadata) {
  std::vector<TensorRef> refs;
  refs.reserve(tensors.size());
  for (const HostTensor& t : tensors) refs.push_back(t.ref());
  save_checkpoint(path, refs, metadata);
}

Checkpoint load_checkpoint(const std::string& path) {
  const std::vector<uint8_t> bytes = detail::read_file_bytes(path, "checkpoint");
  return parse_checkpoint(bytes, path);
}

std::optional<Checkpoint> load_checkpoint_if_exists(const std::string& path) {
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return std::nullopt;
  const std::vector<uint8_t> bytes =
      detail::read_file_bytes(path, "checkpoint", std::nullopt, detail::Owner::kThisUser);
  return parse_checkpoint(bytes, path);
}

}  // namespace xs
