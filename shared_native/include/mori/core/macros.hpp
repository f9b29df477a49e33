// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// libmori_core is built with -fvisibility=hidden; MORI_API marks the exported API.
// The same attribute on both sides: on ELF a declaration with default visibility
// makes the importer bind to the one definition in libmori_core.
#define MORI_API __attribute__((visibility("default")))

#define MORI_LIKELY(x) __builtin_expect(!!(x), 1)
#define MORI_UNLIKELY(x) __builtin_expect(!!(x), 0)

#define MORI_CONCAT_IMPL(a, b) a##b
#define MORI_CONCAT(a, b) MORI_CONCAT_IMPL(a, b)
