// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/proxy/transport.hpp"

namespace mori::proxy {

// The key function: the vtable and type_info live in libmori_core only.
Transport::~Transport() = default;

}  // namespace mori::proxy
