// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/verbs/endpoint_codec.hpp"

#include <cstring>

#include "mori/core/error.hpp"

namespace mori::transport::verbs {
namespace {

constexpr char kMagic[4] = {'m', 'R', 'D', 'M'};
constexpr uint8_t kKindEndpoints = 1;
constexpr uint8_t kKindRegionKey = 2;

class Writer {
 public:
  void Put(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  uint64_t Get(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      v |= uint64_t{static_cast<uint8_t>(in_[pos_ + static_cast<size_t>(i)])} << (8 * i);
    }
    pos_ += static_cast<size_t>(bytes);
    return v;
  }
  void Raw(void* p, size_t n) {
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }

 private:
  const std::string& in_;
  size_t pos_ = 0;
};

void PutHeader(Writer* w, uint8_t kind, size_t count) {
  w->Raw(kMagic, sizeof(kMagic));
  w->Put(kCodecVersion, 1);
  w->Put(kind, 1);
  w->Put(count, 2);
}

// Checks everything about the header and the total length; returns the count.
size_t CheckHeader(const std::string& in, uint8_t want_kind, size_t entry_bytes, const char* what) {
  MORI_CHECK_ARG(in.size() >= kCodecHeaderBytes, "RDMA ", what, " message of ", in.size(),
                 " bytes is shorter than its ", kCodecHeaderBytes, "-byte header");
  MORI_CHECK_ARG(std::memcmp(in.data(), kMagic, sizeof(kMagic)) == 0, "RDMA ", what,
                 " message does not start with the magic 'mRDM' (not a mori RDMA payload)");
  Reader r(in);
  r.Get(4);
  auto version = static_cast<uint8_t>(r.Get(1));
  auto kind = static_cast<uint8_t>(r.Get(1));
  auto count = static_cast<size_t>(r.Get(2));
  MORI_CHECK_ARG(version == kCodecVersion, "RDMA ", what, " message has format version ",
                 int{version}, "; this build reads version ", int{kCodecVersion});
  MORI_CHECK_ARG(kind == want_kind, "RDMA message kind ", int{kind}, " where ", what, " (kind ",
                 int{want_kind}, ") was expected");
  size_t want = kCodecHeaderBytes + count * entry_bytes;
  MORI_CHECK_ARG(in.size() == want, "RDMA ", what, " message of ", in.size(),
                 " bytes; its header announces ", count, " entr", count == 1 ? "y" : "ies", " = ",
                 want, " bytes");
  return count;
}

}  // namespace

std::string EncodeEndpoints(const std::vector<EndpointInfo>& endpoints) {
  MORI_CHECK_ARG(!endpoints.empty() && endpoints.size() <= kMaxEndpointsPerMessage,
                 "endpoint count ", endpoints.size(), " outside [1, ", kMaxEndpointsPerMessage,
                 "]");
  Writer w;
  PutHeader(&w, kKindEndpoints, endpoints.size());
  for (const EndpointInfo& e : endpoints) {
    MORI_CHECK_ARG(e.qpn <= kPsnMask && e.psn <= kPsnMask, "endpoint QPN ", e.qpn, " / PSN ", e.psn,
                   " does not fit 24 bits");
    w.Put(e.qpn, 4);
    w.Put(e.psn, 4);
    w.Put(e.lid, 2);
    w.Put(e.port_num, 1);
    w.Put(e.active_mtu, 1);
    w.Put(static_cast<uint8_t>(e.link_layer), 1);
    w.Put(0, 1);
    w.Raw(e.gid.data(), e.gid.size());
  }
  return w.Take();
}

std::vector<EndpointInfo> DecodeEndpoints(const std::string& bytes) {
  size_t count = CheckHeader(bytes, kKindEndpoints, kEndpointEntryBytes, "endpoints");
  MORI_CHECK_ARG(count >= 1 && count <= kMaxEndpointsPerMessage, "RDMA endpoints message with ",
                 count, " endpoints, outside [1, ", kMaxEndpointsPerMessage, "]");
  Reader r(bytes);
  r.Get(static_cast<int>(kCodecHeaderBytes));
  std::vector<EndpointInfo> out(count);
  for (size_t i = 0; i < count; ++i) {
    EndpointInfo& e = out[i];
    e.qpn = static_cast<uint32_t>(r.Get(4));
    e.psn = static_cast<uint32_t>(r.Get(4));
    e.lid = static_cast<uint16_t>(r.Get(2));
    e.port_num = static_cast<uint8_t>(r.Get(1));
    e.active_mtu = static_cast<uint8_t>(r.Get(1));
    auto link = static_cast<uint8_t>(r.Get(1));
    auto reserved = static_cast<uint8_t>(r.Get(1));
    r.Raw(e.gid.data(), e.gid.size());
    MORI_CHECK_ARG(e.qpn != 0 && e.qpn <= kPsnMask, "endpoint ", i, ": QPN ", e.qpn,
                   " outside [1, 2^24)");
    MORI_CHECK_ARG(e.psn <= kPsnMask, "endpoint ", i, ": PSN ", e.psn, " does not fit 24 bits");
    MORI_CHECK_ARG(e.port_num >= 1, "endpoint ", i, ": port 0");
    MORI_CHECK_ARG(e.active_mtu >= kMtuMin && e.active_mtu <= kMtuMax, "endpoint ", i,
                   ": MTU enum ", int{e.active_mtu}, " outside [1, 5]");
    MORI_CHECK_ARG(link == static_cast<uint8_t>(LinkLayer::kInfiniBand) ||
                       link == static_cast<uint8_t>(LinkLayer::kEthernet),
                   "endpoint ", i, ": link layer ", int{link},
                   " is neither 1 (InfiniBand) nor 2 (Ethernet)");
    MORI_CHECK_ARG(reserved == 0, "endpoint ", i, ": reserved byte is ", int{reserved},
                   ", not 0 (a newer format?)");
    e.link_layer = static_cast<LinkLayer>(link);
  }
  return out;
}

std::string EncodeRegionKey(const RegionKey& key) {
  Writer w;
  PutHeader(&w, kKindRegionKey, 1);
  w.Put(key.addr, 8);
  w.Put(key.length, 8);
  w.Put(key.rkey, 4);
  return w.Take();
}

RegionKey DecodeRegionKey(const std::string& bytes) {
  size_t count = CheckHeader(bytes, kKindRegionKey, kRegionKeyEntryBytes, "region key");
  MORI_CHECK_ARG(count == 1, "RDMA region key message with ", count, " entries (expected 1)");
  Reader r(bytes);
  r.Get(static_cast<int>(kCodecHeaderBytes));
  RegionKey key;
  key.addr = r.Get(8);
  key.length = r.Get(8);
  key.rkey = static_cast<uint32_t>(r.Get(4));
  MORI_CHECK_ARG(key.length > 0, "RDMA region key of length 0");
  MORI_CHECK_ARG(key.addr + key.length >= key.addr, "RDMA region key [0x", std::hex, key.addr,
                 ", +0x", key.length, ") wraps around the address space");
  return key;
}

}  // namespace mori::transport::verbs
