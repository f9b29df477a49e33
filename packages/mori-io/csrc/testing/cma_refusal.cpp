// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "testing/cma_refusal.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "mori/core/env.hpp"
#include "shm/cma_copy.hpp"

namespace mori::io::testing {
namespace {

enum class Refuse { kNone, kAll, kPeers };

Refuse ReadRefusal() {
  const auto refuse = env::Get("MORI_IO_TEST_CMA_REFUSE");
  if (!refuse) return Refuse::kNone;
  if (*refuse == "peer") return Refuse::kPeers;
  return env::ParseBool("MORI_IO_TEST_CMA_REFUSE", *refuse) ? Refuse::kAll : Refuse::kNone;
}

bool Refuses(Refuse r, int pid) {
  return r == Refuse::kAll || (r == Refuse::kPeers && pid != ::getpid());
}

int Refusal(int pid, bool spans) {
  if (spans) {
    static const Refuse once = ReadRefusal();
    return Refuses(once, pid) ? EPERM : 0;
  }
  return Refuses(ReadRefusal(), pid) ? EPERM : 0;
}

}  // namespace

void InstallCmaRefusal() { SetCmaFaultHookForTesting(&Refusal); }

}  // namespace mori::io::testing
