// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/core/env.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <string>

#include "mori/core/error.hpp"

namespace mori::env {
namespace {

// Sets a variable for one test and restores the previous state after it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_, old_.c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

constexpr const char* kVar = "MORI_ENV_UNIT_TEST";

TEST(Env, BooleansAcceptEveryDocumentedSpelling) {
  for (const char* v : {"1", "true", "TRUE", "True", "on", "ON", "yes", "Yes"}) {
    EXPECT_TRUE(ParseBool(kVar, v)) << v;
  }
  for (const char* v : {"0", "false", "FALSE", "off", "Off", "no", "NO"}) {
    EXPECT_FALSE(ParseBool(kVar, v)) << v;
  }
}

TEST(Env, AnythingElseIsAnErrorNamingTheVariableAndTheValue) {
  for (const char* v : {"2", "-1", "enable", "y", "tru", " 1", "1 "}) {
    try {
      ParseBool(kVar, v);
      ADD_FAILURE() << "accepted '" << v << "'";
    } catch (const InvalidArgumentError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(kVar), std::string::npos) << what;
      EXPECT_NE(what.find(std::string("'") + v + "'"), std::string::npos) << what;
    }
  }
}

TEST(Env, UnsetOrEmptyMeansTheDefault) {
  ScopedEnv unset(kVar, nullptr);
  EXPECT_TRUE(Bool(kVar, true));
  EXPECT_FALSE(Bool(kVar, false));
  EXPECT_EQ(Int(kVar, 7, 0, 10), 7);
  EXPECT_EQ(Size(kVar, 4096, 0, 1 << 20), 4096u);
  EXPECT_EQ(String(kVar, "x"), "x");
  ScopedEnv empty(kVar, "");
  EXPECT_FALSE(Get(kVar).has_value());
  EXPECT_EQ(Int(kVar, -3, -5, 5), -3);
}

TEST(Env, SetValuesAreParsed) {
  ScopedEnv on(kVar, "true");
  EXPECT_TRUE(Bool(kVar, false));
  ScopedEnv n(kVar, "-12");
  EXPECT_EQ(Int(kVar, 0, -100, 100), -12);
  ScopedEnv s(kVar, "2MiB");
  EXPECT_EQ(Size(kVar, 0, 0, uint64_t{1} << 40), uint64_t{2} << 20);
}

TEST(Env, IntegersAreBoundedAndWhole) {
  EXPECT_EQ(ParseInt(kVar, "0", 0, 1), 0);
  EXPECT_EQ(ParseInt(kVar, "1000000", 0, 1000000), 1000000);
  EXPECT_EQ(ParseInt(kVar, "-9223372036854775808", INT64_MIN, 0), INT64_MIN);
  for (const char* v : {"", "-", "1.5", "12abc", "0x10", "1000001", "-1", "99999999999999999999"}) {
    EXPECT_THROW(ParseInt(kVar, v, 0, 1000000), InvalidArgumentError) << v;
  }
}

TEST(Env, SizesTakeBinaryUnits) {
  EXPECT_EQ(ParseSize(kVar, "4096", 0, UINT64_MAX), 4096u);
  EXPECT_EQ(ParseSize(kVar, "4k", 0, UINT64_MAX), 4096u);
  EXPECT_EQ(ParseSize(kVar, "512M", 0, UINT64_MAX), uint64_t{512} << 20);
  EXPECT_EQ(ParseSize(kVar, "2GiB", 0, UINT64_MAX), uint64_t{2} << 30);
  EXPECT_EQ(ParseSize(kVar, "1TB", 0, UINT64_MAX), uint64_t{1} << 40);
  for (const char* v : {"lots", "M", "1P", "1.5G", "-1", "17179869184T"}) {
    EXPECT_THROW(ParseSize(kVar, v, 0, UINT64_MAX), InvalidArgumentError) << v;
  }
  EXPECT_THROW(ParseSize(kVar, "1K", 2048, 4096), InvalidArgumentError);
  EXPECT_THROW(ParseSize(kVar, "8K", 2048, 4096), InvalidArgumentError);
}

}  // namespace
}  // namespace mori::env
