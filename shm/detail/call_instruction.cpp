#include "xla_spawn/shm/detail/call_instruction.h"

#include <cstring>

namespace xs::detail {
namespace {

// Bytes of ModRM and what follows it (SIB, displacement) in the operand ModRM `modrm` starts,
// `sib` being the byte after it (Intel SDM vol. 2, tables 2-2 and 2-3, 64-bit mode).
int operand_bytes(unsigned char modrm, unsigned char sib) {
  const int mod = modrm >> 6;
  const int rm = modrm & 7;
  const bool has_sib = mod != 3 && rm == 4;
  int n = 1 + (has_sib ? 1 : 0);
  if (mod == 1) n += 1;
  if (mod == 2) n += 4;
  if (mod == 0 && rm == 5) n += 4;                    // [rip + disp32]
  if (mod == 0 && has_sib && (sib & 7) == 5) n += 4;  // SIB base 101: [index*s + disp32]
  return n;
}

}  // namespace

CallForm call_ending_at(const std::array<unsigned char, kCallWindowBytes>& window) {
  // FF /2 is 2 to 7 bytes long: try each place its opcode could start at.
  for (int start = kCallWindowBytes - 2; start >= 0; --start) {
    if (window[start] != 0xFF) continue;
    const unsigned char modrm = window[start + 1];
    const unsigned char sib = start + 2 < kCallWindowBytes ? window[start + 2] : 0;
    if (((modrm >> 3) & 7) == 2 && 1 + operand_bytes(modrm, sib) == kCallWindowBytes - start) {
      return CallForm::kIndirect;
    }
  }
  return window[kCallWindowBytes - 5] == 0xE8 ? CallForm::kDirect : CallForm::kNone;
}

int32_t direct_call_displacement(const std::array<unsigned char, kCallWindowBytes>& window) {
  int32_t rel = 0;
  std::memcpy(&rel, window.data() + kCallWindowBytes - 4, sizeof rel);  // little-endian
  return rel;
}

}  // namespace xs::detail
