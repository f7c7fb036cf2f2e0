// UcxTransport: Transport over UCX UCP tagged messages (see ucx_transport.hpp).
//
// Follows the UCP programming model: ucp_tag_send_nbx / ucp_tag_recv_nbx with
// a completion callback, progress driven by ucp_worker_progress, blocking via
// ucp_worker_arm + the worker's event fd (UCP "wakeup" feature).
// Cost per message: one UCX request, one small record from a free list (no
// allocation in steady state). Eager below UCX's rendezvous threshold, zero
// copy (CMA / RDMA) above it. wait() spins for spin_us, yields until
// yield_us, then sleeps on the event fd, so idle ranks leave the cores to
// the ranks that have work (8 ranks on 2 cores still make progress).
#include "ucx_transport.hpp"

#include <poll.h>
#include <sched.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <initializer_list>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace cclz::detail {

// ------------------------------------------------------------ context registry

namespace {

// The process-wide UCP context, shared by every transport and released with
// the last one. A child made by fork() must not use its parent's context, so
// the owning pid is kept and a foreign context is abandoned (never cleaned
// up: its resources belong to the parent).
struct ContextRegistry {
  std::mutex mu;
  ucp_context_h context = nullptr;
  int refs = 0;
  pid_t pid = 0;
};

ContextRegistry& context_registry() {
  static ContextRegistry r;
  return r;
}

// Sets a UCX option unless the user chose it (or any of `user_names`)
// through the environment.
void default_option(ucp_config_t* cfg, const char* name, const char* value,
                    std::initializer_list<const char*> user_names = {}) {
  for (const char* n : user_names) {
    if (std::getenv((std::string("UCX_") + n).c_str()) != nullptr) return;
  }
  if (std::getenv((std::string("UCX_") + name).c_str()) != nullptr) return;
  (void)ucp_config_modify(cfg, name, value);  // unknown in some UCX builds: harmless
}

// Whether UCX_TLS (unset: everything) can select a transport named in
// `names`; options for transports it excludes only make UCX warn.
bool tls_may_include(std::initializer_list<std::string_view> names) {
  const char* env = std::getenv("UCX_TLS");
  if (env == nullptr || *env == '\0') return true;
  std::string_view list = env;
  const bool negate = list.front() == '^';
  if (negate) list.remove_prefix(1);
  bool listed = false;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    std::string_view tok = list.substr(0, comma);
    if (const std::size_t colon = tok.find(':'); colon != std::string_view::npos) tok = tok.substr(0, colon);
    for (std::string_view n : names) listed = listed || tok == n;
    if (tok == "all") listed = listed || !negate;
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  return negate ? !listed : listed;
}

Status acquire_context(ucp_context_h* out) {
  ContextRegistry& r = context_registry();
  std::lock_guard lk(r.mu);
  if (r.context != nullptr && r.pid != getpid()) {
    r.context = nullptr;
    r.refs = 0;
  }
  if (r.context == nullptr) {
    ucp_config_t* cfg = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &cfg);
    if (s != UCS_OK) return {Result::system_error, std::string("ucp_config_read: ") + ucs_status_string(s)};
    // Shared memory is only selected for endpoints with peer error handling
    // when the shm transports may report peer failure; without this, ranks
    // on one host would fall back to TCP loopback.
    // The key is the shared-memory base table's ("MM_"), which is how UCX
    // matches it inside the posix/sysv iface configs; the per-transport
    // environment names still win.
    if (tls_may_include({"sm", "shm", "mm", "posix", "sysv"})) {
      default_option(cfg, "MM_ERROR_HANDLING", "y", {"POSIX_ERROR_HANDLING", "SYSV_ERROR_HANDLING"});
    }
    // Likewise UCX only uses CMA (single-copy rendezvous between processes)
    // under peer error handling if the CMA domain claims memory invalidation.
    // CMA rendezvous is a GET by the receiver from the sender's pages, so
    // what invalidation would guard is a receiver that outlives a failed
    // send reading a released buffer; that operation has already failed on
    // the sending side. Measured on 2 cores: 4 MB ping-pong 2x faster.
    if (tls_may_include({"sm", "shm", "cma"})) {
      default_option(cfg, "MEMORY_INVALIDATE", "y", {"CMA_MEMORY_INVALIDATE"});  // only CMA has it
    }
    // UCX's 20 s default would leave a dead peer unnoticed for most of a
    // typical CCLZ_TIMEOUT; a keepalive every second is cheap.
    default_option(cfg, "KEEPALIVE_INTERVAL", "1s");
    ucp_params_t p{};
    p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
    // AM carries one control message: the goodbye a transport sends its
    // peers when it is torn down (see say_goodbye_and_close).
    p.features = UCP_FEATURE_TAG | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    p.mt_workers_shared = 1;  // workers of different communicators may progress on different threads
    p.name = "cclz";
    ucp_context_h ctx = nullptr;
    s = ucp_init(&p, cfg, &ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) return {Result::system_error, std::string("ucp_init: ") + ucs_status_string(s)};
    r.context = ctx;
    r.pid = getpid();
    r.refs = 0;
  }
  ++r.refs;
  *out = r.context;
  return {};
}

