// Bootstrap: one-shot TCP rendezvous (unique id or host:port) and the split
// exchange over a parent transport (see bootstrap.hpp).
//
// Rendezvous follows NCCL's root-service shape: a root thread accepts one
// connection per rank, each rank sends a hello (rank, nranks, host name,
// CCLZ_NODE_ID, transport address), the root checks them (same nranks, no
// duplicate or out-of-range rank) and sends every rank the full table, then
// exits. If the deadline passes first, the ranks that did arrive are told
// which ranks never did. Cost: O(nranks) connections and O(nranks^2) bytes of
// addresses at the root, one round trip per rank.
//
// Split: members gather their new transport addresses at members[0] over
// the parent transport and it sends the table back: 2(n-1) messages each way
// at members[0], two round trips.
#include "bootstrap.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <thread>

#include "socket.hpp"
#include "topology.hpp"
#if CCLZ_HAVE_UCX
#include "ucx_transport.hpp"
#endif

namespace cclz::detail {

namespace {

constexpr std::uint32_t kMagic = 0x5a4c4343;  // "CCLZ"
constexpr std::uint16_t kVersion = 2;  // 2: entries carry the affinity mask
constexpr std::uint16_t kHello = 1;
constexpr std::uint16_t kTable = 2;
constexpr int kMaxRanks = 1 << 19;  // the UCX tag holds 19 bits of rank
// The root waits this long for the first rank of a unique id; after that
// the ranks' own deadlines bound it.
constexpr auto kRootIdleLimit = std::chrono::hours(1);
// A rank waits this much past its deadline for the root's verdict, which
// the root sends at that same deadline.
constexpr auto kVerdictGrace = std::chrono::seconds(2);

struct Entry {
  std::string hostname;
  int node = -1;
  std::vector<std::byte> cpus;  // RankInfo::cpus
  std::vector<std::byte> blob;
};

struct Hello {
  std::uint64_t nonce = 0;
  int nranks = 0;
  int rank = -1;
  std::uint32_t remaining_ms = 0;
  Entry entry;
};

std::vector<std::byte> encode_hello(const Hello& h) {
  net::Writer w;
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(kHello);
  w.u64(h.nonce);
  w.i32(h.nranks);
  w.i32(h.rank);
  w.u32(h.remaining_ms);
  w.i32(h.entry.node);
  w.str(h.entry.hostname);
  w.bytes(h.entry.cpus);
  w.bytes(h.entry.blob);
  return std::move(w.data());
}

bool decode_hello(std::span<const std::byte> b, Hello* h) {
  net::Reader r(b);
  if (r.u32() != kMagic || r.u16() != kVersion || r.u16() != kHello) return false;
  h->nonce = r.u64();
  h->nranks = r.i32();
  h->rank = r.i32();
  h->remaining_ms = r.u32();
  h->entry.node = r.i32();
  h->entry.hostname = r.str();
  h->entry.cpus = r.bytes();
  h->entry.blob = r.bytes();
  return r.ok() && r.at_end();
}

std::vector<std::byte> encode_verdict(const Status& st, const std::vector<Entry>& table) {
  net::Writer w;
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(kTable);
  w.i32(static_cast<std::int32_t>(st.code()));
  w.str(st.message());
  w.i32(st.ok() ? static_cast<std::int32_t>(table.size()) : 0);
  if (st.ok()) {
    for (const Entry& e : table) {
      w.str(e.hostname);
      w.i32(e.node);
      w.bytes(e.cpus);
      w.bytes(e.blob);
    }
  }
  return std::move(w.data());
}

Status decode_verdict(std::span<const std::byte> b, const std::string& where, std::vector<Entry>* table) {
  net::Reader r(b);
  if (r.u32() != kMagic || r.u16() != kVersion || r.u16() != kTable) {
    return {Result::remote_error, "rendezvous at " + where + ": malformed answer from the root"};
  }
  const int code = r.i32();
  std::string msg = r.str();
  const int n = r.i32();
  if (!r.ok()) return {Result::remote_error, "rendezvous at " + where + ": malformed answer from the root"};
  if (code != 0) {
    const Result res = code >= 1 && code <= static_cast<int>(Result::timeout) ? static_cast<Result>(code)
                                                                              : Result::remote_error;
    return {res, std::move(msg)};
  }
  table->clear();
  for (int i = 0; i < n && r.ok(); ++i) {
    Entry e;
    e.hostname = r.str();
    e.node = r.i32();
    e.cpus = r.bytes();
    e.blob = r.bytes();
    table->push_back(std::move(e));
  }
  if (!r.ok() || !r.at_end()) return {Result::remote_error, "rendezvous at " + where + ": malformed table from the root"};
  return {};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  const std::size_t shown = std::min<std::size_t>(ranks.size(), 32);
  for (std::size_t i = 0; i < shown; ++i) s += (i > 0 ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > shown) s += ", ... (" + std::to_string(ranks.size() - shown) + " more)";
  return s;
}

// ------------------------------------------------------------ root service

// Everything the root thread touches is owned here, so the thread never uses
// state that a process exit could destroy under it.
struct RootService {
  net::Fd listener;
  std::string where;
  std::uint64_t nonce = 0;
  bool has_deadline = false;
  Clock::time_point deadline{};

