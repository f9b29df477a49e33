// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/bootstrap/bootstrap.hpp"

#include <algorithm>
#include <cstring>

#include "mori/core/error.hpp"

namespace mori::bootstrap {

Bootstrap::~Bootstrap() = default;

std::vector<std::vector<uint8_t>> AllGatherBytes(Bootstrap& bootstrap,
                                                 const std::vector<uint8_t>& mine) {
  const int world = bootstrap.WorldSize();
  uint64_t my_size = mine.size();
  std::vector<uint64_t> sizes(world);
  bootstrap.AllGather(&my_size, sizeof(my_size), sizes.data());
  const uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());

  std::vector<uint8_t> padded(max_size, 0);
  if (!mine.empty()) std::memcpy(padded.data(), mine.data(), mine.size());
  std::vector<uint8_t> all(max_size * world);
  if (max_size > 0) bootstrap.AllGather(padded.data(), max_size, all.data());

  std::vector<std::vector<uint8_t>> out(world);
  for (int r = 0; r < world; ++r) {
    const uint8_t* begin = all.data() + r * max_size;
    out[r].assign(begin, begin + sizes[r]);
  }
  return out;
}

std::vector<uint8_t> BroadcastBytes(Bootstrap& bootstrap, const std::vector<uint8_t>& blob,
                                    int root) {
  MORI_CHECK_ARG(root >= 0 && root < bootstrap.WorldSize(), "broadcast root ", root,
                 " out of range [0, ", bootstrap.WorldSize(), ")");
  uint64_t size = bootstrap.Rank() == root ? blob.size() : 0;
  bootstrap.Broadcast(&size, sizeof(size), root);
  std::vector<uint8_t> out(size);
  if (bootstrap.Rank() == root) out = blob;
  if (size > 0) bootstrap.Broadcast(out.data(), size, root);
  return out;
}

}  // namespace mori::bootstrap
