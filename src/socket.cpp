// TCP helpers for the bootstrap (see socket.hpp). Every wait is a poll()
// bounded by the caller's deadline, so no step of a rendezvous can hang.
// Cost: a syscall or two per frame; connect retries back off from 10 ms to
// 500 ms so a rank that starts early does not flood the network.
#include "socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace cclz::detail::net {

std::string errno_string(int err) {
  char buf[256];
  // GNU strerror_r may return a static string instead of filling buf.
  const char* s = strerror_r(err, buf, sizeof buf);
  return s;
}

// ---------------------------------------------------------------- SockAddr

int SockAddr::port() const noexcept {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return -1;
}

void SockAddr::set_port(int port) noexcept {
  const auto p = htons(static_cast<std::uint16_t>(port));
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = p;
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = p;
}

bool SockAddr::is_loopback() const noexcept {
  if (family() == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  }
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  }
  return false;
}

bool SockAddr::is_wildcard() const noexcept {
  if (family() == AF_INET) return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == INADDR_ANY;
  if (family() == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  }
  return false;
}

std::string SockAddr::to_string() const {
  char host[INET6_ADDRSTRLEN] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host, sizeof host);
    // Appended piecewise: g++ 12 -O3 warns falsely (-Wrestrict) on "[" + s.
    std::string out(1, '[');
    out += host;
    out += "]:";
    out += std::to_string(port());
    return out;
  }
  return "<no address>";
}

std::vector<std::uint8_t> SockAddr::raw_address() const {
  if (family() == AF_INET) {
    const auto* a = reinterpret_cast<const std::uint8_t*>(&reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr);
    return {a, a + 4};
  }
  if (family() == AF_INET6) {
    const auto* a =
        reinterpret_cast<const std::uint8_t*>(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
    return {a, a + 16};
  }
  return {};
}

bool SockAddr::from_raw(int family, std::span<const std::uint8_t> raw, int port, SockAddr* out) {
  *out = SockAddr{};
  if (port < 0 || port > 65535) return false;
  if (family == AF_INET && raw.size() >= 4) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&out->storage);
    sin->sin_family = AF_INET;
    std::memcpy(&sin->sin_addr, raw.data(), 4);
    out->len = sizeof(sockaddr_in);
  } else if (family == AF_INET6 && raw.size() >= 16) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&out->storage);
    sin6->sin6_family = AF_INET6;
    std::memcpy(&sin6->sin6_addr, raw.data(), 16);
    out->len = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  out->set_port(port);
  return true;
}

SockAddr SockAddr::loopback(int family, int port) {
  SockAddr a;
  if (family == AF_INET6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_addr = in6addr_loopback;
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(&a.storage);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.len = sizeof(sockaddr_in);
  }
  a.set_port(port);
  return a;
}

SockAddr SockAddr::wildcard(int family, int port) {
  SockAddr a;
  if (family == AF_INET6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_addr = in6addr_any;
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(&a.storage);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_ANY);
    a.len = sizeof(sockaddr_in);
  }
  a.set_port(port);
  return a;
}

// ---------------------------------------------------------------- Fd

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

void Fd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

// ---------------------------------------------------------------- addresses

Status resolve(const std::string& host, int port, SockAddr* out) {
  if (port < 0 || port > 65535) return {Result::invalid_argument, "port " + std::to_string(port) + " out of range"};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) return {Result::system_error, "cannot resolve host '" + host + "': " + gai_strerror(rc)};
  // Prefer IPv4: it is what most clusters route between hosts.
  const addrinfo* pick = nullptr;
  for (const addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      pick = ai;
      break;
    }
    if (ai->ai_family == AF_INET6 && pick == nullptr) pick = ai;
  }
  if (pick == nullptr) {
    freeaddrinfo(res);
    return {Result::system_error, "host '" + host + "' has no IPv4 or IPv6 address"};
  }
  *out = SockAddr{};
  std::memcpy(&out->storage, pick->ai_addr, pick->ai_addrlen);
  out->len = static_cast<socklen_t>(pick->ai_addrlen);
  out->set_port(port);
  freeaddrinfo(res);
  return {};
}

