#include "xla_spawn/base/check.h"

#include <gtest/gtest.h>

#include "xla_spawn/base/env.h"
#include "tests/support/scoped_env.h"

namespace xs {
namespace {

TEST(Check, PassingCheckDoesNothing) { EXPECT_NO_THROW(XS_CHECK(1 + 1 == 2, "math")); }

TEST(Check, FailingCheckThrowsInternalErrorWithValues) {
  const int n = 7;
  try {
    XS_CHECK(n < 5, "n is {}", n);
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("n is 7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("n < 5"), std::string::npos) << e.what();
  }
}

TEST(Check, CheckEqPrintsBothSides) {
  try {
    XS_CHECK_EQ(4096, 4095, "all_reduce element count");
    FAIL() << "no throw";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("4096 != 4095"), std::string::npos) << e.what();
  }
}

TEST(Check, ArgCheckThrowsInvalidArgument) {
  EXPECT_THROW(XS_CHECK_ARG(false, "bad {}", 1), InvalidArgument);
}

TEST(Env, ParseIntAcceptsRange) { EXPECT_EQ(parse_int("42", 0, 100, "x"), 42); }

TEST(Env, ParseIntRejectsJunkNamingTheSource) {
  for (const char* text : {"", "abc", "4x", " 4", "-", "1.5"}) {
    try {
      parse_int(text, 0, 100, "--nprocs");
      FAIL() << "accepted '" << text << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--nprocs"), std::string::npos) << e.what();
    }
  }
}

TEST(Env, ParseIntRejectsOutOfRange) {
  EXPECT_THROW(parse_int("-1", 0, 100, "x"), InvalidArgument);
  EXPECT_THROW(parse_int("101", 0, 100, "x"), InvalidArgument);
  EXPECT_THROW(parse_int("99999999999999999999999", 0, 100, "x"), InvalidArgument);
}

TEST(Env, UnsetAndEmptyAreNullopt) {
  testing::ScopedEnv unset("XS_TEST_VAR", std::nullopt);
  EXPECT_FALSE(env_int("XS_TEST_VAR", 0, 1).has_value());
  testing::ScopedEnv empty("XS_TEST_VAR", "");
  EXPECT_FALSE(env_int("XS_TEST_VAR", 0, 1).has_value());
}

TEST(Env, BoolParsesWordsAndRejectsOthers) {
  {
    testing::ScopedEnv v("XS_TEST_VAR", "Yes");
    EXPECT_EQ(env_bool("XS_TEST_VAR"), true);
  }
  {
    testing::ScopedEnv v("XS_TEST_VAR", "off");
    EXPECT_EQ(env_bool("XS_TEST_VAR"), false);
  }
  testing::ScopedEnv v("XS_TEST_VAR", "maybe");
  EXPECT_THROW(env_bool("XS_TEST_VAR"), InvalidArgument);
}

}  // namespace
}  // namespace xs
