// SPDX-License-Identifier: MIT
// Copyright (c) 2026 The mori authors
#include "mori/proxy/proxy.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "backoff.hpp"
#include "heap_access.hpp"
#include "mori/core/env.hpp"
#include "mori/core/error.hpp"
#include "mori/core/logging.hpp"
#include "mori/core/timeout.hpp"
#include "mori/shmem/shmem.hpp"
#include "samehost_transports.hpp"
#include "shmem/local_group.hpp"
#include "tcp_transport.hpp"
#include "verbs_transport.hpp"

namespace mori::proxy {

const char* PathName(Path path) noexcept {
  switch (path) {
    case Path::kMapped:
      return "mapped";
    case Path::kCma:
      return "cma";
    case Path::kTcp:
      return "tcp";
    case Path::kVerbs:
      return "verbs";
  }
  return "unknown";
}

namespace {

using Clock = std::chrono::steady_clock;
using internal::HeapAccess;
using internal::PeerInfo;

// The notify value of the barrier Close() runs (user barriers count 1, 2, ...).
constexpr uint64_t kCloseNotify = uint64_t{1} << 63;
constexpr int kPopBatch = 32;
// CUDA heaps: a round's writes share one wait for their copies (the TCP sender's
// staging copies and the mapped copies, on one stream), so a round pops more of a queue.
constexpr int kPopBatchStaged = 256;

std::string HostIdentity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot_id);
  char ns[128] = {};
  ssize_t n = ::readlink("/proc/self/ns/pid", ns, sizeof(ns) - 1);
  return StrCat(host, "/", boot_id, "/", n > 0 ? std::string(ns, static_cast<size_t>(n)) : "");
}

std::string Encode(const PeerInfo& p) {
  std::ostringstream os;
  os << p.node << '\n'
     << p.host_id << '\n'
     << p.address << '\n'
     << p.port << '\n'
     << p.pid << '\n'
     << p.heap_base << '\n'
     << p.transport << '\n';
  return os.str();
}

PeerInfo Decode(const std::vector<uint8_t>& blob) {
  std::istringstream is(std::string(blob.begin(), blob.end()));
  PeerInfo p;
  std::getline(is, p.node);
  std::getline(is, p.host_id);
  std::getline(is, p.address);
  is >> p.port >> p.pid >> p.heap_base >> p.transport;
  return p;
}

}  // namespace

struct Proxy::Impl {
  std::shared_ptr<bootstrap::Bootstrap> boot;
  ProxyOptions opts;
  HeapAccess heap;
  std::vector<std::unique_ptr<CommandQueue>> queues;
  std::unique_ptr<internal::TcpTransport> tcp;
  std::unique_ptr<internal::MappedTransport> mapped;
  std::unique_ptr<internal::CmaTransport> cma;
  std::unique_ptr<internal::VerbsTransport> verbs;
  std::vector<Transport*> transports;  // each once, for Poll
  std::vector<Transport*> route;       // per pe
  std::vector<Path> paths;

  // Proxy-thread state.
  struct QueueState {
    bool blocked = false;  // a quiet or barrier waits
    uint64_t index = 0;    // of the command that blocks
    uint32_t op = 0;
    uint64_t pending_acks = 0;
    uint64_t epoch = 0;
    uint64_t served = 0;         // the commands below it were posted (Posted)
    uint64_t retired = 0;        // what this thread last published as retired
    std::vector<uint8_t> dirty;  // per pe: posted to since this queue's last quiet
  };
  std::vector<QueueState> qstate;
  std::map<uint64_t, int> fence_queue;  // token -> queue
  std::map<uint64_t, int> notifies;     // barrier epoch -> pes arrived
  uint64_t next_token = 1;
  uint64_t barrier_epoch = 0;
  bool closing = false;

  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> close_requested{false};
  std::atomic<bool> finished{false};  // the thread left its loop
  std::atomic<bool> closed{false};
  mutable std::mutex mu;
  std::string failure;  // guarded by mu

  std::atomic<uint64_t> commands{0};
  std::vector<std::atomic<uint64_t>> bytes_to_pe;
  std::atomic<uint64_t> bytes_by_path[4] = {};