void release_context(ucp_context_h ctx) {
  ContextRegistry& r = context_registry();
  std::lock_guard lk(r.mu);
  if (ctx != r.context || r.pid != getpid()) return;  // inherited across fork: leave it
  if (--r.refs == 0) {
    ucp_cleanup(r.context);
    r.context = nullptr;
  }
}

// Communicators get here only after config_from_env accepted these values;
// a transport made directly (the transport tests) falls back on bad ones.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (end == v || x < 0 || x > 1000000000) return fallback;
  return static_cast<int>(x);
}

}  // namespace

UcxWaitPolicy UcxWaitPolicy::from_env() {
  UcxWaitPolicy p;
  p.spin_us = env_int("CCLZ_SPIN_US", p.spin_us);
  p.yield_us = env_int("CCLZ_YIELD_US", p.yield_us);
  p.poll_ms = std::max(1, env_int("CCLZ_POLL_MS", p.poll_ms));
  return p;
}

// ------------------------------------------------------------ records

struct UcxTransport::Pending {
  UcxTransport* owner = nullptr;
  Op* op = nullptr;          // null once detached (cancelled / failed): the callback must not touch it
  void* request = nullptr;   // the UCX request while in flight
  Pending* next_free = nullptr;
  int peer = -1;
  bool is_send = false;
  bool in_use = false;
  bool posting = false;      // inside ucp_tag_*_nbx: a completion now is inline
  bool inline_done = false;  // completed during posting; the poster reaps it
  std::size_t bytes = 0;
};

struct UcxTransport::Peer {
  UcxTransport* owner = nullptr;
  int rank = -1;
  ucp_ep_h ep = nullptr;
  ucs_status_t error = UCS_OK;  // set by the endpoint error callback
  Clock::time_point error_at{};
  int inflight = 0;             // requests with this peer UCX still holds
  bool departed = false;        // its goodbye arrived (transport destroyed or aborted)
  Clock::time_point departed_at{};
};

namespace {
constexpr std::size_t kPendingChunk = 64;
constexpr unsigned kGoodbyeAmId = 0x7cc1;
constexpr std::uint32_t kGoodbyeMagic = 0x5a4c4347;  // "GCLZ"
// What a peer sent before it failed or left may still be queued here
// (a goodbye can even overtake the last messages on another lane): ops with
// such a peer fail only after this long of progress.
constexpr auto kPeerGrace = std::chrono::milliseconds(100);
// Bound on each teardown phase (flush, close) so dead peers cannot hang us.
constexpr auto kTeardownBound = std::chrono::milliseconds(1000);
constexpr std::uint64_t kTagMask = (std::uint64_t{1} << Transport::kTagBits) - 1;

bool is_peer_failure(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
      return true;
    default:
      return false;
  }
}

Status peer_failed(int peer, ucs_status_t s) {
  return {Result::remote_error,
          "rank " + std::to_string(peer) + " failed or disconnected (" + ucs_status_string(s) + ")"};
}

std::string size_string(std::size_t b) { return std::to_string(b) + " B"; }
}  // namespace

// ------------------------------------------------------------ life cycle

UcxTransport::UcxTransport(int rank, int size) : rank_(rank), size_(size), policy_(UcxWaitPolicy::from_env()) {}

