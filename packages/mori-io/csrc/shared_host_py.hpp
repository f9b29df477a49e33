// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <pybind11/pybind11.h>

namespace mori::io {
void register_shared_host(pybind11::module_& m);
}  // namespace mori::io