  explicit Impl(int n) : bytes_to_pe(n) {}

  void Fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failure.empty()) failure = why;
    }
    // The queues first: a producer whose wait is timing out now sees the failure.
    for (auto& q : queues) q->Fail(why);
    MORI_LOG_ERROR(kCore, why);
  }

  std::string CommandText(int q, uint64_t index, const Command& c) const {
    return StrCat("proxy of pe ", heap.my_pe(), ": queue ", q, " command ", index, " (",
                  OpName(c.op), " to pe ", c.pe, ")");
  }

  void Validate(int q, uint64_t index, const Command& c) const {
    const uint32_t op = c.op;
    if (op < static_cast<uint32_t>(Op::kWrite) || op > static_cast<uint32_t>(Op::kBarrier)) {
      MORI_THROW(InvalidArgumentError, CommandText(q, index, c), ": unknown op ", op);
    }
    if (op == static_cast<uint32_t>(Op::kQuiet) || op == static_cast<uint32_t>(Op::kBarrier)) {
      return;
    }
    if (c.pe < 0 || c.pe >= heap.n_pes()) {
      MORI_THROW(InvalidArgumentError, CommandText(q, index, c), ": pe ", c.pe,
                 " out of range [0, ", heap.n_pes(), ")");
    }
    if (op == static_cast<uint32_t>(Op::kWrite) || op == static_cast<uint32_t>(Op::kWriteAdd)) {
      if (!heap.InHeap(c.dst_offset, c.nbytes) || !heap.InHeap(c.src_offset, c.nbytes)) {
        MORI_THROW(InvalidArgumentError, CommandText(q, index, c), ": ", c.nbytes,
                   " bytes from offset ", c.src_offset, " to offset ", c.dst_offset,
                   " do not fit the heap of ", heap.heap_size(), " bytes");
      }
    }
    if (op == static_cast<uint32_t>(Op::kAtomicAdd) || op == static_cast<uint32_t>(Op::kWriteAdd)) {
      if (c.signal_offset % 8 != 0 || !heap.InHeap(c.signal_offset, 8)) {
        MORI_THROW(InvalidArgumentError, CommandText(q, index, c), ": signal offset ",
                   c.signal_offset, " is not an 8-byte aligned word of the heap of ",
                   heap.heap_size(), " bytes");
      }
    }
  }

  void PostBarrier(uint64_t value) {
    mapped->Settle();
    for (int pe = 0; pe < heap.n_pes(); ++pe) {
      if (pe != heap.my_pe()) route[pe]->PostNotify(pe, value);
    }
  }

  bool Arrived(uint64_t value) {
    auto it = notifies.find(value);
    const int need = heap.n_pes() - 1;
    if (need == 0) return true;
    if (it == notifies.end() || it->second < need) return false;
    notifies.erase(it);
    return true;
  }

  // Names the pe a command is being posted to in the queue's control block for as
  // long as the post takes (a producer's timeout then names it). A post that fails
  // leaves the pe named: a producer timing out while the failure is being recorded
  // still names it.
  struct PostingGuard {
    PostingGuard(CommandQueue& q, const Command& c)
        : queue(q), exceptions(std::uncaught_exceptions()) {
      const bool to_pe =
          c.op != static_cast<uint32_t>(Op::kQuiet) && c.op != static_cast<uint32_t>(Op::kBarrier);
      if (to_pe) queue.SetPostingPe(c.pe);
    }
    PostingGuard(CommandQueue& q, int pe) : queue(q), exceptions(std::uncaught_exceptions()) {
      queue.SetPostingPe(pe);
    }
    ~PostingGuard() {
      if (std::uncaught_exceptions() == exceptions) queue.SetPostingPe(-1);
    }
    CommandQueue& queue;
    int exceptions;
  };

  // Consecutive writes of a queue to one other pe, each source and destination range
  // continuing the previous one's, are posted as one write: the same bytes land in
  // the same order relative to every other command (nothing else comes between), and
  // the ranges of two pes' heaps cannot overlap. One transfer instead of several.
  struct Coalesced {
    int pe = -1;
    uint64_t dst = 0, src = 0, nbytes = 0;
    uint64_t upto = 0;  // the commands below this index are in it (or posted before)
  };

  void PostCoalesced(int q, Coalesced* w) {
    if (w->pe < 0) return;
    {
      PostingGuard posting(*queues[q], w->pe);
      route[w->pe]->PostWrite(w->pe, w->dst, w->src, w->nbytes);
    }
    w->pe = -1;
    Posted(q, w->upto);
  }

  // The commands of queue q below `upto` were posted. A write's source may be reused
  // once the transports' Poll of its round returned (transport.hpp): on a CUDA heap
  // they retire then (RetireServed; the staging copies are waited for in Poll); on a
  // host heap every transport has read the source when PostWrite returns: at once.
  void Posted(int q, uint64_t upto) {
    QueueState& st = qstate[q];
    st.served = std::max(st.served, upto);
    if (!heap.cuda()) Retire(q, st.served);
  }
  void RetireServed(int q) { Retire(q, qstate[q].served); }
  // Retire calls stay increasing (a quiet or barrier retires past the commands before it).
  void Retire(int q, uint64_t upto) {
    QueueState& st = qstate[q];
    if (upto <= st.retired) return;
    st.retired = upto;
    queues[q]->Retire(upto);
  }

  // Pops and posts a batch from queue q; true when anything happened.
  bool Serve(int q) {
    CommandQueue& queue = *queues[q];
    QueueState& st = qstate[q];
    if (st.blocked) {
      bool done =
          st.op == static_cast<uint32_t>(Op::kQuiet) ? st.pending_acks == 0 : Arrived(st.epoch);
      if (!done) return false;
      st.blocked = false;
      Retire(q, st.index + 1);
    }
    bool progress = false;
    Command c;
    Coalesced w;
    const int batch = heap.cuda() ? kPopBatchStaged : kPopBatch;
    for (int k = 0; k < batch && queue.TryPop(&c); ++k) {
      progress = true;
      const uint64_t index = queue.popped() - 1;
      commands.fetch_add(1, std::memory_order_relaxed);
      Validate(q, index, c);
      const bool write =
          c.op == static_cast<uint32_t>(Op::kWrite) || c.op == static_cast<uint32_t>(Op::kWriteAdd);
      if (write && c.pe == w.pe && c.pe != heap.my_pe() && c.dst_offset == w.dst + w.nbytes &&
          c.src_offset == w.src + w.nbytes) {
        w.nbytes += c.nbytes;
      } else {
        PostCoalesced(q, &w);  // before anything else is posted
        if (write) w = Coalesced{c.pe, c.dst_offset, c.src_offset, c.nbytes, index};
      }
      if (c.op == static_cast<uint32_t>(Op::kWrite)) w.upto = index + 1;
      if (c.op == static_cast<uint32_t>(Op::kWriteAdd)) PostCoalesced(q, &w);  // before its add
      PostingGuard posting(queue, c);
      switch (static_cast<Op>(c.op)) {
        case Op::kWrite:
        case Op::kWriteAdd:
          bytes_to_pe[c.pe].fetch_add(c.nbytes, std::memory_order_relaxed);
          bytes_by_path[static_cast<int>(paths[c.pe])].fetch_add(c.nbytes,
                                                                 std::memory_order_relaxed);
          if (c.op == static_cast<uint32_t>(Op::kWriteAdd)) {
            route[c.pe]->PostAtomicAdd(c.pe, c.signal_offset, c.value);
            Posted(q, index + 1);
          }
          st.dirty[c.pe] = 1;
          break;
        case Op::kAtomicAdd:
          route[c.pe]->PostAtomicAdd(c.pe, c.signal_offset, c.value);
          st.dirty[c.pe] = 1;
          Posted(q, index + 1);
          break;
        case Op::kQuiet:
          st.pending_acks = 0;
          for (int pe = 0; pe < heap.n_pes(); ++pe) {
            if (!st.dirty[pe]) continue;
            st.dirty[pe] = 0;
            const uint64_t token = next_token++;
            fence_queue[token] = q;
            ++st.pending_acks;
            route[pe]->PostFence(pe, token);
          }
          st.blocked = true;
          st.index = index;
          st.op = c.op;
          return true;
        case Op::kBarrier:
          st.epoch = ++barrier_epoch;
          PostBarrier(st.epoch);
          st.blocked = true;
          st.index = index;
          st.op = c.op;
          return true;
        default:
          break;
      }
    }
    PostCoalesced(q, &w);
    return progress;
  }

  void Handle(const Completion& c) {
    if (c.kind == Completion::Kind::kFenceAck) {
      auto it = fence_queue.find(c.value);
      if (it == fence_queue.end()) return;
      --qstate[it->second].pending_acks;
      fence_queue.erase(it);
    } else {
      ++notifies[c.value];
    }
  }

  bool Idle() const {
    for (const auto& st : qstate)
      if (st.blocked) return false;
    return true;
  }

  void Run() {
    std::vector<Completion> done;
    internal::Backoff idle;
    try {
      while (!stop.load(std::memory_order_relaxed)) {
        bool progress = false;
        for (int q = 0; q < static_cast<int>(queues.size()); ++q) progress |= Serve(q);
        done.clear();
        for (Transport* t : transports) t->Poll(&done);
        if (heap.cuda()) {
          for (int q = 0; q < static_cast<int>(queues.size()); ++q) RetireServed(q);
        }
        for (const Completion& c : done) Handle(c);
        progress |= !done.empty();
        if (close_requested.load(std::memory_order_acquire) && !progress && Idle()) {
          if (!closing) {
            // Everything popped so far has been posted; the streams are in order, so a
            // peer's close notify means its commands to this pe have landed.
            closing = true;
            PostBarrier(kCloseNotify);
          }
          if (Arrived(kCloseNotify)) {
            for (Transport* t : transports) t->Shutdown();
            for (auto& q : queues) q->MarkClosed();
            closed.store(true);
            break;
          }
        }
        if (progress) {
          idle.Reset();
        } else {
          idle.Pause();
        }
      }
    } catch (const std::exception& e) {
      Fail(e.what());
    }
    finished.store(true, std::memory_order_release);
  }
};

