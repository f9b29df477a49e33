// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The CMA fault switch of test builds: MORI_IO_TEST_CMA_REFUSE=1 makes every CMA copy
// fail with EPERM (the engine's own probe fails: SHM is refused from the start),
// =peer every copy to another process (the per-peer probe at connect, or a transfer's
// copy, fails: the pair falls back to TCP). The probes read the variable at each call
// (a test sets it in a running process); a transfer's copy reads it once per process
// (a getenv per copy was a tenth of the engine's own cost of a 4 KiB write).

namespace mori::io::testing {

// Installs the switch as shm/cma_copy.hpp's fault hook.
void InstallCmaRefusal();

}  // namespace mori::io::testing
