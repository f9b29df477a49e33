// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// The DLPack ABI (v0.8 DLManagedTensor, the form every framework's from_dlpack
// accepts as a "dltensor" capsule), declared here so no header is vendored.

#include <cstdint>

namespace mori::python::dlpack {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4, kBool = 6 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

}  // namespace mori::python::dlpack