  struct Conn {
    net::Fd fd;
    std::vector<std::byte> in;
    bool greeted = false;
    int rank = -1;
  };
  std::vector<std::unique_ptr<Conn>> conns;
  int nranks = -1;
  std::vector<Conn*> by_rank;
  std::vector<Entry> table;
  std::vector<int> departed;
  int arrived = 0;
  Status poison;          // set once the rendezvous cannot succeed
  bool drop_all = false;  // poisoned: every connection was answered; close them

  void run();
  void accept_all();
  bool read_conn(Conn& c);  // false: close it
  void on_hello(Conn& c, const Hello& h);
  void reply(Conn& c, const Status& st);
  void poison_all(const Status& st);
  Status missing_status() const;
};

void RootService::reply(Conn& c, const Status& st) {
  // Bounded: a rank that stopped reading cannot hold the root for long.
  (void)net::send_frame(c.fd.get(), encode_verdict(st, table), Clock::now() + std::chrono::seconds(5));
}

void RootService::poison_all(const Status& st) {
  poison = st;
  for (auto& c : conns) {
    if (c->greeted) reply(*c, st);
  }
  drop_all = true;  // run() closes them once no Conn& is in use
}

Status RootService::missing_status() const {
  std::vector<int> missing;
  for (int r = 0; r < nranks; ++r) {
    if (by_rank[static_cast<std::size_t>(r)] == nullptr) missing.push_back(r);
  }
  std::string msg = "rendezvous at " + where + ": " + std::to_string(arrived) + " of " + std::to_string(nranks) +
                    " ranks arrived; missing rank(s) " + rank_list(missing);
  if (!departed.empty()) msg += " (rank(s) " + rank_list(departed) + " connected, then left)";
  return {Result::timeout, msg};
}

void RootService::on_hello(Conn& c, const Hello& h) {
  const auto now = Clock::now();
  const auto until = now + std::chrono::milliseconds(h.remaining_ms);
  if (!has_deadline || until < deadline) deadline = until;
  has_deadline = true;
  if (h.nonce != nonce) {
    reply(c, {Result::invalid_argument, "rendezvous at " + where + ": rank " + std::to_string(h.rank) +
                                            " holds a unique id of another rendezvous"});
    c.fd.reset();
    return;
  }
  c.greeted = true;
  c.rank = h.rank;
  if (!poison.ok()) {
    reply(c, poison);
    c.fd.reset();
    return;
  }
  if (nranks < 0) {
    if (h.nranks < 1 || h.nranks > kMaxRanks) {
      poison_all({Result::invalid_argument, "rendezvous at " + where + ": rank " + std::to_string(h.rank) +
                                                " asked for " + std::to_string(h.nranks) + " ranks"});
      return;
    }
    nranks = h.nranks;
    by_rank.assign(static_cast<std::size_t>(nranks), nullptr);
    table.assign(static_cast<std::size_t>(nranks), Entry{});
  }
  if (h.nranks != nranks) {
    poison_all({Result::invalid_usage, "rendezvous at " + where + ": ranks disagree on the number of ranks (rank " +
                                           std::to_string(h.rank) + " says " + std::to_string(h.nranks) +
                                           ", an earlier rank said " + std::to_string(nranks) + ")"});
    return;
  }
  if (h.rank < 0 || h.rank >= nranks) {
    poison_all({Result::invalid_argument, "rendezvous at " + where + ": rank " + std::to_string(h.rank) +
                                              " out of range for " + std::to_string(nranks) + " ranks"});
    return;
  }
  const auto r = static_cast<std::size_t>(h.rank);
  if (by_rank[r] != nullptr) {
    poison_all({Result::invalid_usage, "rendezvous at " + where + ": rank " + std::to_string(h.rank) +
                                           " joined twice (hosts " + table[r].hostname + " and " +
                                           h.entry.hostname + ")"});
    return;
  }
  by_rank[r] = &c;
  table[r] = h.entry;
  departed.erase(std::remove(departed.begin(), departed.end(), h.rank), departed.end());
  ++arrived;
}

void RootService::accept_all() {
  for (;;) {
    const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or a transient error: poll again
    auto c = std::make_unique<Conn>();
    c->fd = net::Fd(fd);
    conns.push_back(std::move(c));
  }
}

bool RootService::read_conn(Conn& c) {
  std::byte buf[16384];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      c.in.insert(c.in.end(), buf, buf + n);
      continue;
    }
    if (n == 0) return false;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return false;
  }
  while (c.in.size() >= 4) {
    net::Reader r(std::span(c.in.data(), 4));
    const std::uint32_t len = r.u32();
    if (len > net::kMaxFrame || c.greeted) return false;  // one hello per connection
    if (c.in.size() < 4 + std::size_t{len}) break;
    Hello h;
    if (!decode_hello(std::span(c.in.data() + 4, len), &h)) return false;  // not one of ours
    c.in.clear();
    on_hello(c, h);
    if (drop_all || !c.fd.valid()) return false;
  }
  return true;
}