Proxy::Proxy(std::shared_ptr<bootstrap::Bootstrap> bootstrap, const ProxyOptions& options) {
  MORI_CHECK_ARG(bootstrap != nullptr, "proxy: bootstrap is null");
  if (!shmem::Initialized()) {
    MORI_THROW(InvalidStateError, "proxy: mori::shmem is not initialized on this process");
  }
  const int me = shmem::MyPe();
  const int n = shmem::NPes();
  if (bootstrap->Rank() != me || bootstrap->WorldSize() != n) {
    MORI_THROW(InvalidArgumentError, "proxy: the bootstrap's rank ", bootstrap->Rank(), " of ",
               bootstrap->WorldSize(), " is not shmem's pe ", me, " of ", n);
  }
  MORI_CHECK_ARG(options.num_queues >= 1 && options.num_queues <= 1024, "proxy: num_queues ",
                 options.num_queues, " outside [1, 1024]");
  impl_ = std::make_unique<Impl>(n);
  Impl& s = *impl_;
  s.boot = bootstrap;
  s.opts = options;
  s.opts.timeout = CheckedTimeout(options.timeout, "proxy timeout");
  if (s.opts.queue_capacity == 0) {
    s.opts.queue_capacity = env::Size("MORI_PROXY_QUEUE_CAPACITY", 1024, 2, uint64_t{1} << 30);
  }
  if (s.opts.transport == TransportChoice::kAuto) {
    const std::string t = env::String("MORI_PROXY_TRANSPORT", "auto");
    if (t == "tcp") {
      s.opts.transport = TransportChoice::kTcp;
    } else if (t == "verbs") {
      s.opts.transport = TransportChoice::kVerbs;
    } else if (t != "auto") {
      MORI_THROW(InvalidArgumentError, "MORI_PROXY_TRANSPORT='", t,
                 "': expected auto, tcp or verbs");
    }
  }
  if (s.opts.advertise_host.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    s.opts.advertise_host = env::String("MORI_PROXY_HOST", host);
  }
  const shmem::DeviceContext ctx = shmem::GetDeviceContext();
  const shmem::HeapInfo info = shmem::GetHeapInfo();
  s.heap = HeapAccess(me, n, ctx.my_base, ctx.heap_size, info.kind == shmem::MemoryKind::kCuda,
                      info.device);

  // A session tag drawn by pe 0 keeps another job's connection out.
  uint64_t session = 0;
  if (me == 0) {
    std::random_device rd;
    session = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  }
  bootstrap->Broadcast(&session, sizeof(session), 0);

  internal::TcpOptions topts;
  topts.timeout_ms = static_cast<int>(std::min<int64_t>(s.opts.timeout.count(), INT32_MAX));
  topts.session = session;
  s.tcp = std::make_unique<internal::TcpTransport>(&s.heap, topts);

  PeerInfo mine;
  mine.node = shmem::internal::NodeKey();
  mine.host_id = HostIdentity();
  mine.address = s.opts.advertise_host;
  mine.port = s.tcp->port();
  mine.pid = ::getpid();
  mine.heap_base = reinterpret_cast<uint64_t>(ctx.my_base);
  mine.transport = static_cast<int>(s.opts.transport);
  const std::string blob = Encode(mine);
  auto all = bootstrap::AllGatherBytes(*bootstrap, std::vector<uint8_t>(blob.begin(), blob.end()));
  for (int pe = 0; pe < n; ++pe) s.heap.peers().push_back(Decode(all[pe]));
  for (int pe = 0; pe < n; ++pe) {
    const bool verbs_there =
        s.heap.peers()[pe].transport == static_cast<int>(TransportChoice::kVerbs);
    if (verbs_there != (s.opts.transport == TransportChoice::kVerbs)) {
      MORI_THROW(InvalidArgumentError, "proxy of pe ", me, ": pe ", pe,
                 verbs_there ? " chose" : " did not choose", " the verbs transport and pe ", me,
                 verbs_there ? " did not" : " did",
                 " (MORI_PROXY_TRANSPORT=verbs / transport='verbs' must be the same on every pe)");
    }
  }
  s.tcp->Connect(*bootstrap);
  if (s.opts.transport == TransportChoice::kVerbs) {
    // Every pe outside this pe's local group is reached over RDMA. A pe that cannot
    // open a port says why in the collective Connect, and every pe fails with it.
    std::vector<uint8_t> use(n, 0);
    int remote = 0;
    for (int pe = 0; pe < n; ++pe) {
      use[pe] = shmem::Ptr(ctx.my_base, pe) == nullptr;
      remote += use[pe];
    }
    internal::VerbsOptions vo;
    vo.timeout_ms = topts.timeout_ms;
    std::unique_ptr<transport::verbs::RdmaPort> port;
    std::string why;
    try {
      transport::verbs::RdmaPortOptions po;
      po.device = env::String("MORI_PROXY_IB_DEVICE", "");
      po.gpu_index = s.heap.cuda() ? info.device : -1;
      po.cq_depth = std::max(4096, internal::VerbsTransport::CqEntriesNeeded(remote, vo));
      port = transport::verbs::OpenRdmaPort(po);
    } catch (const std::exception& e) {
      why = e.what();
    }
    s.verbs = std::make_unique<internal::VerbsTransport>(&s.heap, std::move(port), why, vo);
    s.verbs->Connect(*bootstrap, use);
  }

  s.mapped = std::make_unique<internal::MappedTransport>(&s.heap, s.tcp.get());
  s.cma = std::make_unique<internal::CmaTransport>(&s.heap, s.tcp.get());
  s.transports = {s.tcp.get(), s.mapped.get()};
  if (s.verbs) s.transports.push_back(s.verbs.get());
  s.route.assign(n, nullptr);
  s.paths.assign(n, Path::kTcp);
  for (int pe = 0; pe < n; ++pe) {
    std::string why;
    if (shmem::Ptr(ctx.my_base, pe) != nullptr) {
      s.paths[pe] = Path::kMapped;
      s.route[pe] = s.mapped.get();
    } else if (s.verbs) {
      s.paths[pe] = Path::kVerbs;
      s.route[pe] = s.verbs.get();
    } else if (s.opts.transport == TransportChoice::kAuto && !s.heap.cuda() &&
               s.heap.peers()[pe].host_id == mine.host_id &&
               internal::CmaTransport::Probe(s.heap, pe, &why)) {
      s.paths[pe] = Path::kCma;
      s.route[pe] = s.cma.get();
    } else {
      s.route[pe] = s.tcp.get();
      if (!why.empty()) {
        MORI_LOG_INFO(kCore, "proxy of pe ", me, ": ", s.heap.PeName(pe),
                      " is on this host but CMA is refused (", why, "): TCP instead");
      }
    }
  }

  for (int q = 0; q < options.num_queues; ++q) {
    QueueOptions qo;
    qo.capacity = s.opts.queue_capacity;
    qo.producer = options.producer;
    qo.device = info.device;
    qo.timeout = s.opts.timeout;
    qo.queue_id = q;
    qo.my_pe = me;
    qo.n_pes = n;
    s.queues.push_back(std::make_unique<CommandQueue>(qo));
    Impl::QueueState st;
    st.dirty.assign(n, 0);
    s.qstate.push_back(std::move(st));
  }
  bootstrap->Barrier();
  s.thread = std::thread([&s] { s.Run(); });
}

