#include "xla_spawn/replica/detail/checkpoint_reader.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>
#include <zlib.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/checkpoint.h"
#include "xla_spawn/replica/detail/checkpoint_format.h"

namespace xs {
namespace detail {

std::optional<uint64_t> tensor_bytes(std::span<const int64_t> shape, DType dtype) {
  constexpr uint64_t kLimit = uint64_t{1} << 62;
  uint64_t total = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    const auto ud = static_cast<uint64_t>(d);
    if (ud != 0 && total > kLimit / ud) return std::nullopt;
    total *= ud;
  }
  return total;
}

namespace {

namespace ck = ckpt;

uint64_t get_le(const uint8_t* p, int n_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < n_bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Reads index fields, each checked against the index end before it is touched; errors say
// which field of which entry ran past the end.
class IndexReader {
 public:
  IndexReader(std::span<const uint8_t> bytes, size_t end, std::string_view source)
      : bytes_(bytes), pos_(ck::kFixedHeaderBytes), end_(end), source_(source) {}

  void set_entry(std::string entry) { entry_ = std::move(entry); }
  size_t pos() const { return pos_; }

  uint64_t uint(int n_bytes, std::string_view field) {
    need(static_cast<size_t>(n_bytes), field);
    const uint64_t v = get_le(bytes_.data() + pos_, n_bytes);
    pos_ += static_cast<size_t>(n_bytes);
    return v;
  }
  // A u32-length-prefixed string of at most max_bytes.
  std::string_view str(size_t max_bytes, std::string_view field) {
    const uint64_t n = uint(4, field);
    if (n > max_bytes) fail(fmt::format("{} length {} exceeds the limit {}", field, n, max_bytes));
    need(n, field);
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(fmt::format("checkpoint {}: {}: {}", source_, entry_, what));
  }

 private:
  void need(size_t n, std::string_view field) const {
    if (n > end_ - pos_) {
      fail(fmt::format("{} ({} bytes at byte {}) runs past the index end at byte {}", field, n,
                       pos_, end_));
    }
  }

  std::span<const uint8_t> bytes_;
  size_t pos_;
  size_t end_;
  std::string_view source_;
  std::string entry_;
};

[[noreturn]] void bad(std::string_view source, const std::string& what) {
  throw InvalidArgument(fmt::format("checkpoint {}: {}", source, what));
}

// Magic, version, declared size and checksum: whole-file checks, before the index is read.
void check_envelope(std::span<const uint8_t> bytes, std::string_view source) {
  const size_t size = bytes.size();
  if (size < ck::kFixedHeaderBytes + ck::kChecksumBytes) {
    bad(source, fmt::format("{} bytes, smaller than the {}-byte header and checksum: truncated or "
                            "not a checkpoint",
                            size, ck::kFixedHeaderBytes + ck::kChecksumBytes));
  }
  if (!std::equal(ck::kMagic.begin(), ck::kMagic.end(), bytes.begin())) {
    bad(source, fmt::format("bad magic {:02x}: not an xla-spawn checkpoint (expected {:02x})",
                            fmt::join(bytes.first(8), " "), fmt::join(ck::kMagic, " ")));
  }
  const uint64_t version = get_le(bytes.data() + 8, 4);
  if (version != ck::kVersion) {
    bad(source,
        fmt::format("format version {}, this build reads version {}", version, ck::kVersion));
  }
  const uint64_t declared = get_le(bytes.data() + 16, 8);
  if (declared != size) {
    bad(source,
        fmt::format("the header says the file is {} bytes but it has {}: {}", declared, size,
                    declared > size ? "truncated" : "trailing bytes or a corrupt header"));
  }
  const uint64_t stored = get_le(bytes.data() + size - ck::kChecksumBytes, 4);
  const uint64_t computed =
      crc32_z(crc32_z(0L, Z_NULL, 0), bytes.data(), size - ck::kChecksumBytes);
  if (stored != computed) {
    bad(source, fmt::format("checksum mismatch: stored CRC-32 {:08x}, computed {:08x} over {} "
                            "bytes: the file is corrupted",
                            stored, computed, size - ck::kChecksumBytes));
  }
  const uint64_t flags = get_le(bytes.data() + 12, 4);
  if (flags != 0) bad(source, fmt::format("flags {:#x}, expected 0 in version 1", flags));
}

HostTensor read_tensor_entry(IndexReader& in, uint32_t i) {
  in.set_entry(fmt::format("tensor {}", i));
  HostTensor t;
  t.name = std::string(in.str(kMaxTensorNameBytes, "name"));
  if (t.name.empty()) in.fail("empty name");
  in.set_entry(fmt::format("tensor {} '{}'", i, t.name));
  const uint64_t dtype = in.uint(1, "dtype");
  if (dtype >= static_cast<uint64_t>(kNumDTypes)) {
    in.fail(fmt::format("dtype code {}, expected 0..{}", dtype, kNumDTypes - 1));
  }
  t.dtype = static_cast<DType>(dtype);
  const uint64_t rank = in.uint(1, "rank");
  if (rank > static_cast<uint64_t>(kMaxTensorRank)) {
    in.fail(fmt::format("rank {}, at most {}", rank, kMaxTensorRank));
  }
  for (uint64_t d = 0; d < rank; ++d) t.shape.push_back(static_cast<int64_t>(in.uint(8, "dim")));
  return t;
}

CheckpointMetadata::value_type read_meta_entry(IndexReader& in, uint32_t i) {
  in.set_entry(fmt::format("metadata entry {}", i));
  std::string key(in.str(kMaxTensorNameBytes, "key"));
  if (key.empty()) in.fail("empty key");
  in.set_entry(fmt::format("metadata '{}'", key));
  const uint64_t kind = in.uint(1, "kind");
  if (kind == ck::kMetaInt) return {std::move(key), static_cast<int64_t>(in.uint(8, "value"))};
  if (kind == ck::kMetaString)
    return {std::move(key), std::string(in.str(kMaxMetaStringBytes, "value"))};
  in.fail(fmt::format("kind {}, expected {} (integer) or {} (string)", kind, ck::kMetaInt,
                      ck::kMetaString));
}

}  // namespace
}  // namespace detail

namespace {

// A tensor's place in the data region, for the overlap check.
struct DataSpan {
  uint64_t offset;
  uint64_t size;
  size_t tensor;
};

std::string end_string(uint64_t offset, uint64_t size) {
  return size <= UINT64_MAX - offset ? fmt::format("{}", offset + size) : "beyond 2^64";
}

// Reads tensor i's offset and size and checks them against its shape and the data region.
DataSpan read_data_span(detail::IndexReader& in, const HostTensor& t, size_t i, uint64_t index_end,
                        uint64_t data_end) {
  const uint64_t offset = in.uint(8, "data offset");
  const uint64_t size = in.uint(8, "data size");
  const auto need = detail::tensor_bytes(t.shape, t.dtype);
  if (!need || *need != size) {
    in.fail(fmt::format("shape [{}] of {} needs {} bytes but the index says {}",
                        fmt::join(t.shape, ", "), dtype_name(t.dtype),
                        need ? fmt::format("{}", *need) : std::string("an impossible count of"),
                        size));
  }
  if (offset < index_end) {
    in.fail(fmt::format("data offset {} lies inside the index, which ends at byte {}", offset,
                        index_end));
  }
  if (offset > data_end || size > data_end - offset) {
    in.fail(
        fmt::format("data extends to byte {} but the file has {} (data must end by byte {}, "
                    "before the checksum)",
                    end_string(offset, size), data_end + 4, data_end));
  }
  return DataSpan{offset, size, i};
}

void check_no_overlap(std::vector<DataSpan> spans, const std::vector<HostTensor>& tensors,
                      std::string_view source) {
  std::sort(spans.begin(), spans.end(),
            [](const DataSpan& a, const DataSpan& b) { return a.offset < b.offset; });
  for (size_t k = 1; k < spans.size(); ++k) {
    const DataSpan& a = spans[k - 1];
    const DataSpan& b = spans[k];
    if (a.offset + a.size > b.offset) {
      detail::bad(source, fmt::format("tensor {} '{}' (bytes {}..{}) overlaps tensor {} '{}' "
                                      "(from byte {})",
                                      a.tensor, tensors[a.tensor].name, a.offset, a.offset + a.size,
                                      b.tensor, tensors[b.tensor].name, b.offset));
    }
  }
}

}  // namespace

Checkpoint parse_checkpoint(std::span<const uint8_t> bytes, std::string_view source) {
  detail::check_envelope(bytes, source);
  namespace ck = detail::ckpt;
  const uint64_t data_end = bytes.size() - ck::kChecksumBytes;
  const uint64_t index_end = detail::get_le(bytes.data() + 24, 8);
  if (index_end < ck::kFixedHeaderBytes || index_end > data_end) {
    detail::bad(source, fmt::format("index end {} outside [{}, {}]", index_end,
                                    ck::kFixedHeaderBytes, data_end));
  }
  const uint64_t n_tensors = detail::get_le(bytes.data() + 32, 4);
  const uint64_t n_meta = detail::get_le(bytes.data() + 36, 4);
  // Smallest entries: tensor 4+1+1+1+8+8 bytes (1-byte name, rank 0), metadata 4+1+1+4.
  if (n_tensors * 23 + n_meta * 10 > index_end - ck::kFixedHeaderBytes) {
    detail::bad(source, fmt::format("{} tensors and {} metadata entries cannot fit in an index of "
                                    "{} bytes",
                                    n_tensors, n_meta, index_end - ck::kFixedHeaderBytes));
  }
  Checkpoint ckpt;
  ckpt.source = std::string(source);
  detail::IndexReader in(bytes, index_end, source);
  std::vector<DataSpan> spans;
  std::unordered_set<std::string> names;
  for (uint32_t i = 0; i < n_tensors; ++i) {
    HostTensor t = detail::read_tensor_entry(in, i);
    if (!names.insert(t.name).second) in.fail("the name appears twice");
    spans.push_back(read_data_span(in, t, i, index_end, data_end));
    ckpt.tensors.push_back(std::move(t));
  }
  for (uint32_t i = 0; i < n_meta; ++i) {
    auto entry = detail::read_meta_entry(in, i);
    if (!ckpt.metadata.insert(std::move(entry)).second) in.fail("the key appears twice");
  }
  if (in.pos() != index_end) {
    detail::bad(source, fmt::format("the index ends at byte {} but the header says {}", in.pos(),
                                    index_end));
  }
  check_no_overlap(spans, ckpt.tensors, source);
  for (const DataSpan& s : spans) {
    const auto* begin = bytes.data() + s.offset;
    ckpt.tensors[s.tensor].bytes.assign(begin, begin + s.size);
  }
  return ckpt;
}

}  // namespace xs