static bool name_matches(const char* name, const std::string& prefixes) {
  std::size_t start = 0;
  while (start <= prefixes.size()) {
    std::size_t end = prefixes.find(',', start);
    if (end == std::string::npos) end = prefixes.size();
    const std::string p = prefixes.substr(start, end - start);
    if (!p.empty() && std::strncmp(name, p.c_str(), p.size()) == 0) return true;
    start = end + 1;
  }
  return false;
}

Status pick_local_address(SockAddr* out, std::string* ifname) {
  const char* env = std::getenv("CCLZ_SOCKET_IFNAME");
  const std::string want = env != nullptr ? env : "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    *out = SockAddr::loopback(AF_INET, 0);
    if (ifname != nullptr) *ifname = "lo";
    return {};
  }
  const ifaddrs* best = nullptr;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    const int fam = ifa->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if ((ifa->ifa_flags & IFF_UP) == 0) continue;
    if (want.empty()) {
      // Without a hint skip loopback and container bridges, as NCCL does.
      if ((ifa->ifa_flags & IFF_LOOPBACK) != 0) continue;
      if (std::strncmp(ifa->ifa_name, "docker", 6) == 0 || std::strncmp(ifa->ifa_name, "virbr", 5) == 0) continue;
    } else if (!name_matches(ifa->ifa_name, want)) {
      continue;
    }
    if (fam == AF_INET6) {
      // Link-local v6 addresses need a scope id that peers do not share.
      const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(ifa->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&sin6->sin6_addr)) continue;
    }
    if (best == nullptr || (best->ifa_addr->sa_family == AF_INET6 && fam == AF_INET)) best = ifa;
  }
  if (best == nullptr) {
    freeifaddrs(list);
    if (!want.empty()) {
      return {Result::invalid_argument, "CCLZ_SOCKET_IFNAME=" + want + " matches no interface with an address"};
    }
    *out = SockAddr::loopback(AF_INET, 0);
    if (ifname != nullptr) *ifname = "lo";
    return {};
  }
  *out = SockAddr{};
  const socklen_t len = best->ifa_addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(&out->storage, best->ifa_addr, len);
  out->len = len;
  if (ifname != nullptr) *ifname = best->ifa_name;
  freeifaddrs(list);
  return {};
}

bool is_local_address(const SockAddr& a) {
  if (a.is_loopback()) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  const auto raw = a.raw_address();
  for (const ifaddrs* ifa = list; ifa != nullptr && !found; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != a.family()) continue;
    SockAddr b;
    std::memcpy(&b.storage, ifa->ifa_addr, a.family() == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    found = b.raw_address() == raw;
  }
  freeifaddrs(list);
  return found;
}

// ---------------------------------------------------------------- sockets

static Status sys_error(const std::string& what, int err) {
  return {Result::system_error, what + ": " + errno_string(err)};
}

Status listen_on(const SockAddr& addr, bool reuse_addr, int backlog, Fd* out, SockAddr* bound) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return sys_error("socket()", errno);
  if (reuse_addr) {
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
    return sys_error("cannot bind " + addr.to_string(), errno);
  }
  if (::listen(fd.get(), backlog) != 0) return sys_error("cannot listen on " + addr.to_string(), errno);
  SockAddr b;
  b.len = sizeof b.storage;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&b.storage), &b.len) != 0) {
    return sys_error("getsockname()", errno);
  }
  *bound = b;
  *out = std::move(fd);
  return {};
}

int poll_timeout_ms(Clock::time_point deadline, int cap_ms) {
  const auto now = Clock::now();
  if (now >= deadline) return 0;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
  return static_cast<int>(std::min<long long>(ms, cap_ms));
}

// On loopback a connect to a port nobody listens on, in the range the
// kernel hands out as source ports, can take that very port as its source
// and connect to itself (TCP simultaneous open). Such a socket carries
// nothing and holds the port the root is about to bind, which then fails
// with "Address already in use".
static bool connected_to_itself(int fd) {
  SockAddr self, peer;
  self.len = peer.len = sizeof(sockaddr_storage);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self.storage), &self.len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer.storage), &peer.len) != 0) {
    return false;
  }
  return self.family() == peer.family() && self.port() == peer.port() && self.raw_address() == peer.raw_address();
}

