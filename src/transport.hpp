// Transport: non-blocking byte transfers between the ranks of one
// communicator, driven by an explicit wait. Algorithms never see a concrete
// transport; they talk to a coll::Group, which talks to this.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "cclz/types.hpp"

namespace cclz::detail {

using Clock = std::chrono::steady_clock;

// One posted send or receive. The caller owns it (usually on its stack) and
// must not move or destroy it until `done` or until it has been cancelled.
struct Op {
  int peer = -1;
  bool is_send = false;
  std::size_t bytes = 0;
  void* handle = nullptr;  // transport-private
  bool done = false;
  Status status;
};

class Transport {
 public:
  // Tags handed to post_send/post_recv must be below 2^kTagBits; the
  // transport adds the sender's rank and the traffic class itself.
  static constexpr int kTagBits = 44;
  enum class Traffic : int { collective = 0, point_to_point = 1 };

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  // A send is matched by the receive from this rank with the same tag and
  // traffic class. Messages with equal (peer, tag, traffic) match in order.
  virtual Status post_send(int peer, std::uint64_t tag, const void* buf, std::size_t bytes, Op* op,
                           Traffic traffic = Traffic::collective) = 0;
  // The received message must be exactly `bytes` long; a different length
  // completes the op with invalid_usage (a count mismatch between ranks).
  virtual Status post_recv(int peer, std::uint64_t tag, void* buf, std::size_t bytes, Op* op,
                           Traffic traffic = Traffic::collective) = 0;

  // Drives progress until every op in `ops` is done, one fails, or the
  // deadline passes. Waiting backs off (yield, then sleep on the transport's
  // wake-up event) so that more ranks than cores still make progress. On
  // timeout returns Result::timeout with a message naming the peers of the
  // unfinished ops, and leaves those ops posted (the caller cancels them).
  virtual Status wait(std::span<Op* const> ops, Clock::time_point deadline) = 0;

  // Cancels a posted, unfinished op so that its buffer may be released.
  virtual void cancel(Op* op) = 0;

  // Makes every later and every pending wait() fail with `why` (abort).
  virtual void fail(const Status& why) = 0;

  // Drives pending protocol work that no op of this rank waits for, such as
  // acknowledging a peer's rendezvous send whose data this rank has already
  // received. The communicator calls it while idle so that a peer never
  // waits on a rank that is busy outside the library.
  virtual void progress() {}
};

}  // namespace cclz::detail
