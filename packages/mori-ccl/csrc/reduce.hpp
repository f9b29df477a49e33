// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mori::ccl {

enum class DataType : int { kFloat32 = 0, kFloat64, kBFloat16, kFloat16, kInt32, kInt64 };
enum class ReduceOp : int { kSum = 0, kMax, kMin };

size_t DataTypeSize(DataType dtype);
DataType ParseDataType(const std::string& name);
const char* DataTypeName(DataType dtype);
ReduceOp ParseReduceOp(const std::string& name);
const char* ReduceOpName(ReduceOp op);

// dst[i] = sum over s of srcs[s][i], i < count. Floating types accumulate in fp32
// (fp64 in fp64) and round once on store, so the result does not depend on how a
// caller splits the sources. `dst` may alias srcs[0].
void ReduceSumCpu(DataType dtype, void* dst, const void* const* srcs, int num_srcs, size_t count);

// dst[i] = op over s of srcs[s][i], sources taken in order: sum as ReduceSumCpu;
// max and min propagate NaN (the first NaN met, as a quiet NaN for 16-bit types).
void ReduceCpu(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int num_srcs,
               size_t count);

}  // namespace mori::ccl
