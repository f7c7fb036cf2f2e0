// TCP helpers for the bootstrap: address parsing and selection, listening,
// connecting with retry, and length-prefixed frames, every blocking step
// bounded by a deadline (non-blocking sockets + poll). Nothing here keeps
// state beyond the file descriptors it hands out.
// Cost: one connect per rank per rendezvous; frames are copied once.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cclz/types.hpp"
#include "transport.hpp"

namespace cclz::detail::net {

// An IPv4 or IPv6 socket address.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const noexcept { return storage.ss_family; }
  int port() const noexcept;
  void set_port(int port) noexcept;
  bool is_loopback() const noexcept;
  bool is_wildcard() const noexcept;
  // "1.2.3.4:5" or "[fe80::1]:5"
  std::string to_string() const;
  // The address bytes (4 or 16) and back; used to pack an address in a UniqueId.
  std::vector<std::uint8_t> raw_address() const;
  static bool from_raw(int family, std::span<const std::uint8_t> raw, int port, SockAddr* out);
  static SockAddr loopback(int family, int port);
  static SockAddr wildcard(int family, int port);
};

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

// Resolves host (name or numeric, v4 or v6) and port.
Status resolve(const std::string& host, int port, SockAddr* out);

// The address peers should use to reach this host: the first up, non-loopback
// interface whose name starts with one of the comma-separated prefixes in
// CCLZ_SOCKET_IFNAME (any interface when unset; IPv4 preferred), else loopback.
// `ifname` receives the interface's name.
Status pick_local_address(SockAddr* out, std::string* ifname);

// True when `a` is an address of one of this host's interfaces.
bool is_local_address(const SockAddr& a);

// A non-blocking listening socket bound to `addr` (port 0: ephemeral);
// `bound` receives the address actually bound.
Status listen_on(const SockAddr& addr, bool reuse_addr, int backlog, Fd* out, SockAddr* bound);

// Connects to `addr`, retrying refused/unreachable attempts with exponential
// backoff until `deadline`; the socket is left non-blocking.
Status connect_retry(const SockAddr& addr, Clock::time_point deadline, Fd* out);

// Milliseconds until `deadline` for poll(): 0 when passed, capped at `cap_ms`.
int poll_timeout_ms(Clock::time_point deadline, int cap_ms = 1000);

// Writes/reads exactly `data.size()` bytes on a non-blocking socket before
// `deadline`. A peer that closes surfaces as Result::remote_error.
Status write_all(int fd, std::span<const std::byte> data, Clock::time_point deadline);
Status read_all(int fd, std::span<std::byte> data, Clock::time_point deadline);

// Frames: a 4-byte little-endian length, then the payload (at most kMaxFrame).
inline constexpr std::size_t kMaxFrame = std::size_t{1} << 26;
Status send_frame(int fd, std::span<const std::byte> payload, Clock::time_point deadline);
Status recv_frame(int fd, std::vector<std::byte>* payload, Clock::time_point deadline);

// Little-endian encoding for the bootstrap's messages.
class Writer {
 public:
  void u8(std::uint8_t v) { put(v, 1); }
  void u16(std::uint16_t v) { put(v, 2); }
  void u32(std::uint32_t v) { put(v, 4); }
  void u64(std::uint64_t v) { put(v, 8); }
  void i32(std::int32_t v) { put(static_cast<std::uint32_t>(v), 4); }
  void bytes(std::span<const std::byte> b);  // length-prefixed
  void str(const std::string& s);             // length-prefixed
  std::vector<std::byte>& data() { return buf_; }

 private:
  void put(std::uint64_t v, int n);
  std::vector<std::byte> buf_;
};

// Reads what Writer wrote; any overrun sets ok() to false and yields zeros.
class Reader {
 public:
  explicit Reader(std::span<const std::byte> b) : buf_(b) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(get(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(get(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(get(4)); }
  std::uint64_t u64() { return get(8); }
  std::int32_t i32() { return static_cast<std::int32_t>(static_cast<std::uint32_t>(get(4))); }
  std::vector<std::byte> bytes();
  std::string str();
  bool ok() const noexcept { return ok_; }
  bool at_end() const noexcept { return pos_ == buf_.size(); }

 private:
  std::uint64_t get(int n);
  std::span<const std::byte> buf_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

// strerror for `err`, thread-safe.
std::string errno_string(int err);

}  // namespace cclz::detail::net
