#pragma once
// Whether the bytes just before an address end with an x86-64 call instruction: the test the
// stack scan of shm/stack_dump.cpp puts to a word that may be a return address. Private to
// shm/.
//
//   std::array<unsigned char, detail::kCallWindowBytes> window;  // the bytes at [a - 7, a)
//   if (detail::call_ending_at(window) != detail::CallForm::kNone) ... // a follows a call

#include <array>
#include <cstdint>

namespace xs::detail {

// The longest call without prefixes: FF, ModRM, SIB, disp32. A REX prefix (40-4F) before it
// changes neither where it ends nor whether it is a call, so it is never looked at.
inline constexpr int kCallWindowBytes = 7;

enum class CallForm {
  kNone,
  kDirect,    // E8 rel32
  kIndirect,  // FF /2: register or memory operand, any ModRM/SIB/displacement form
};

// The form of the call that ends exactly at the end of `window`; kIndirect when both could.
CallForm call_ending_at(const std::array<unsigned char, kCallWindowBytes>& window);

// The rel32 of the E8 call ending at the end of `window` (its target is the return address
// plus this), meaningful when call_ending_at() said kDirect.
int32_t direct_call_displacement(const std::array<unsigned char, kCallWindowBytes>& window);

}  // namespace xs::detail