Status UcxTransport::create(int rank, int size, std::unique_ptr<UcxTransport>* out) {
  if (size < 1 || size > kMaxRanks) {
    return {Result::invalid_argument, "ucx transport supports 1.." + std::to_string(kMaxRanks) + " ranks, not " +
                                          std::to_string(size)};
  }
  if (rank < 0 || rank >= size) {
    return {Result::invalid_argument, "rank " + std::to_string(rank) + " out of range for " + std::to_string(size) +
                                          " ranks"};
  }
  std::unique_ptr<UcxTransport> t(new UcxTransport(rank, size));
  if (Status st = t->init_worker(); !st.ok()) return st;
  *out = std::move(t);
  return {};
}

Status UcxTransport::init_worker() {
  // Peer records exist before connect(): a fast peer's goodbye may arrive
  // before this rank has made its endpoints.
  for (int r = 0; r < size_; ++r) {
    auto peer = std::make_unique<Peer>();
    peer->owner = this;
    peer->rank = r;
    peers_.push_back(std::move(peer));
  }
  if (Status st = acquire_context(&context_); !st.ok()) return st;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // The owning communicator serialises calls; fail() only uses
  // ucp_worker_signal, which UCX allows from any thread.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t s = ucp_worker_create(context_, &wp, &worker_);
  if (s != UCS_OK) {
    worker_ = nullptr;
    return {Result::system_error, std::string("ucp_worker_create: ") + ucs_status_string(s)};
  }
  ucp_am_handler_param_t am{};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kGoodbyeAmId;
  am.cb = &UcxTransport::on_goodbye;
  am.arg = this;
  s = ucp_worker_set_am_recv_handler(worker_, &am);
  if (s != UCS_OK) return {Result::system_error, std::string("ucp_worker_set_am_recv_handler: ") + ucs_status_string(s)};
  s = ucp_worker_get_efd(worker_, &event_fd_);
  if (s != UCS_OK) return {Result::system_error, std::string("ucp_worker_get_efd: ") + ucs_status_string(s)};
  ucp_address_t* addr = nullptr;
  std::size_t len = 0;
  s = ucp_worker_get_address(worker_, &addr, &len);
  if (s != UCS_OK) return {Result::system_error, std::string("ucp_worker_get_address: ") + ucs_status_string(s)};
  const auto* b = reinterpret_cast<const std::byte*>(addr);
  address_.assign(b, b + len);
  ucp_worker_release_address(worker_, addr);
  return {};
}

Status UcxTransport::connect(const std::vector<std::vector<std::byte>>& addresses) {
  if (connected_) return {Result::invalid_usage, "ucx transport already connected"};
  if (addresses.size() != static_cast<std::size_t>(size_)) {
    return {Result::internal_error, "connect: " + std::to_string(addresses.size()) + " addresses for " +
                                        std::to_string(size_) + " ranks"};
  }
  for (int r = 0; r < size_; ++r) {
    Peer* peer = peers_[static_cast<std::size_t>(r)].get();
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(addresses[static_cast<std::size_t>(r)].data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxTransport::on_ep_error;
    ep.err_handler.arg = peer;
    const ucs_status_t s = ucp_ep_create(worker_, &ep, &peer->ep);
    if (s != UCS_OK) {
      // Most often the peer already left (its shared memory is gone): treat
      // it as a failed peer, so ops with it fail, rather than failing the
      // whole communicator here.
      peer->ep = nullptr;
      peer->error = s;
      peer->error_at = Clock::now();
    }
  }
  connected_ = true;
  return {};
}

UcxTransport::~UcxTransport() {
  if (worker_ != nullptr) {
    // Ops may already be gone: detach every in-flight request from its op
    // before anything can complete it, then cancel what UCX lets us cancel.
    for (auto& chunk : pending_chunks_) {
      for (std::size_t i = 0; i < kPendingChunk; ++i) {
        Pending& p = chunk[i];
        if (!p.in_use) continue;
        p.op = nullptr;
        if (p.request != nullptr) ucp_request_cancel(worker_, p.request);
      }
    }
    say_goodbye_and_close();
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
  }
  if (context_ != nullptr) release_context(context_);
}

// Teardown: tell every live peer we are leaving (so a peer waiting on us
// fails at once instead of at its deadline: shared memory has no connection
// to break), flush what we sent to peers with nothing outstanding, then
// force-close every endpoint. Each phase is bounded, so dead peers cannot
// hang it, and forced closes purge requests UCX could not cancel.
void UcxTransport::say_goodbye_and_close() {
  auto drive = [&](std::vector<void*>& reqs) {
    const auto until = Clock::now() + kTeardownBound;
    auto pending = [&] {
      for (void* r : reqs) {
        if (ucp_request_check_status(r) == UCS_INPROGRESS) return true;
      }
      return false;
    };
    while (pending() && Clock::now() < until) {
      if (ucp_worker_progress(worker_) == 0) sched_yield();
    }
    for (void* r : reqs) ucp_request_free(r);  // UCX frees an unfinished one when it completes
    reqs.clear();
  };
  std::vector<void*> reqs;
  goodbye_[0] = kGoodbyeMagic;
  goodbye_[1] = static_cast<std::uint32_t>(rank_);
  for (auto& peer : peers_) {
    if (peer->ep == nullptr || peer->error != UCS_OK || peer->departed || peer->rank == rank_) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_EAGER;
    ucs_status_ptr_t r = ucp_am_send_nbx(peer->ep, kGoodbyeAmId, goodbye_, sizeof goodbye_, nullptr, 0, &prm);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
  }
  for (auto& peer : peers_) {
    if (peer->ep == nullptr || peer->error != UCS_OK || peer->inflight > 0) continue;
    ucp_request_param_t prm{};
    ucs_status_ptr_t r = ucp_ep_flush_nbx(peer->ep, &prm);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
  }
  drive(reqs);
  for (auto& peer : peers_) {
    if (peer->ep == nullptr) continue;
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &prm);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
    peer->ep = nullptr;
  }
  drive(reqs);
}

