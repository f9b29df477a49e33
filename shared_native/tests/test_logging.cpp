// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"

namespace mori::log {
namespace {

// Redirects stderr into a temporary file for the lifetime of the object.
class StderrCapture {
 public:
  StderrCapture() {
    file_ = std::tmpfile();
    saved_ = ::dup(STDERR_FILENO);
    ::dup2(::fileno(file_), STDERR_FILENO);
  }
  ~StderrCapture() {
    Restore();
    std::fclose(file_);
  }
  std::string Text() {
    Restore();
    std::string out;
    std::rewind(file_);
    char buf[512];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), file_)) > 0) out.append(buf, n);
    return out;
  }

 private:
  void Restore() {
    if (saved_ >= 0) {
      ::dup2(saved_, STDERR_FILENO);
      ::close(saved_);
      saved_ = -1;
    }
  }
  std::FILE* file_;
  int saved_;
};

class LoggingTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = GetLevel(Module::kIo); }
  void TearDown() override { SetLevel(Module::kIo, saved_); }
  Level saved_;
};

TEST_F(LoggingTest, ThresholdFiltersAndLineNamesModuleLevelAndPlace) {
  SetLevel(Module::kIo, Level::kInfo);
  StderrCapture cap;
  MORI_LOG_DEBUG(kIo, "hidden ", 1);
  MORI_LOG_INFO(kIo, "shown ", 2);
  MORI_LOG_WARN(kEp, "ep warns by default");
  std::string text = cap.Text();
  EXPECT_EQ(text.find("hidden"), std::string::npos) << text;
  EXPECT_NE(text.find("io INFO test_logging.cpp:"), std::string::npos) << text;
  EXPECT_NE(text.find("] shown 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ep WARN"), std::string::npos) << text;
}

TEST_F(LoggingTest, ArgumentsAreNotEvaluatedWhenDisabled) {
  SetLevel(Module::kIo, Level::kError);
  int calls = 0;
  auto expensive = [&] {
    ++calls;
    return 42;
  };
  MORI_LOG_INFO(kIo, "value ", expensive());
  EXPECT_EQ(calls, 0);
  StderrCapture cap;
  MORI_LOG_ERROR(kIo, "value ", expensive());
  EXPECT_EQ(calls, 1);
  EXPECT_NE(cap.Text().find("value 42"), std::string::npos);
}

// The macros are single statements: they bind correctly in an unbraced if/else and
// declare no names that could clash with the caller's.
TEST_F(LoggingTest, MacroIsOneStatementInUnbracedIfElse) {
  SetLevel(Module::kIo, Level::kOff);
  int branch = 0;
  bool cond = false;
  if (cond)
    MORI_LOG_ERROR(kIo, "then");
  else
    branch = 2;
  EXPECT_EQ(branch, 2);
  // Names a careless macro might declare.
  int mori_log_enabled = 5, level = 6, module = 7;
  MORI_LOG_INFO(kIo, mori_log_enabled, level, module);
  EXPECT_EQ(mori_log_enabled + level + module, 18);
}

TEST_F(LoggingTest, ParseRejectsUnknownNamesWithTheValue) {
  EXPECT_EQ(ParseLevel("DEBUG"), Level::kDebug);
  EXPECT_EQ(ParseLevel("warning"), Level::kWarn);
  EXPECT_EQ(ParseModule("Shmem"), Module::kShmem);
  try {
    ParseLevel("loud");
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("'loud'"), std::string::npos);
  }
  EXPECT_THROW(ParseModule("gpu"), InvalidArgumentError);
}

}  // namespace
}  // namespace mori::log