void RootService::run() {
  if (!has_deadline) deadline = Clock::now() + kRootIdleLimit;
  for (;;) {
    if (nranks > 0 && arrived == nranks && poison.ok()) {
      for (Conn* c : by_rank) reply(*c, Status{});
      return;
    }
    if (Clock::now() >= deadline) {
      if (poison.ok() && nranks > 0) {
        const Status st = missing_status();
        for (Conn* c : by_rank) {
          if (c != nullptr) reply(*c, st);
        }
      }
      return;
    }
    std::vector<pollfd> fds;
    fds.push_back({listener.get(), POLLIN, 0});
    for (auto& c : conns) fds.push_back({c->fd.get(), POLLIN, 0});
    const int rc = ::poll(fds.data(), fds.size(), net::poll_timeout_ms(deadline));
    if (rc < 0 && errno != EINTR) return;
    if (rc <= 0) continue;
    if ((fds[0].revents & POLLIN) != 0) accept_all();
    // Only the connections that existed when poll() was called.
    const std::size_t polled = fds.size() - 1;
    std::vector<std::size_t> drop;
    for (std::size_t i = 0; i < polled && i < conns.size(); ++i) {
      if (fds[i + 1].revents == 0) continue;
      if (!read_conn(*conns[i])) drop.push_back(i);
      if (drop_all) break;
    }
    if (drop_all) {
      conns.clear();
      by_rank.assign(by_rank.size(), nullptr);
      arrived = 0;
      drop_all = false;
      continue;
    }
    for (auto it = drop.rbegin(); it != drop.rend(); ++it) {
      if (*it >= conns.size()) continue;
      Conn* c = conns[*it].get();
      if (c->rank >= 0 && c->rank < nranks && by_rank[static_cast<std::size_t>(c->rank)] == c) {
        // The rank left before the table was complete: it is missing again.
        by_rank[static_cast<std::size_t>(c->rank)] = nullptr;
        departed.push_back(c->rank);
        --arrived;
      }
      conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(*it));
    }
  }
}

Status start_root(std::unique_ptr<RootService> root) {
  try {
    std::thread([r = std::move(root)] { r->run(); }).detach();
  } catch (const std::exception& e) {
    return {Result::system_error, std::string("cannot start the rendezvous root thread: ") + e.what()};
  }
  return {};
}

// ------------------------------------------------------------ rank side