// ------------------------------------------------------------ records

UcxTransport::Pending* UcxTransport::acquire_pending() {
  if (free_pending_ == nullptr) {
    auto chunk = std::make_unique<Pending[]>(kPendingChunk);
    for (std::size_t i = 0; i < kPendingChunk; ++i) {
      chunk[i].owner = this;
      chunk[i].next_free = free_pending_;
      free_pending_ = &chunk[i];
    }
    pending_chunks_.push_back(std::move(chunk));
  }
  Pending* p = free_pending_;
  free_pending_ = p->next_free;
  p->next_free = nullptr;
  p->in_use = true;
  p->op = nullptr;
  p->request = nullptr;
  p->posting = false;
  p->inline_done = false;
  ++live_pending_;
  return p;
}

void UcxTransport::release_pending(Pending* p) {
  p->in_use = false;
  p->op = nullptr;
  p->request = nullptr;
  p->next_free = free_pending_;
  free_pending_ = p;
  --live_pending_;
}

void UcxTransport::complete(Pending* p, void* request, Status st) {
  if (Op* op = p->op; op != nullptr) {
    op->status = std::move(st);
    op->done = true;
    op->handle = nullptr;
  }
  if (p->posting) {
    // Called from inside ucp_tag_*_nbx: the poster frees the request once
    // UCX has returned it.
    p->inline_done = true;
    return;
  }
  if (p->request != nullptr) --p->owner->peers_[static_cast<std::size_t>(p->peer)]->inflight;
  if (request != nullptr) ucp_request_free(request);
  p->owner->release_pending(p);
}

void UcxTransport::on_send(void* request, ucs_status_t status, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  Status st;
  if (status != UCS_OK) {
    const Peer& peer = *p->owner->peers_[static_cast<std::size_t>(p->peer)];
    if (peer.error != UCS_OK || is_peer_failure(status)) {
      st = peer_failed(p->peer, peer.error != UCS_OK ? peer.error : status);
    } else if (status == UCS_ERR_CANCELED) {
      st = {Result::system_error, "send to rank " + std::to_string(p->peer) + " cancelled"};
    } else {
      st = {Result::system_error, "send of " + size_string(p->bytes) + " to rank " + std::to_string(p->peer) +
                                      " failed: " + ucs_status_string(status)};
    }
  }
  complete(p, request, std::move(st));
}

// A receive whose length differs from the message is a count mismatch
// between the two ranks' calls; name both sizes so the user can find it.
static Status recv_length_status(int peer, std::size_t posted, ucs_status_t status, const ucp_tag_recv_info_t* info) {
  if (status == UCS_OK) {
    if (info == nullptr || info->length == posted) return {};
    return {Result::invalid_usage, "message from rank " + std::to_string(peer) + " is " + size_string(info->length) +
                                       " but the receive posted for it is " + size_string(posted) +
                                       " (count mismatch between ranks)"};
  }
  // UCX reports a longer message as truncated; its length is not always known.
  std::string got = "more than " + size_string(posted);
  if (info != nullptr && info->length > posted) got = size_string(info->length);
  return {Result::invalid_usage, "message from rank " + std::to_string(peer) + " is " + got +
                                     " but the receive posted for it is " + size_string(posted) +
                                     " (count mismatch between ranks)"};
}

