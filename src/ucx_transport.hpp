// UcxTransport: the host-memory Transport over UCX UCP tag matching. One UCP
// worker per transport (per communicator); the UCP context is shared by the
// whole process through a ref-counted registry. Endpoints are made from the
// worker addresses the bootstrap exchanged, with peer error handling so a
// dead peer surfaces as an error instead of a hang.
//
// UCX tag layout (64 bits): [traffic class 1][sender rank 19][tag 44]; a
// receive names its sender, so it matches with a full mask and messages with
// equal (sender, tag, class) match in send order (UCP keeps per-endpoint
// order). Large messages use UCP's rendezvous protocol, so UCX picks the
// zero-copy path itself (CMA/shm on one host, verbs on IB, TCP elsewhere);
// UCX_TLS / UCX_NET_DEVICES are honoured because the config is read from the
// environment.
#pragma once

#include <ucp/api/ucp_def.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "transport.hpp"

namespace cclz::detail {

// How wait() backs off (see UcxTransport::wait); CCLZ_SPIN_US, CCLZ_YIELD_US
// and CCLZ_POLL_MS override it. Measured on a 2-core host (cclz-transport-
// bench, medians of 5, other jobs running): a 4 KB ring all-reduce over 4
// ranks took 21/35/53/69 us with spin 0/2/5/10 us and 8 ranks 150/293/146/
// 323 us, while 2 ranks on 2 cores want a short spin for their ~1 us
// latency. Spinning longer only steals the core from the peer we wait for.
// The event fd wakes a sleeping rank in ~50-100 us, so the yield phase
// covers the gaps between steps of one collective before sleeping.
struct UcxWaitPolicy {
  int spin_us = 2;      // busy ucp_worker_progress
  int yield_us = 2000;  // then progress + sched_yield
  int poll_ms = 1;      // then sleep on the worker's event fd, at most this long
  static UcxWaitPolicy from_env();
};

class UcxTransport final : public Transport {
 public:
  static constexpr int kRankBits = 19;
  static constexpr int kMaxRanks = 1 << kRankBits;

  // Makes the worker (not yet connected): publish address(), exchange it,
  // then call connect() with every rank's address.
  static Status create(int rank, int size, std::unique_ptr<UcxTransport>* out);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This worker's UCP address (an opaque blob for the bootstrap).
  std::span<const std::byte> address() const noexcept { return address_; }
  // Creates one endpoint per rank (index = rank, including this one).
  Status connect(const std::vector<std::vector<std::byte>>& addresses);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "ucx"; }
  Status post_send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes, Op* op,
                   Traffic traffic = Traffic::collective) override;
  Status post_recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes, Op* op,
                   Traffic traffic = Traffic::collective) override;
  // Progress until all ops are done, one fails, fail() was called or the
  // deadline passes. Back-off: spin_us of busy progress, then progress with
  // sched_yield until yield_us, then sleep on the worker's event fd
  // (ucp_worker_arm + poll, at most poll_ms at a time because shared-memory
  // transports do not always signal it).
  Status wait(std::span<Op* const> ops, Clock::time_point deadline) override;
  void cancel(Op* op) override;
  // Thread-safe: may be called while another thread is inside wait().
  void fail(const Status& why) override;
  void progress() override;

  void set_wait_policy(const UcxWaitPolicy& p) noexcept { policy_ = p; }

  // Internal: per-request and per-endpoint records the UCX callbacks reach.
  struct Pending;
  struct Peer;

 private:
  UcxTransport(int rank, int size);
  Status init_worker();
  std::uint64_t make_tag(std::uint64_t tag, Traffic traffic, int sender) const noexcept;
  Status check_post(int peer, std::uint64_t tag, Op* op, bool is_send, std::size_t bytes);
  Pending* acquire_pending();
  void detach_and_cancel(Op* op, const Status& st);
  Status failed_status() const;
  std::string timeout_message(std::span<Op* const> ops, double seconds) const;

  static void on_send(void* request, ucs_status_t status, void* user_data);
  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_goodbye(void* arg, const void* header, std::size_t header_length, void* data,
                                 std::size_t length, const ucp_am_recv_param_t* param);
  void say_goodbye_and_close();
  // Why an unfinished op with `peer` can never finish (ok if it still can).
  Status peer_blocker(int peer, Clock::time_point now) const;
  static void complete(Pending* p, void* request, Status st);
  void release_pending(Pending* p);

  int rank_;
  int size_;
  bool connected_ = false;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;
  std::uint32_t goodbye_[2] = {0, 0};  // AM header sent to every peer on teardown
  std::vector<std::byte> address_;
  std::vector<std::unique_ptr<Peer>> peers_;
  // Pending records live in chunks that never move; free ones are chained.
  std::vector<std::unique_ptr<Pending[]>> pending_chunks_;
  Pending* free_pending_ = nullptr;
  std::size_t live_pending_ = 0;
  UcxWaitPolicy policy_;

  std::atomic<bool> failed_{false};
  mutable std::mutex fail_mu_;
  Status fail_status_;
};

}  // namespace cclz::detail