// One connect attempt; returns 0 or the errno that made it fail (a
// connection to itself counts as refused, and is reset to free the port).
static int try_connect(const SockAddr& addr, Clock::time_point deadline, Fd* out) {
  Fd fd(::socket(addr.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return errno;
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0) {
    if (errno != EINPROGRESS) return errno;
    for (;;) {
      pollfd p{fd.get(), POLLOUT, 0};
      const int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) return errno;
      if (rc == 0) {
        if (Clock::now() >= deadline) return ETIMEDOUT;
        continue;
      }
      break;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    if (err != 0) return err;
  }
  if (connected_to_itself(fd.get())) {
    // Reset, not closed: a closed one would hold the port in TIME_WAIT,
    // and bind() fails on that too (this socket had no SO_REUSEADDR).
    const linger reset{1, 0};
    setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    return ECONNREFUSED;
  }
  *out = std::move(fd);
  return 0;
}

Status connect_retry(const SockAddr& addr, Clock::time_point deadline, Fd* out) {
  auto backoff = std::chrono::milliseconds(10);
  int attempts = 0;
  int last = 0;
  for (;;) {
    ++attempts;
    last = try_connect(addr, deadline, out);
    if (last == 0) return {};
    const auto now = Clock::now();
    if (now >= deadline) break;
    // Refused / unreachable / reset: the root may not be up yet; try again.
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  return {Result::timeout, "could not reach the rendezvous root at " + addr.to_string() + " before the deadline (" +
                               std::to_string(attempts) + " attempts, last error: " + errno_string(last) + ")"};
}

Status write_all(int fd, std::span<const std::byte> data, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() >= deadline) return {Result::timeout, "socket write timed out"};
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, poll_timeout_ms(deadline));
      continue;
    }
    const int err = errno;
    if (err == EPIPE || err == ECONNRESET) return {Result::remote_error, "connection closed by peer"};
    return sys_error("socket write", err);
  }
  return {};
}

Status read_all(int fd, std::span<std::byte> data, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::recv(fd, data.data() + done, data.size() - done, 0);
    if (n > 0) {
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return {Result::remote_error, "connection closed by peer"};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (Clock::now() >= deadline) return {Result::timeout, "socket read timed out"};
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, poll_timeout_ms(deadline));
      continue;
    }
    if (errno == ECONNRESET) return {Result::remote_error, "connection reset by peer"};
    return sys_error("socket read", errno);
  }
  return {};
}

Status send_frame(int fd, std::span<const std::byte> payload, Clock::time_point deadline) {
  if (payload.size() > kMaxFrame) return {Result::internal_error, "bootstrap frame too large"};
  Writer w;
  w.u32(static_cast<std::uint32_t>(payload.size()));
  if (Status st = write_all(fd, w.data(), deadline); !st.ok()) return st;
  return write_all(fd, payload, deadline);
}

Status recv_frame(int fd, std::vector<std::byte>* payload, Clock::time_point deadline) {
  std::byte hdr[4];
  if (Status st = read_all(fd, hdr, deadline); !st.ok()) return st;
  Reader r(hdr);
  const std::uint32_t len = r.u32();
  if (len > kMaxFrame) return {Result::remote_error, "malformed bootstrap frame (length " + std::to_string(len) + ")"};
  payload->resize(len);
  return read_all(fd, *payload, deadline);
}

// ---------------------------------------------------------------- encoding

void Writer::put(std::uint64_t v, int n) {
  for (int i = 0; i < n; ++i) buf_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
}

void Writer::bytes(std::span<const std::byte> b) {
  u32(static_cast<std::uint32_t>(b.size()));
  buf_.insert(buf_.end(), b.begin(), b.end());
}

void Writer::str(const std::string& s) { bytes(std::as_bytes(std::span(s.data(), s.size()))); }

std::uint64_t Reader::get(int n) {
  if (!ok_ || buf_.size() - pos_ < static_cast<std::size_t>(n)) {
    ok_ = false;
    return 0;
  }
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(buf_[pos_ + static_cast<std::size_t>(i)]) << (8 * i);
  pos_ += static_cast<std::size_t>(n);
  return v;
}

std::vector<std::byte> Reader::bytes() {
  const std::uint32_t n = u32();
  if (!ok_ || buf_.size() - pos_ < n) {
    ok_ = false;
    return {};
  }
  std::vector<std::byte> out(buf_.begin() + static_cast<std::ptrdiff_t>(pos_),
                             buf_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
  pos_ += n;
  return out;
}

std::string Reader::str() {
  const auto b = bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

}  // namespace cclz::detail::net