[[maybe_unused]] Status local_entry(Entry* e) {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "unknown");
  e->hostname = host;
  e->node = -1;
  e->cpus = affinity_bitmap();
  if (const char* v = std::getenv("CCLZ_NODE_ID"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || n < 0 || n > INT_MAX) {
      return {Result::invalid_argument, std::string("CCLZ_NODE_ID=") + v + " is not a non-negative integer"};
    }
    e->node = static_cast<int>(n);
  }
  return {};
}

[[maybe_unused]] Status exchange_with_root(const net::SockAddr& root, const std::string& where, std::uint64_t nonce, int nranks,
                          int rank, Clock::time_point deadline, const Entry& mine, std::vector<Entry>* table) {
  net::Fd fd;
  if (Status st = net::connect_retry(root, deadline, &fd); !st.ok()) {
    return {st.code(), "rank " + std::to_string(rank) + ": " + st.message()};
  }
  Hello h;
  h.nonce = nonce;
  h.nranks = nranks;
  h.rank = rank;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  h.remaining_ms = static_cast<std::uint32_t>(std::clamp<long long>(left, 0, INT_MAX));
  h.entry = mine;
  if (Status st = net::send_frame(fd.get(), encode_hello(h), deadline); !st.ok()) {
    return {st.code(), "rendezvous at " + where + ": sending hello: " + st.message()};
  }
  std::vector<std::byte> answer;
  // Saturating: a caller may pass time_point::max() for "no deadline".
  const auto verdict_deadline =
      deadline > Clock::time_point::max() - kVerdictGrace ? Clock::time_point::max() : deadline + kVerdictGrace;
  if (Status st = net::recv_frame(fd.get(), &answer, verdict_deadline); !st.ok()) {
    if (st.code() == Result::timeout) {
      return {Result::timeout, "rendezvous at " + where + ": rank " + std::to_string(rank) +
                                   " got no answer from the root before the deadline"};
    }
    return {st.code(), "rendezvous at " + where + ": the root closed the connection (" + st.message() +
                           "; did the process that made the unique id exit?)"};
  }
  if (Status st = decode_verdict(answer, where, table); !st.ok()) return st;
  if (table->size() != static_cast<std::size_t>(nranks)) {
    return {Result::remote_error, "rendezvous at " + where + ": table has " + std::to_string(table->size()) +
                                      " ranks, expected " + std::to_string(nranks)};
  }
  return {};
}

Status check_ranks(int nranks, int rank) {
  if (nranks < 1 || nranks > kMaxRanks) {
    return {Result::invalid_argument, "nranks " + std::to_string(nranks) + " out of range 1.." +
                                          std::to_string(kMaxRanks)};
  }
  if (rank < 0 || rank >= nranks) {
    return {Result::invalid_argument, "rank " + std::to_string(rank) + " out of range for " +
                                          std::to_string(nranks) + " ranks"};
  }
  return {};
}

[[maybe_unused]] Status no_ucx() { return {Result::system_error, "cclz was built without UCX"}; }

// Makes the transport, meets the others at the root, connects.
Status join(const net::SockAddr& root, const std::string& where, std::uint64_t nonce, int nranks, int rank,
            Clock::time_point deadline, World* out) {
#if CCLZ_HAVE_UCX
  Entry mine;
  if (Status st = local_entry(&mine); !st.ok()) return st;
  std::unique_ptr<UcxTransport> t;
  if (Status st = UcxTransport::create(rank, nranks, &t); !st.ok()) return st;
  const auto addr = t->address();
  mine.blob.assign(addr.begin(), addr.end());
  std::vector<Entry> table;
  if (Status st = exchange_with_root(root, where, nonce, nranks, rank, deadline, mine, &table); !st.ok()) return st;
  std::vector<std::vector<std::byte>> blobs;
  World w;
  for (Entry& e : table) {
    blobs.push_back(std::move(e.blob));
    w.ranks.push_back(RankInfo{std::move(e.hostname), e.node, std::move(e.cpus)});
  }
  if (Status st = t->connect(blobs); !st.ok()) return st;
  w.transport = std::move(t);
  *out = std::move(w);
  return {};
#else
  (void)root, (void)where, (void)nonce, (void)nranks, (void)rank, (void)deadline, (void)out;
  return no_ucx();
#endif
}

