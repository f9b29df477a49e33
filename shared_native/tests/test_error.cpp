// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <gtest/gtest.h>

#include <string>

#include "mori/core/error.hpp"

namespace mori {
namespace {

TEST(Error, SubclassCarriesCodeAndMessage) {
  try {
    MORI_THROW(InvalidArgumentError, "expert id ", 300, " out of range [0, ", 256, ") at token ",
               17);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_STREQ(e.what(), "expert id 300 out of range [0, 256) at token 17");
  }
}

TEST(Error, ThrowErrorPicksTheSubclassForEachCode) {
  const ErrorCode codes[] = {
      ErrorCode::kInternal, ErrorCode::kInvalidArgument, ErrorCode::kOutOfMemory,
      ErrorCode::kTimeout,  ErrorCode::kTransport,       ErrorCode::kNotSupported,
      ErrorCode::kCuda,     ErrorCode::kInvalidState,    ErrorCode::kNotFound};
  for (ErrorCode code : codes) {
    try {
      ThrowError(code, "msg");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << ErrorCodeName(code);
      EXPECT_STREQ(e.what(), "msg");
    }
  }
  EXPECT_THROW(ThrowError(ErrorCode::kTimeout, "t"), TimeoutError);
  EXPECT_THROW(ThrowError(ErrorCode::kTransport, "t"), TransportError);
  EXPECT_THROW(ThrowError(static_cast<ErrorCode>(999), "t"), InvalidArgumentError);
}

TEST(Error, CheckArgOnlyThrowsWhenFalseAndEvaluatesOnce) {
  int evaluations = 0;
  auto cond = [&](bool v) {
    ++evaluations;
    return v;
  };
  EXPECT_NO_THROW(MORI_CHECK_ARG(cond(true), "never"));
  EXPECT_EQ(evaluations, 1);
  EXPECT_THROW(MORI_CHECK_ARG(cond(false), "value ", 7), InvalidArgumentError);
  EXPECT_EQ(evaluations, 2);
}

TEST(Error, CheckNamesConditionAndPlace) {
  try {
    int x = 3;
    MORI_CHECK(x == 4, "x was ", x);
    FAIL();
  } catch (const InternalError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("x == 4"), std::string::npos) << what;
    EXPECT_NE(what.find("test_error.cpp"), std::string::npos) << what;
    EXPECT_NE(what.find("x was 3"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace mori
