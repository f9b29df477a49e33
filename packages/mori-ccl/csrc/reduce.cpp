// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "reduce.hpp"

#include <cstring>
#include <vector>

#include "mori/core/error.hpp"

namespace mori::ccl {
namespace {

inline float Bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even; NaN stays NaN (quiet bit forced so truncation cannot make Inf).
inline uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t FloatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to Inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return sign;
    // |f| / 2^-24 is the subnormal's integer significand: the 24-bit mantissa
    // shifted right by 126 - exponent (between 14 and 24 here).
    const uint32_t shift = 126 - (abs >> 23);
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t out = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (out & 1u))) ++out;
    return static_cast<uint16_t>(sign | out);
  }
  uint32_t out = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (out & 1u))) ++out;
  return static_cast<uint16_t>(sign | out);
}

// One element's reduction in Acc over the sources in order. Sum starts from zero
// (so an all -0.0 input sums to +0.0, as an fp32 accumulator initialised to zero
// gives); max and min start from the first source and keep the first NaN met.
template <typename Acc, typename Load>
inline Acc ReduceElement(ReduceOp op, int n, size_t i, Load load) {
  if (op == ReduceOp::kSum) {
    Acc acc = 0;
    for (int s = 0; s < n; ++s) acc += load(s, i);
    return acc;
  }
  Acc acc = load(0, i);
  for (int s = 1; s < n; ++s) {
    const Acc v = load(s, i);
    if (acc != acc) break;  // NaN stays
    if (v != v || (op == ReduceOp::kMax ? v > acc : v < acc)) acc = v;
  }
  return acc;
}

template <typename T, typename Acc>
void ReduceNative(ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  T* out = static_cast<T*>(dst);
  auto load = [srcs](int s, size_t i) {
    return static_cast<Acc>(static_cast<const T*>(srcs[s])[i]);
  };
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<T>(ReduceElement<Acc>(op, n, i, load));
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void Reduce16(ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  uint16_t* out = static_cast<uint16_t*>(dst);
  auto load = [srcs](int s, size_t i) { return Load(static_cast<const uint16_t*>(srcs[s])[i]); };
  for (size_t i = 0; i < count; ++i) out[i] = Store(ReduceElement<float>(op, n, i, load));
}

}  // namespace

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kBFloat16:
      return 2;
    case DataType::kFloat16:
      return 2;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
  }
  MORI_THROW(InvalidArgumentError, "unknown dtype code ", static_cast<int>(dtype));
}

DataType ParseDataType(const std::string& name) {
  if (name == "float32") return DataType::kFloat32;
  if (name == "float64") return DataType::kFloat64;
  if (name == "bfloat16") return DataType::kBFloat16;
  if (name == "float16") return DataType::kFloat16;
  if (name == "int32") return DataType::kInt32;
  if (name == "int64") return DataType::kInt64;
  MORI_THROW(InvalidArgumentError, "unsupported dtype '", name,
             "' (expected float32, float64, bfloat16, float16, int32, int64)");
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat16:
      return "float16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return "unknown";
}

ReduceOp ParseReduceOp(const std::string& name) {
  if (name == "sum") return ReduceOp::kSum;
  if (name == "max") return ReduceOp::kMax;
  if (name == "min") return ReduceOp::kMin;
  MORI_THROW(InvalidArgumentError, "unsupported op '", name, "' (expected sum, max, min)");
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

void ReduceCpu(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int num_srcs,
               size_t count) {
  MORI_CHECK_ARG(num_srcs >= 1, "num_srcs ", num_srcs, " must be >= 1");
  MORI_CHECK_ARG(dst != nullptr || count == 0, "null destination for ", count, " elements");
  MORI_CHECK_ARG(op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kMin,
                 "unknown reduce op code ", static_cast<int>(op));
  switch (dtype) {
    case DataType::kFloat32:
      return ReduceNative<float, float>(op, dst, srcs, num_srcs, count);
    case DataType::kFloat64:
      return ReduceNative<double, double>(op, dst, srcs, num_srcs, count);
    case DataType::kInt32:
      return ReduceNative<int32_t, int64_t>(op, dst, srcs, num_srcs, count);
    case DataType::kInt64:
      return ReduceNative<int64_t, int64_t>(op, dst, srcs, num_srcs, count);
    case DataType::kBFloat16:
      return Reduce16<Bf16ToFloat, FloatToBf16>(op, dst, srcs, num_srcs, count);
    case DataType::kFloat16:
      return Reduce16<HalfToFloat, FloatToHalf>(op, dst, srcs, num_srcs, count);
  }
  MORI_THROW(InvalidArgumentError, "unknown dtype code ", static_cast<int>(dtype));
}

void ReduceSumCpu(DataType dtype, void* dst, const void* const* srcs, int num_srcs, size_t count) {
  ReduceCpu(dtype, ReduceOp::kSum, dst, srcs, num_srcs, count);
}

}  // namespace mori::ccl
