#pragma once
// The fuzz targets' bodies, shared by the libFuzzer entry points (fuzz/*_fuzz.cpp, built by
// fuzz/run) and the plain corpus replay in CTest (tests/replica/fuzz_corpus_test.cpp). A
// target returns normally for any input: parsed, or rejected with xs::Error. Anything else
// escaping (std::bad_alloc, std::length_error, a failed invariant) is a bug; so is a crash.
//
//   xs::fuzz::idx_one_input(data, size);         // throws only on a bug
//   xs::fuzz::checkpoint_one_input(data, size);

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

#include <zlib.h>

#include "xla_spawn/base/error.h"
#include "xla_spawn/replica/checkpoint.h"
#include "xla_spawn/replica/idx.h"

namespace xs::fuzz {

// 16 MiB: large enough for every corpus file, small enough that a hostile header or gzip
// bomb cannot make an iteration slow.
inline constexpr size_t kFuzzMaxBytes = size_t{16} << 20;

[[noreturn]] inline void invariant_failed(const char* what) {
  throw std::logic_error(what);
}

inline void idx_one_input(const uint8_t* data, size_t size) {
  try {
    const IdxArray array =
        decode_idx(std::vector<uint8_t>(data, data + size), "fuzz", kFuzzMaxBytes);
    if (array.data().size() != array.n_elems() * idx_type_size(array.type)) {
      invariant_failed("idx: accepted array whose data size disagrees with its dims");
    }
  } catch (const Error&) {
    // Rejected with a message: the expected outcome for most inputs.
  }
}

// Parses, and for an accepted checkpoint checks that it serialises back to the same bytes.
inline void parse_and_check_round_trip(std::span<const uint8_t> bytes) {
  Checkpoint ckpt;
  try {
    ckpt = parse_checkpoint(bytes, "fuzz");
  } catch (const Error&) {
    return;
  }
  std::vector<TensorRef> refs;
  for (const HostTensor& t : ckpt.tensors) refs.push_back(t.ref());
  const std::vector<uint8_t> again = serialize_checkpoint(refs, ckpt.metadata);
  const Checkpoint reparsed = parse_checkpoint(again, "fuzz round trip");
  if (reparsed.tensors.size() != ckpt.tensors.size() || reparsed.metadata != ckpt.metadata) {
    invariant_failed("checkpoint: round trip changed the contents");
  }
  for (size_t i = 0; i < ckpt.tensors.size(); ++i) {
    if (reparsed.tensors[i].bytes != ckpt.tensors[i].bytes) {
      invariant_failed("checkpoint: round trip changed a tensor's bytes");
    }
  }
}

// Runs the parser on the input as is (envelope checks: magic, version, size, CRC) and on a
// copy whose size field and CRC are made consistent, so mutations reach the index parser
// instead of all stopping at the checksum.
inline void checkpoint_one_input(const uint8_t* data, size_t size) {
  parse_and_check_round_trip(std::span<const uint8_t>(data, size));
  if (size < 44) return;  // 40-byte fixed header + 4-byte CRC
  std::vector<uint8_t> sealed(data, data + size);
  for (int i = 0; i < 8; ++i) sealed[16 + i] = static_cast<uint8_t>(uint64_t{size} >> (8 * i));
  const uLong crc = crc32_z(crc32_z(0L, Z_NULL, 0), sealed.data(), size - 4);
  for (int i = 0; i < 4; ++i) sealed[size - 4 + i] = static_cast<uint8_t>(crc >> (8 * i));
  parse_and_check_round_trip(sealed);
}

}  // namespace xs::fuzz