Proxy::~Proxy() {
  if (!impl_) return;
  impl_->stop.store(true);
  if (impl_->thread.joinable()) impl_->thread.join();
}

void Proxy::Close() {
  Impl& s = *impl_;
  if (s.closed.load()) return;
  s.close_requested.store(true, std::memory_order_release);
  // The close barrier and the goodbyes are each bounded by the timeout.
  const auto deadline = Clock::now() + 3 * s.opts.timeout;
  while (!s.finished.load(std::memory_order_acquire) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!s.finished.load()) {
    s.stop.store(true);
    if (s.thread.joinable()) s.thread.join();
    s.Fail(StrCat("proxy of pe ", s.heap.my_pe(), ": close did not complete within ",
                  3 * s.opts.timeout.count(), " ms (a peer never reached its close)"));
  }
  if (s.thread.joinable()) s.thread.join();
  CheckHealth();
}

int Proxy::num_queues() const { return static_cast<int>(impl_->queues.size()); }
int Proxy::my_pe() const { return impl_->heap.my_pe(); }
int Proxy::n_pes() const { return impl_->heap.n_pes(); }

QueueView Proxy::HostQueue(int queue) const {
  MORI_CHECK_ARG(queue >= 0 && queue < num_queues(), "proxy: queue ", queue, " out of range [0, ",
                 num_queues(), ")");
  return impl_->queues[queue]->HostView();
}

