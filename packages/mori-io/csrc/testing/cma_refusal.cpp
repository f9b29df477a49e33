// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "testing/cma_refusal.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "shm/cma_copy.hpp"

namespace mori::io::testing {
namespace {

enum class Refuse { kNone, kAll, kPeers };

Refuse ReadRefusal() {
  const char* refuse = std::getenv("MORI_IO_TEST_CMA_REFUSE");
  if (refuse == nullptr) return Refuse::kNone;
  if (std::strcmp(refuse, "1") == 0) return Refuse::kAll;
  return std::strcmp(refuse, "peer") == 0 ? Refuse::kPeers : Refuse::kNone;
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
