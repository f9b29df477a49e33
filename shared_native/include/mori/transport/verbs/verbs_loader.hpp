// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#pragma once

// libibverbs, loaded with dlopen so that libmori_core and the extensions import (and
// every other backend works) on machines without rdma-core. Nothing in mori may call
// an ibv_* function by name: no library may carry an undefined ibv_* symbol. The
// static inline verbs of <infiniband/verbs.h> that only go through the context's ops
// (ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq) are fine.

#include <string>
#include <vector>

#include "mori/core/macros.hpp"
#include "mori/core/version.hpp"

#if MORI_CORE_WITH_VERBS
#include <infiniband/verbs.h>
#endif

namespace mori::transport::verbs {

// "libibverbs.so.1", or MORI_IO_IBVERBS_LIB when set (a test points it at a missing
// file or at a library that lacks the verbs).
MORI_API std::string VerbsLibraryPath();

// The exported symbols the transport resolves; all are required except those
// OptionalVerbsSymbols lists.
MORI_API const std::vector<std::string>& RequiredVerbsSymbols();
MORI_API const std::vector<std::string>& OptionalVerbsSymbols();

struct VerbsLoadReport {
  bool ok = false;
  std::string path;
  std::string reason;                 // what was found, or why it cannot be used
  std::vector<std::string> missing;   // required symbols the library lacks
  std::vector<std::string> optional;  // optional symbols it has
};

// Loads `path`, resolves every symbol, unloads it again: a probe with no lasting
// effect, for diagnostics and tests. Never throws.
MORI_API VerbsLoadReport TryLoadVerbs(const std::string& path);

#if MORI_CORE_WITH_VERBS
// The resolved entry points. `reg_mr_iova2` may be null (rdma-core before v22);
// `reg_mr` is the exported ibv_reg_mr (the header's ibv_reg_mr is a macro).
struct VerbsApi {
  decltype(&::ibv_get_device_list) get_device_list;
  decltype(&::ibv_free_device_list) free_device_list;
  decltype(&::ibv_get_device_name) get_device_name;
  decltype(&::ibv_open_device) open_device;
  decltype(&::ibv_close_device) close_device;
  decltype(&::ibv_query_device) query_device;
  // The exported ibv_query_port takes the old (compat) attribute layout; QueryPort
  // in verbs_objects.cpp prefers the context's extended op.
  decltype(&::ibv_query_port) query_port;
  decltype(&::ibv_query_gid) query_gid;
  decltype(&::ibv_alloc_pd) alloc_pd;
  decltype(&::ibv_dealloc_pd) dealloc_pd;
  decltype(&::ibv_reg_mr) reg_mr;
  decltype(&::ibv_reg_mr_iova2) reg_mr_iova2;
  decltype(&::ibv_dereg_mr) dereg_mr;
  decltype(&::ibv_create_comp_channel) create_comp_channel;
  decltype(&::ibv_destroy_comp_channel) destroy_comp_channel;
  decltype(&::ibv_create_cq) create_cq;
  decltype(&::ibv_destroy_cq) destroy_cq;
  decltype(&::ibv_get_cq_event) get_cq_event;
  decltype(&::ibv_ack_cq_events) ack_cq_events;
  decltype(&::ibv_create_qp) create_qp;
  decltype(&::ibv_modify_qp) modify_qp;
  decltype(&::ibv_destroy_qp) destroy_qp;
  decltype(&::ibv_wc_status_str) wc_status_str;
};

// The process-wide table, loaded on the first call (thread-safe, once per process;
// the library then stays loaded). nullptr when unavailable, with *reason set.
MORI_API const VerbsApi* Verbs(std::string* reason);
#endif

}  // namespace mori::transport::verbs