// UniqueId layout: magic u32, version u16, family u16 (4 or 6), port u16,
// 16 address bytes, nonce u64; the rest zero.
constexpr std::size_t kIdUsed = 4 + 2 + 2 + 2 + 16 + 8;
static_assert(kIdUsed <= sizeof(UniqueId::internal));

void encode_id(const net::SockAddr& a, std::uint64_t nonce, UniqueId* id) {
  net::Writer w;
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(a.family() == AF_INET6 ? 6 : 4);
  w.u16(static_cast<std::uint16_t>(a.port()));
  auto raw = a.raw_address();
  raw.resize(16, 0);
  for (std::uint8_t b : raw) w.u8(b);
  w.u64(nonce);
  std::memset(id->internal, 0, sizeof id->internal);
  std::memcpy(id->internal, w.data().data(), w.data().size());
}

Status decode_id(const UniqueId& id, net::SockAddr* a, std::uint64_t* nonce) {
  net::Reader r(std::as_bytes(std::span(id.internal)));
  const std::uint32_t magic = r.u32();
  const std::uint16_t version = r.u16();
  const std::uint16_t fam = r.u16();
  const std::uint16_t port = r.u16();
  std::uint8_t raw[16];
  for (std::uint8_t& b : raw) b = r.u8();
  *nonce = r.u64();
  if (magic != kMagic) return {Result::invalid_argument, "not a cclz unique id (bad magic)"};
  if (version != kVersion) {
    return {Result::invalid_argument, "unique id of cclz bootstrap version " + std::to_string(version) +
                                          ", this library speaks version " + std::to_string(kVersion)};
  }
  if ((fam != 4 && fam != 6) || port == 0 ||
      !net::SockAddr::from_raw(fam == 6 ? AF_INET6 : AF_INET, raw, port, a)) {
    return {Result::invalid_argument, "corrupt cclz unique id"};
  }
  return {};
}

}  // namespace

Status make_unique_id(UniqueId* id) {
  if (id == nullptr) return {Result::invalid_argument, "null unique id"};
  net::SockAddr advertised;
  std::string ifname;
  if (Status st = net::pick_local_address(&advertised, &ifname); !st.ok()) return st;
  auto root = std::make_unique<RootService>();
  net::SockAddr bound;
  // Bind every interface of the chosen family and advertise the picked
  // address: peers on other hosts use it, ranks here may use any route.
  if (Status st = net::listen_on(net::SockAddr::wildcard(advertised.family(), 0), false, 1024, &root->listener,
                                 &bound);
      !st.ok()) {
    return st;
  }
  advertised.set_port(bound.port());
  std::random_device rd;
  const std::uint64_t nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
                              static_cast<std::uint64_t>(Clock::now().time_since_epoch().count()) ^
                              (static_cast<std::uint64_t>(::getpid()) << 16);
  root->where = advertised.to_string();
  root->nonce = nonce;
  encode_id(advertised, nonce, id);
  return start_root(std::move(root));
}

Status connect_unique_id(const UniqueId& id, int nranks, int rank, Clock::time_point deadline, World* out) {
  if (out == nullptr) return {Result::invalid_argument, "null world"};
  if (Status st = check_ranks(nranks, rank); !st.ok()) return st;
  net::SockAddr root;
  std::uint64_t nonce = 0;
  if (Status st = decode_id(id, &root, &nonce); !st.ok()) return st;
  return join(root, root.to_string(), nonce, nranks, rank, deadline, out);
}

Status connect_host_port(const std::string& host, int port, int nranks, int rank, Clock::time_point deadline,
                         World* out) {
  if (out == nullptr) return {Result::invalid_argument, "null world"};
  if (Status st = check_ranks(nranks, rank); !st.ok()) return st;
  if (port < 1 || port > 65535) return {Result::invalid_argument, "port " + std::to_string(port) + " out of range"};
#if !CCLZ_HAVE_UCX
  (void)host, (void)deadline;
  return no_ucx();
#else
  net::SockAddr addr;
  if (Status st = net::resolve(host, port, &addr); !st.ok()) return st;
  const std::string where = host + ":" + std::to_string(port);
  net::SockAddr target = addr;
  if (rank == 0) {
    auto root = std::make_unique<RootService>();
    const bool local = net::is_local_address(addr);
    const net::SockAddr bind_addr = local ? addr : net::SockAddr::wildcard(addr.family(), port);
    net::SockAddr bound;
    if (Status st = net::listen_on(bind_addr, true, 1024, &root->listener, &bound); !st.ok()) {
      return {st.code(), "rank 0 cannot start the rendezvous root at " + where + ": " + st.message()};
    }
    if (!local) target = net::SockAddr::loopback(addr.family(), port);
    root->where = where;
    root->nonce = 0;
    root->has_deadline = true;
    root->deadline = deadline;
    if (Status st = start_root(std::move(root)); !st.ok()) return st;
  }
  return join(target, where, 0, nranks, rank, deadline, out);
#endif
}

