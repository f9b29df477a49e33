// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "mori/bootstrap/bootstrap.hpp"

namespace mori::python {

// The native Bootstrap behind a Python bootstrap object: a mori.core._C.TcpBootstrap
// is used directly; any other object (mori.core.bootstrap.TorchBootstrap, or a user's
// own) is wrapped and called back with the GIL held. It must provide `rank`,
// `world_size`, `all_gather_fixed(bytes) -> bytes`, `broadcast_fixed(bytes, root)
// -> bytes` and `barrier()`.
std::shared_ptr<bootstrap::Bootstrap> BootstrapFromPython(pybind11::handle obj);

}  // namespace mori::python