void UcxTransport::on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  auto* p = static_cast<Pending*>(user_data);
  Status st;
  if (status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED) {
    st = recv_length_status(p->peer, p->bytes, status, info);
  } else {
    const Peer& peer = *p->owner->peers_[static_cast<std::size_t>(p->peer)];
    if (peer.error != UCS_OK || is_peer_failure(status)) {
      st = peer_failed(p->peer, peer.error != UCS_OK ? peer.error : status);
    } else if (status == UCS_ERR_CANCELED) {
      st = {Result::system_error, "receive from rank " + std::to_string(p->peer) + " cancelled"};
    } else {
      st = {Result::system_error, "receive of " + size_string(p->bytes) + " from rank " + std::to_string(p->peer) +
                                      " failed: " + ucs_status_string(status)};
    }
  }
  complete(p, request, std::move(st));
}

ucs_status_t UcxTransport::on_goodbye(void* arg, const void* header, std::size_t header_length, void* /*data*/,
                                      std::size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  auto* self = static_cast<UcxTransport*>(arg);
  std::uint32_t h[2];
  if (header_length != sizeof h) return UCS_OK;
  std::memcpy(h, header, sizeof h);
  if (h[0] != kGoodbyeMagic || h[1] >= static_cast<std::uint32_t>(self->peers_.size())) return UCS_OK;
  Peer& peer = *self->peers_[h[1]];
  if (!peer.departed) {
    peer.departed = true;
    peer.departed_at = Clock::now();
  }
  return UCS_OK;  // nothing kept
}

void UcxTransport::on_ep_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<Peer*>(arg);
  // Recorded only: wait() fails the ops with this peer (UCX fails the sends
  // itself but leaves tagged receives posted), the destructor force-closes.
  if (peer->error == UCS_OK) {
    peer->error = status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status;
    peer->error_at = Clock::now();
  }
}

// ------------------------------------------------------------ posting

std::uint64_t UcxTransport::make_tag(std::uint64_t tag, Traffic traffic, int sender) const noexcept {
  return (static_cast<std::uint64_t>(traffic == Traffic::point_to_point ? 1 : 0) << 63) |
         (static_cast<std::uint64_t>(sender) << kTagBits) | (tag & kTagMask);
}

Status UcxTransport::failed_status() const {
  std::lock_guard lk(fail_mu_);
  return fail_status_;
}

Status UcxTransport::peer_blocker(int peer, Clock::time_point now) const {
  const Peer& p = *peers_[static_cast<std::size_t>(peer)];
  if (p.error != UCS_OK && now - p.error_at >= kPeerGrace) return peer_failed(peer, p.error);
  if (p.departed && now - p.departed_at >= kPeerGrace) {
    return {Result::remote_error,
            "rank " + std::to_string(peer) + " left (its communicator was destroyed or aborted)"};
  }
  return {};
}

Status UcxTransport::check_post(int peer, std::uint64_t tag, Op* op, bool is_send, std::size_t bytes) {
  if (op == nullptr) return {Result::invalid_argument, "null op"};
  *op = Op{};
  op->peer = peer;
  op->is_send = is_send;
  op->bytes = bytes;
  Status st;
  if (!connected_) {
    st = {Result::invalid_usage, "ucx transport used before connect()"};
  } else if (peer < 0 || peer >= size_) {
    st = {Result::invalid_argument, "peer " + std::to_string(peer) + " out of range for " + std::to_string(size_) +
                                        " ranks"};
  } else if ((tag & ~kTagMask) != 0) {
    st = {Result::invalid_argument, "tag " + std::to_string(tag) + " does not fit in " + std::to_string(kTagBits) +
                                        " bits"};
  } else if (failed_.load(std::memory_order_acquire)) {
    st = failed_status();
  } else if (is_send && (peers_[static_cast<std::size_t>(peer)]->error != UCS_OK ||
                         peers_[static_cast<std::size_t>(peer)]->departed)) {
    // Nobody will receive it. (A receive is still posted: what the peer
    // sent before it failed or left may be waiting here; wait() fails the
    // receive if not.)
    const Peer& p = *peers_[static_cast<std::size_t>(peer)];
    st = p.error != UCS_OK ? peer_failed(peer, p.error)
                           : Status(Result::remote_error, "rank " + std::to_string(peer) +
                                                              " left (its communicator was destroyed or aborted)");
  }
  if (!st.ok()) {
    op->done = true;
    op->status = st;
  }
  return st;
}