namespace {

// Waits for `ops`; on failure cancels what is still posted, so the caller may
// release the buffers.
Status wait_or_cancel(Transport& t, std::span<Op* const> ops, Clock::time_point deadline) {
  Status st = t.wait(ops, deadline);
  if (!st.ok()) {
    for (Op* op : ops) {
      if (op->handle != nullptr && !op->done) t.cancel(op);
    }
  }
  return st;
}

Status wait_or_cancel(Transport& t, std::vector<Op>& ops, Clock::time_point deadline) {
  std::vector<Op*> ptrs;
  for (Op& op : ops) ptrs.push_back(&op);
  return wait_or_cancel(t, ptrs, deadline);
}

std::array<std::byte, 8> encode_u64(std::uint64_t v) {
  std::array<std::byte, 8> b;
  for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
  return b;
}

std::uint64_t decode_u64(const std::array<std::byte, 8>& b) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(b[static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}

// Gathers every member's blob at members[0] and sends the table back
// (length first: a receive must know its exact size). Tags tag_base+0..3.
[[maybe_unused]] Status exchange_blobs(Transport& parent, const std::vector<int>& members, int me, std::uint64_t tag_base,
                      std::span<const std::byte> mine, Clock::time_point deadline,
                      std::vector<std::vector<std::byte>>* blobs) {
  const auto n = members.size();
  const auto coll = Transport::Traffic::collective;
  const std::uint64_t t_len = tag_base, t_blob = tag_base + 1, t_tlen = tag_base + 2, t_table = tag_base + 3;
  blobs->assign(n, {});
  if (me == 0) {
    (*blobs)[0].assign(mine.begin(), mine.end());
    std::vector<std::array<std::byte, 8>> lens(n);
    std::vector<Op> ops(n - 1);
    for (std::size_t i = 1; i < n; ++i) {
      if (Status st = parent.post_recv(members[i], t_len, lens[i].data(), 8, &ops[i - 1], coll); !st.ok()) {
        ops.resize(i - 1);
        (void)wait_or_cancel(parent, ops, Clock::now());
        return st;
      }
    }
    if (Status st = wait_or_cancel(parent, ops, deadline); !st.ok()) return st;
    for (std::size_t i = 1; i < n; ++i) {
      const std::uint64_t len = decode_u64(lens[i]);
      if (len > net::kMaxFrame) {
        return {Result::remote_error, "split: rank " + std::to_string(members[i]) + " sent a bad address length"};
      }
      (*blobs)[i].resize(len);
      if (Status st = parent.post_recv(members[i], t_blob, (*blobs)[i].data(), len, &ops[i - 1], coll); !st.ok()) {
        ops.resize(i - 1);
        (void)wait_or_cancel(parent, ops, Clock::now());
        return st;
      }
    }
    if (Status st = wait_or_cancel(parent, ops, deadline); !st.ok()) return st;
    net::Writer w;
    for (const auto& b : *blobs) w.bytes(b);
    const std::vector<std::byte>& table = w.data();
    const auto tlen = encode_u64(table.size());
    std::vector<Op> sends(2 * (n - 1));
    for (std::size_t i = 1; i < n; ++i) {
      Status st = parent.post_send(members[i], t_tlen, tlen.data(), 8, &sends[2 * (i - 1)], coll);
      if (st.ok()) st = parent.post_send(members[i], t_table, table.data(), table.size(), &sends[2 * i - 1], coll);
      if (!st.ok()) {
        sends.resize(2 * (i - 1));
        (void)wait_or_cancel(parent, sends, Clock::now());
        return st;
      }
    }
    return wait_or_cancel(parent, sends, deadline);
  }
  const int root = members[0];
  const auto len = encode_u64(mine.size());
  std::array<std::byte, 8> tlen_buf{};
  Op ops[3];
  if (Status st = parent.post_recv(root, t_tlen, tlen_buf.data(), 8, &ops[0], coll); !st.ok()) return st;
  Status st = parent.post_send(root, t_len, len.data(), 8, &ops[1], coll);
  if (st.ok()) st = parent.post_send(root, t_blob, mine.data(), mine.size(), &ops[2], coll);
  if (!st.ok()) {
    Op* posted[] = {&ops[0], &ops[1]};
    (void)wait_or_cancel(parent, std::span(posted, ops[1].handle != nullptr ? 2u : 1u), Clock::now());
    return st;
  }
  Op* all3[] = {&ops[0], &ops[1], &ops[2]};
  if (Status s2 = wait_or_cancel(parent, all3, deadline); !s2.ok()) return s2;
  const std::uint64_t tlen = decode_u64(tlen_buf);
  if (tlen > std::uint64_t{1} << 32) return {Result::remote_error, "split: bad address table length from the root"};
  std::vector<std::byte> table(tlen);
  Op r;
  if (Status s2 = parent.post_recv(root, t_table, table.data(), table.size(), &r, coll); !s2.ok()) return s2;
  Op* one[] = {&r};
  if (Status s2 = wait_or_cancel(parent, one, deadline); !s2.ok()) return s2;
  net::Reader rd(table);
  for (std::size_t i = 0; i < n; ++i) (*blobs)[i] = rd.bytes();
  if (!rd.ok() || !rd.at_end()) return {Result::remote_error, "split: malformed address table"};
  return {};
}

}  // namespace

Status connect_subgroup(Transport& parent, const std::vector<int>& members, std::uint64_t tag_base,
                        const std::vector<RankInfo>& parent_ranks, Clock::time_point deadline, World* out) {
  if (out == nullptr) return {Result::invalid_argument, "null world"};
  const int psize = parent.size();
  if (members.empty()) return {Result::invalid_argument, "split: no members"};
  if (parent_ranks.size() != static_cast<std::size_t>(psize)) {
    return {Result::invalid_argument, "split: " + std::to_string(parent_ranks.size()) + " rank infos for a parent of " +
                                          std::to_string(psize) + " ranks"};
  }
  int me = -1;
  std::vector<bool> seen(static_cast<std::size_t>(psize), false);
  for (std::size_t i = 0; i < members.size(); ++i) {
    const int m = members[i];
    if (m < 0 || m >= psize || seen[static_cast<std::size_t>(m)]) {
      return {Result::invalid_argument, "split: bad member list (rank " + std::to_string(m) + ")"};
    }
    seen[static_cast<std::size_t>(m)] = true;
    if (m == parent.rank()) me = static_cast<int>(i);
  }
  if (me < 0) {
    return {Result::invalid_argument, "split: rank " + std::to_string(parent.rank()) + " is not among the members"};
  }
  if (tag_base > (std::uint64_t{1} << Transport::kTagBits) - 4) {
    return {Result::invalid_argument, "split: tag_base leaves no room for its 4 tags"};
  }
#if !CCLZ_HAVE_UCX
  (void)deadline;
  return no_ucx();
#else
  const int n = static_cast<int>(members.size());
  std::unique_ptr<UcxTransport> t;
  if (Status st = UcxTransport::create(me, n, &t); !st.ok()) return st;
  std::vector<std::vector<std::byte>> blobs;
  if (n == 1) {
    const auto a = t->address();
    blobs.emplace_back(a.begin(), a.end());
  } else if (Status st = exchange_blobs(parent, members, me, tag_base, t->address(), deadline, &blobs); !st.ok()) {
    return st;
  }
  if (Status st = t->connect(blobs); !st.ok()) return st;
  World w;
  for (int m : members) w.ranks.push_back(parent_ranks[static_cast<std::size_t>(m)]);
  w.transport = std::move(t);
  *out = std::move(w);
  return {};
#endif
}

}  // namespace cclz::detail
