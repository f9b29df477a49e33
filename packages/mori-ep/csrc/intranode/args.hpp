// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The call arguments every mode shares live in common/args.hpp; this name stays for
// the intra-node kernels' parameter header (intranode/kernels/params.hpp).
#include "common/args.hpp"