Status UcxTransport::post_send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes, Op* op,
                               Traffic traffic) {
  if (Status st = check_post(peer, tag, op, true, bytes); !st.ok()) return st;
  Pending* p = acquire_pending();
  p->op = op;
  p->peer = peer;
  p->is_send = true;
  p->bytes = bytes;
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE;
  prm.cb.send = &UcxTransport::on_send;
  prm.user_data = p;
  prm.datatype = ucp_dt_make_contig(1);
  p->posting = true;
  ucs_status_ptr_t r = ucp_tag_send_nbx(peers_[static_cast<std::size_t>(peer)]->ep, buf, bytes,
                                        make_tag(tag, traffic, rank_), &prm);
  p->posting = false;
  if (r == nullptr) {  // completed in place (small eager message)
    op->done = true;
    release_pending(p);
    return {};
  }
  if (p->inline_done && UCS_PTR_IS_PTR(r)) {  // not expected without NO_IMM_CMPL, but harmless
    ucp_request_free(r);
    release_pending(p);
    return op->status;
  }
  if (UCS_PTR_IS_ERR(r)) {
    const ucs_status_t s = UCS_PTR_STATUS(r);
    release_pending(p);
    op->done = true;
    op->status = is_peer_failure(s) ? peer_failed(peer, s)
                                    : Status(Result::system_error, "send to rank " + std::to_string(peer) +
                                                                       " failed: " + ucs_status_string(s));
    return op->status;
  }
  p->request = r;
  ++peers_[static_cast<std::size_t>(peer)]->inflight;
  op->handle = p;
  return {};
}

Status UcxTransport::post_recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes, Op* op, Traffic traffic) {
  if (Status st = check_post(peer, tag, op, false, bytes); !st.ok()) return st;
  Pending* p = acquire_pending();
  p->op = op;
  p->peer = peer;
  p->is_send = false;
  p->bytes = bytes;
  ucp_request_param_t prm{};
  // NO_IMM_CMPL: UCX 1.13 does not report the received length of an
  // immediate completion (recv_info stays unset), so every completion goes
  // through on_recv, which gets it. An inline completion is reaped below.
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE |
                     UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.cb.recv = &UcxTransport::on_recv;
  prm.user_data = p;
  prm.datatype = ucp_dt_make_contig(1);
  p->posting = true;
  ucs_status_ptr_t r =
      ucp_tag_recv_nbx(worker_, buf, bytes, make_tag(tag, traffic, peer), ~std::uint64_t{0}, &prm);
  p->posting = false;
  if (UCS_PTR_IS_ERR(r) || r == nullptr) {
    const ucs_status_t s = UCS_PTR_STATUS(r);
    release_pending(p);
    op->done = true;
    op->status = {Result::system_error,
                  "receive from rank " + std::to_string(peer) + " failed: " + ucs_status_string(s)};
    return op->status;
  }
  if (p->inline_done) {  // matched a message that was already here; op is complete
    ucp_request_free(r);
    release_pending(p);
    return {};
  }
  p->request = r;
  ++peers_[static_cast<std::size_t>(peer)]->inflight;
  op->handle = p;
  return {};
}

// ------------------------------------------------------------ waiting

void UcxTransport::detach_and_cancel(Op* op, const Status& st) {
  auto* p = static_cast<Pending*>(op->handle);
  op->handle = nullptr;
  op->done = true;
  op->status = st;
  if (p == nullptr) return;
  p->op = nullptr;
  // May complete (and release p) right here.
  if (p->request != nullptr) ucp_request_cancel(worker_, p->request);
}