QueueView Proxy::DeviceQueue(int queue) const {
  MORI_CHECK_ARG(queue >= 0 && queue < num_queues(), "proxy: queue ", queue, " out of range [0, ",
                 num_queues(), ")");
  return impl_->queues[queue]->DeviceView();
}

void Proxy::WaitRetired(int queue, uint64_t upto) const {
  MORI_CHECK_ARG(queue >= 0 && queue < num_queues(), "proxy: queue ", queue, " out of range [0, ",
                 num_queues(), ")");
  impl_->queues[queue]->WaitRetiredFromHost(upto);
}

Path Proxy::PathTo(int pe) const {
  MORI_CHECK_ARG(pe >= 0 && pe < n_pes(), "proxy: pe ", pe, " out of range [0, ", n_pes(), ")");
  return impl_->paths[pe];
}

std::string Proxy::NodeOf(int pe) const {
  MORI_CHECK_ARG(pe >= 0 && pe < n_pes(), "proxy: pe ", pe, " out of range [0, ", n_pes(), ")");
  return impl_->heap.peers()[pe].node;
}

void Proxy::CheckHealth() const {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    why = impl_->failure;
  }
  if (!why.empty()) MORI_THROW(TransportError, why);
}

ProxyStats Proxy::Stats() const {
  ProxyStats st;
  st.commands = impl_->commands.load();
  for (auto& b : impl_->bytes_to_pe) st.bytes_to_pe.push_back(b.load());
  for (auto& b : impl_->bytes_by_path) st.bytes_by_path.push_back(b.load());
  st.lane_waits = impl_->tcp->LaneWaits();
  return st;
}

}  // namespace mori::proxy
