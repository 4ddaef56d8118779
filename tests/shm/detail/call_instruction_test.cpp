// Every form of x86-64 call the stack scan must accept (the encodings as GNU as assembles
// them), with and without a REX prefix, and the look-alikes it must not.

#include "xla_spawn/shm/detail/call_instruction.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace xs::detail {
namespace {

struct Encoding {
  std::string assembly;
  std::vector<unsigned char> bytes;
  CallForm form;
};

// `bytes` right-aligned in the window, after single-byte instructions (nop) that make no call.
std::array<unsigned char, kCallWindowBytes> window_ending_with(
    const std::vector<unsigned char>& bytes) {
  std::array<unsigned char, kCallWindowBytes> window;
  window.fill(0x90);
  const size_t n = std::min(bytes.size(), window.size());
  std::copy(bytes.end() - static_cast<std::ptrdiff_t>(n), bytes.end(),
            window.end() - static_cast<std::ptrdiff_t>(n));
  return window;
}

class CallInstruction : public ::testing::TestWithParam<Encoding> {};

TEST_P(CallInstruction, IsRecognisedWhereItEnds) {
  const Encoding& e = GetParam();
  EXPECT_EQ(call_ending_at(window_ending_with(e.bytes)), e.form) << e.assembly;
}

TEST_P(CallInstruction, IsNotRecognisedOneByteEarlier) {
  // The same bytes followed by a nop: the address after the nop follows no call.
  const Encoding& e = GetParam();
  std::vector<unsigned char> shifted = e.bytes;
  shifted.push_back(0x90);
  EXPECT_EQ(call_ending_at(window_ending_with(shifted)), CallForm::kNone) << e.assembly;
}

INSTANTIATE_TEST_SUITE_P(
    Forms, CallInstruction,
    ::testing::Values(
        Encoding{"call rel32", {0xE8, 0x00, 0x00, 0x00, 0x00}, CallForm::kDirect},
        Encoding{"call rel32 (backwards)", {0xE8, 0xF0, 0xFF, 0xFF, 0xFF}, CallForm::kDirect},
        Encoding{"call *%rax", {0xFF, 0xD0}, CallForm::kIndirect},
        Encoding{"call *%r8", {0x41, 0xFF, 0xD0}, CallForm::kIndirect},
        Encoding{"call *(%rax)", {0xFF, 0x10}, CallForm::kIndirect},
        Encoding{"call *(%r8)", {0x41, 0xFF, 0x10}, CallForm::kIndirect},
        Encoding{"call *0x10(%rax)", {0xFF, 0x50, 0x10}, CallForm::kIndirect},
        Encoding{"call *-0x8(%r13)", {0x41, 0xFF, 0x55, 0xF8}, CallForm::kIndirect},
        Encoding{"call *0x1000(%rax)", {0xFF, 0x90, 0x00, 0x10, 0x00, 0x00}, CallForm::kIndirect},
        Encoding{
            "call *0x12345678(%rip)", {0xFF, 0x15, 0x78, 0x56, 0x34, 0x12}, CallForm::kIndirect},
        Encoding{"call *(%rax,%rbx,8)", {0xFF, 0x14, 0xD8}, CallForm::kIndirect},
        Encoding{"call *(%r8,%r11,8)", {0x43, 0xFF, 0x14, 0xD8}, CallForm::kIndirect},
        Encoding{"call *0x10(%rax,%rbx,8)", {0xFF, 0x54, 0xD8, 0x10}, CallForm::kIndirect},
        Encoding{"call *0x1000(%rax,%rbx,8)",
                 {0xFF, 0x94, 0xD8, 0x00, 0x10, 0x00, 0x00},
                 CallForm::kIndirect},
        Encoding{"call *0x10(%rsp)", {0xFF, 0x54, 0x24, 0x10}, CallForm::kIndirect},
        Encoding{"call *(%rsp)", {0xFF, 0x14, 0x24}, CallForm::kIndirect},
        Encoding{"call *0x1000(,%rbx,8)",
                 {0xFF, 0x14, 0xDD, 0x00, 0x10, 0x00, 0x00},
                 CallForm::kIndirect},
        Encoding{"call *0x0(%rbp)", {0xFF, 0x55, 0x00}, CallForm::kIndirect},
        Encoding{"call *0x10(%rbp)", {0xFF, 0x55, 0x10}, CallForm::kIndirect}));

TEST(CallInstructionLookAlike, OtherUsesOfOpcodeFFAreNotCalls) {
  EXPECT_EQ(call_ending_at(window_ending_with({0xFF, 0xE0})), CallForm::kNone);  // jmp *%rax
  EXPECT_EQ(call_ending_at(window_ending_with({0xFF, 0x64, 0xD8, 0x10})),
            CallForm::kNone);                                                    // jmp *0x10(..)
  EXPECT_EQ(call_ending_at(window_ending_with({0xFF, 0x30})), CallForm::kNone);  // push (%rax)
  EXPECT_EQ(call_ending_at(window_ending_with({0xFF, 0xC0})), CallForm::kNone);  // inc %eax
}

TEST(CallInstructionLookAlike, AModRmOfTheWrongLengthIsNoCall) {
  // FF 50 is call *disp8(%rax): it needs one byte of displacement, not two.
  EXPECT_EQ(call_ending_at(window_ending_with({0xFF, 0x50, 0x10, 0x20})), CallForm::kNone);
  // FF 15 is call *disp32(%rip): five bytes after FF, not two.
  EXPECT_EQ(call_ending_at(window_ending_with({0xFF, 0x15, 0x10})), CallForm::kNone);
  EXPECT_EQ(call_ending_at(window_ending_with({0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00})),
            CallForm::kNone);
}

TEST(CallInstructionLookAlike, TheDirectCallsDisplacementIsItsLastFourBytes) {
  EXPECT_EQ(direct_call_displacement(window_ending_with({0xE8, 0x78, 0x56, 0x34, 0x12})),
            0x12345678);
  EXPECT_EQ(direct_call_displacement(window_ending_with({0xE8, 0xF0, 0xFF, 0xFF, 0xFF})), -16);
}

}  // namespace
}  // namespace xs::detail