std::string UcxTransport::timeout_message(std::span<Op* const> ops, double seconds) const {
  std::vector<int> who;
  std::string what;
  int listed = 0;
  for (const Op* op : ops) {
    if (op->done) continue;
    if (std::find(who.begin(), who.end(), op->peer) == who.end()) who.push_back(op->peer);
    if (listed < 8) {
      what += (listed > 0 ? ", " : "") + std::string(op->is_send ? "send of " : "recv of ") + size_string(op->bytes);
    } else if (listed == 8) {
      what += ", ...";
    }
    ++listed;
  }
  std::string ranks;
  for (std::size_t i = 0; i < who.size(); ++i) ranks += (i > 0 ? ", " : "") + std::to_string(who[i]);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", seconds);
  return "rank " + std::to_string(rank_) + " timed out after " + secs + " s waiting for rank(s) " + ranks + " (" +
         what + ")";
}

void UcxTransport::progress() {
  // Bounded: a busy worker must not keep the idle caller forever.
  for (int i = 0; i < 64 && ucp_worker_progress(worker_) != 0; ++i) {
  }
}

Status UcxTransport::wait(std::span<Op* const> ops, Clock::time_point deadline) {
  const auto start = Clock::now();
  const auto spin = std::chrono::microseconds(policy_.spin_us);
  const auto yield = std::chrono::microseconds(policy_.yield_us);
  auto phase_start = start;
  for (;;) {
    if (failed_.load(std::memory_order_acquire)) return failed_status();
    bool all = true;
    Clock::time_point now{};  // read only when a peer is in trouble
    for (Op* op : ops) {
      if (op->done) {
        if (!op->status.ok()) return op->status;
        continue;
      }
      all = false;
      if (op->peer < 0 || op->peer >= size_) continue;
      const Peer& peer = *peers_[static_cast<std::size_t>(op->peer)];
      if (peer.error == UCS_OK && !peer.departed) continue;
      // UCX fails sends on a broken endpoint but never the receives posted
      // for it: fail them here so nothing waits on a dead or departed rank.
      if (now == Clock::time_point{}) now = Clock::now();
      if (Status st = peer_blocker(op->peer, now); !st.ok()) {
        detach_and_cancel(op, st);
        return st;
      }
    }
    if (all) return {};
    if (ucp_worker_progress(worker_) != 0) {
      phase_start = Clock::now();  // traffic is flowing: more is likely soon
      continue;
    }
    now = Clock::now();
    if (now >= deadline) {
      return {Result::timeout, timeout_message(ops, std::chrono::duration<double>(now - start).count())};
    }
    if (now - phase_start < spin) continue;
    if (now - phase_start < spin + yield) {
      sched_yield();
      continue;
    }
    // Sleep until the worker signals an event (or poll_ms, since shared
    // memory does not always signal). arm() returns BUSY when events are
    // already waiting: then progress again instead of sleeping.
    const ucs_status_t s = ucp_worker_arm(worker_);
    if (s == UCS_ERR_BUSY) continue;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    const int ms = static_cast<int>(std::min<long long>(left, policy_.poll_ms));
    if (s == UCS_OK) {
      pollfd pfd{event_fd_, POLLIN, 0};
      (void)::poll(&pfd, 1, ms);
    } else {
      ::usleep(static_cast<useconds_t>(std::min(ms, 1) * 1000));
    }
  }
}

void UcxTransport::cancel(Op* op) {
  if (op == nullptr) return;
  auto* p = static_cast<Pending*>(op->handle);
  if (p == nullptr || op->done) {
    op->handle = nullptr;
    return;
  }
  if (p->request != nullptr) ucp_request_cancel(worker_, p->request);
  // Reap: an unmatched receive completes (cancelled) at once; one UCX has
  // already matched, or a send, finishes on its own shortly if the peer is
  // alive. After a bounded wait the record is detached so that its
  // completion can no longer touch `op`.
  const auto until = Clock::now() + (p->is_send ? std::chrono::milliseconds(1) : std::chrono::milliseconds(100));
  while (op->handle != nullptr && Clock::now() < until) {
    if (ucp_worker_progress(worker_) == 0) sched_yield();
  }
  if (op->handle != nullptr) {
    p->op = nullptr;
    op->handle = nullptr;
  }
}

void UcxTransport::fail(const Status& why) {
  {
    std::lock_guard lk(fail_mu_);
    if (failed_.load(std::memory_order_relaxed)) return;
    fail_status_ = why.ok() ? Status(Result::remote_error, "transport failed") : why;
    failed_.store(true, std::memory_order_release);
  }
  if (worker_ != nullptr) (void)ucp_worker_signal(worker_);  // wakes a wait() sleeping on the event fd
}

}  // namespace cclz::detail
