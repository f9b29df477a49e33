// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
//
// The P2P export's wire form (hardware independent, unit-tested on CPU machines).
#include <cstring>

#include "mori/core/error.hpp"
#include "p2p/p2p_backend.hpp"

namespace mori::io {
namespace {

constexpr uint32_t kMagic = 0x5032504du;  // "MP2P"
constexpr uint16_t kFormat = 1;
constexpr uint32_t kMaxPieces = 1u << 16;

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), left_(size) {}
  template <typename T>
  T Get(const char* what) {
    T v;
    Bytes(&v, sizeof(v), what);
    return v;
  }
  void Bytes(void* dst, size_t n, const char* what) {
    if (n > left_) {
      MORI_THROW(InvalidArgumentError, "P2P export: truncated at ", what, " (needs ", n, " bytes, ",
                 left_, " left)");
    }
    std::memcpy(dst, p_, n);
    p_ += n;
    left_ -= n;
  }
  size_t left() const { return left_; }

 private:
  const char* p_;
  size_t left_;
};

}  // namespace

std::string PackP2pExport(const P2pExport& e) {
  std::string out;
  out.reserve(128 + e.pieces.size() * 20);
  Put(out, kMagic);
  Put(out, kFormat);
  Put(out, static_cast<uint8_t>(e.kind));
  Put(out, uint8_t{0});
  Put(out, e.pid);
  out.append(reinterpret_cast<const char*>(e.gpu_uuid), sizeof(e.gpu_uuid));
  Put(out, e.region_addr);
  Put(out, e.region_size);
  Put(out, e.region_offset);
  Put(out, e.map_size);
  if (e.kind == P2pExport::kLegacyIpc) {
    out.append(reinterpret_cast<const char*>(e.ipc_handle), sizeof(e.ipc_handle));
  } else {
    Put(out, static_cast<uint32_t>(e.pieces.size()));
    for (const P2pExport::Piece& p : e.pieces) {
      Put(out, p.fd);
      Put(out, p.offset);
      Put(out, p.size);
    }
  }
  return out;
}

P2pExport UnpackP2pExport(const char* data, size_t size) {
  Reader r(data, size);
  auto magic = r.Get<uint32_t>("magic");
  if (magic != kMagic) MORI_THROW(InvalidArgumentError, "P2P export: bad magic ", magic);
  auto format = r.Get<uint16_t>("format");
  if (format != kFormat) {
    MORI_THROW(InvalidArgumentError, "P2P export: format ", format, " (this build reads ", kFormat,
               ")");
  }
  P2pExport e;
  auto kind = r.Get<uint8_t>("kind");
  if (kind != P2pExport::kLegacyIpc && kind != P2pExport::kPosixFd) {
    MORI_THROW(InvalidArgumentError, "P2P export: unknown kind ", int(kind));
  }
  e.kind = static_cast<P2pExport::Kind>(kind);
  (void)r.Get<uint8_t>("padding");
  e.pid = r.Get<int32_t>("pid");
  r.Bytes(e.gpu_uuid, sizeof(e.gpu_uuid), "gpu uuid");
  e.region_addr = r.Get<uint64_t>("region address");
  e.region_size = r.Get<uint64_t>("region size");
  e.region_offset = r.Get<uint64_t>("region offset");
  e.map_size = r.Get<uint64_t>("mapping size");
  if (e.region_size > e.map_size || e.region_offset > e.map_size - e.region_size) {
    MORI_THROW(InvalidArgumentError, "P2P export: region [", e.region_offset, ", +", e.region_size,
               ") outside its mapping of ", e.map_size, " bytes");
  }
  if (e.kind == P2pExport::kLegacyIpc) {
    r.Bytes(e.ipc_handle, sizeof(e.ipc_handle), "ipc handle");
  } else {
    auto n = r.Get<uint32_t>("piece count");
    if (n == 0 || n > kMaxPieces) {
      MORI_THROW(InvalidArgumentError, "P2P export: ", n, " pieces (1..", kMaxPieces, ")");
    }
    uint64_t expect = 0;  // pieces tile the mapping in order, without gaps
    for (uint32_t i = 0; i < n; ++i) {
      P2pExport::Piece p{};
      p.fd = r.Get<int32_t>("piece fd");
      p.offset = r.Get<uint64_t>("piece offset");
      p.size = r.Get<uint64_t>("piece size");
      if (p.offset != expect || p.size == 0 || p.fd < 0) {
        MORI_THROW(InvalidArgumentError, "P2P export: piece ", i, " (fd ", p.fd, ", offset ",
                   p.offset, ", size ", p.size, ") does not follow the previous piece at ", expect);
      }
      expect += p.size;
      e.pieces.push_back(p);
    }
    if (expect != e.map_size) {
      MORI_THROW(InvalidArgumentError, "P2P export: pieces cover ", expect,
                 " bytes of a mapping of ", e.map_size);
    }
  }
  if (r.left() != 0) {
    MORI_THROW(InvalidArgumentError, "P2P export: ", r.left(), " trailing bytes");
  }
  return e;
}

}  // namespace mori::io
