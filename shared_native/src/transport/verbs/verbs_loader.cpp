// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/transport/verbs/verbs_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "mori/core/env.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/str.hpp"

namespace mori::transport::verbs {
namespace {

// The order matches the members of VerbsApi after `reg_mr` (see FillApi).
const std::vector<std::string> kRequired = {
    "ibv_get_device_list",
    "ibv_free_device_list",
    "ibv_get_device_name",
    "ibv_open_device",
    "ibv_close_device",
    "ibv_query_device",
    "ibv_query_port",
    "ibv_query_gid",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_reg_mr",
    "ibv_dereg_mr",
    "ibv_create_comp_channel",
    "ibv_destroy_comp_channel",
    "ibv_create_cq",
    "ibv_destroy_cq",
    "ibv_get_cq_event",
    "ibv_ack_cq_events",
    "ibv_create_qp",
    "ibv_modify_qp",
    "ibv_destroy_qp",
    "ibv_wc_status_str",
};
const std::vector<std::string> kOptional = {"ibv_reg_mr_iova2"};

struct Loaded {
  void* handle = nullptr;
  VerbsLoadReport report;
};

// Opens and resolves; keeps the handle open (the caller decides to close it).
Loaded Load(const std::string& path) {
  Loaded l;
  l.report.path = path;
  ::dlerror();
  l.handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (l.handle == nullptr) {
    const char* why = ::dlerror();
    l.report.reason = StrCat(path, " cannot be loaded: ", why ? why : "unknown dlopen error");
    return l;
  }
  for (const std::string& name : kRequired) {
    if (::dlsym(l.handle, name.c_str()) == nullptr) l.report.missing.push_back(name);
  }
  for (const std::string& name : kOptional) {
    if (::dlsym(l.handle, name.c_str()) != nullptr) l.report.optional.push_back(name);
  }
  if (!l.report.missing.empty()) {
    std::string names;
    for (const std::string& n : l.report.missing) names += (names.empty() ? "" : ", ") + n;
    l.report.reason = StrCat(path, " lacks ", l.report.missing.size(), " of ", kRequired.size(),
                             " ibverbs symbols: ", names);
    return l;
  }
  l.report.ok = true;
  l.report.reason = StrCat(path, " loaded");
  return l;
}

}  // namespace

std::string VerbsLibraryPath() { return env::String("MORI_IO_IBVERBS_LIB", "libibverbs.so.1"); }

const std::vector<std::string>& RequiredVerbsSymbols() { return kRequired; }
const std::vector<std::string>& OptionalVerbsSymbols() { return kOptional; }

VerbsLoadReport TryLoadVerbs(const std::string& path) {
  Loaded l = Load(path);
  if (l.handle != nullptr) ::dlclose(l.handle);
  return l.report;
}

#if MORI_CORE_WITH_VERBS
namespace {

template <typename Fn>
void Resolve(void* handle, const char* name, Fn* out) {
  *out = reinterpret_cast<Fn>(::dlsym(handle, name));
}

struct Process {
  VerbsApi api{};
  bool ok = false;
  std::string reason;
};

Process LoadProcessWide() {
  Process p;
  Loaded l = Load(VerbsLibraryPath());
  p.reason = l.report.reason;
  if (!l.report.ok) {
    if (l.handle != nullptr) ::dlclose(l.handle);
    MORI_LOG_DEBUG(kCore, "rdma: ", p.reason);
    return p;
  }
  void* h = l.handle;  // stays loaded for the life of the process
  VerbsApi& a = p.api;
  Resolve(h, "ibv_get_device_list", &a.get_device_list);
  Resolve(h, "ibv_free_device_list", &a.free_device_list);
  Resolve(h, "ibv_get_device_name", &a.get_device_name);
  Resolve(h, "ibv_open_device", &a.open_device);
  Resolve(h, "ibv_close_device", &a.close_device);
  Resolve(h, "ibv_query_device", &a.query_device);
  Resolve(h, "ibv_query_port", &a.query_port);
  Resolve(h, "ibv_query_gid", &a.query_gid);
  Resolve(h, "ibv_alloc_pd", &a.alloc_pd);
  Resolve(h, "ibv_dealloc_pd", &a.dealloc_pd);
  Resolve(h, "ibv_reg_mr", &a.reg_mr);
  Resolve(h, "ibv_reg_mr_iova2", &a.reg_mr_iova2);
  Resolve(h, "ibv_dereg_mr", &a.dereg_mr);
  Resolve(h, "ibv_create_comp_channel", &a.create_comp_channel);
  Resolve(h, "ibv_destroy_comp_channel", &a.destroy_comp_channel);
  Resolve(h, "ibv_create_cq", &a.create_cq);
  Resolve(h, "ibv_destroy_cq", &a.destroy_cq);
  Resolve(h, "ibv_get_cq_event", &a.get_cq_event);
  Resolve(h, "ibv_ack_cq_events", &a.ack_cq_events);
  Resolve(h, "ibv_create_qp", &a.create_qp);
  Resolve(h, "ibv_modify_qp", &a.modify_qp);
  Resolve(h, "ibv_destroy_qp", &a.destroy_qp);
  Resolve(h, "ibv_wc_status_str", &a.wc_status_str);
  p.ok = true;
  MORI_LOG_DEBUG(kCore, "rdma: ", p.reason,
                 l.report.optional.empty() ? "" : " (with ibv_reg_mr_iova2)");
  return p;
}

}  // namespace

const VerbsApi* Verbs(std::string* reason) {
  static std::once_flag once;
  static Process* process = nullptr;  // never freed: the verbs outlive static destructors
  std::call_once(once, [] { process = new Process(LoadProcessWide()); });
  if (!process->ok) {
    if (reason != nullptr) *reason = process->reason;
    return nullptr;
  }
  if (reason != nullptr) *reason = process->reason;
  return &process->api;
}
#endif

}  // namespace mori::transport::verbs
