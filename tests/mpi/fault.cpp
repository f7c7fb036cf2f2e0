// Fault tests: peers that die, stall or never arrive. Not under mpiexec,
// because hydra tears the whole job down when a process is killed; instead
// this program is its own launcher. Run as `cclz-fault <scenario>`, it picks
// a free port, forks the ranks (re-executing itself with the torchrun
// variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and a
// short CCLZ_TIMEOUT), waits for them under its own deadline (killing and
// reporting any that hang), and checks how each one ended: the victim the
// way the scenario ends it, every survivor with exit status 0, which a
// worker only gives after it saw the error the scenario expects, within the
// time bound, with a message naming the missing rank (and, for a collective,
// its sequence number).
//
// Scenarios:
//   kill        rank 2 of 4 SIGKILLs itself with a large all_reduce in flight
//   exit        rank 1 of 3 _exit()s (sockets closed by the kernel) instead of
//               joining an all_reduce
//   stall       rank 1 of 3 stays alive but joins the all_reduce only after
//               the others' timeout; they must fail with a timeout
//   abort       rank 0 of 3 calls Comm::abort() instead of joining
//   rendezvous  WORLD_SIZE=3, only ranks 0 and 1 start: both time out
//               naming rank 2 (environment launch)
//   rendezvous-uid  the same through a unique id made by this launcher
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cclz/cclz.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// The CCLZ_TIMEOUT the workers run with, and the slack allowed on top of it
// for a loaded 2-core machine to schedule the processes that report.
constexpr int kTimeoutS = 3;
constexpr double kSlackS = 3.0;

// Collectives every worker completes before the fault, so the faulty one
// has a known sequence number whether the library counts from 0 or 1.
constexpr int kWarmup = 3;

struct Scenario {
  const char* name;
  int world;              // WORLD_SIZE the workers are told
  int started;            // processes actually started (ranks 0..started-1)
  int victim;             // rank that misbehaves (-1: none)
  const char* victim_end; // "sigkill", "exit0" or "ok"
  bool collective;        // fault inside a collective (else in the rendezvous)
  bool unique_id;         // rendezvous through a unique id instead of env
};

constexpr Scenario kScenarios[] = {
    {"kill", 4, 4, 2, "sigkill", true, false},
    {"exit", 3, 3, 1, "exit0", true, false},
    {"stall", 3, 3, 1, "ok", true, false},
    {"abort", 3, 3, 0, "ok", true, false},
    {"rendezvous", 3, 2, 2, "absent", false, false},
    {"rendezvous-uid", 3, 2, 2, "absent", false, true},
};

const Scenario* find_scenario(std::string_view s) {
  for (const Scenario& sc : kScenarios) {
    if (s == sc.name) return &sc;
  }
  return nullptr;
}

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s != nullptr && *s != '\0' ? std::atoi(s) : fallback;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Whether `msg` names number `v` right after one of `words` (allowing "s",
// spaces, ':', '=', '#', '[' and lists "1, 2 and 3").
bool names_number(const std::string& msg, int v, std::initializer_list<std::string_view> words) {
  const std::string m = lower(msg);
  for (std::string_view w : words) {
    for (std::size_t pos = m.find(w); pos != std::string::npos; pos = m.find(w, pos + 1)) {
      std::size_t i = pos + w.size();
      while (i < m.size() && std::isalpha(static_cast<unsigned char>(m[i]))) ++i;  // "ranks", "sequence"
      if (m.compare(i, 3, "(s)") == 0) i += 3;                                      // "rank(s)"
      for (;;) {
        while (i < m.size() && std::strchr(" :=#[(,{", m[i]) != nullptr) ++i;
        if (m.compare(i, 4, "and ") == 0) {
          i += 4;
          continue;
        }
        if (i >= m.size() || !std::isdigit(static_cast<unsigned char>(m[i]))) break;
        long x = 0;
        while (i < m.size() && std::isdigit(static_cast<unsigned char>(m[i]))) x = x * 10 + (m[i++] - '0');
        if (x == v) return true;
        if (i < m.size() && m[i] == '/') {  // "rank 2/4": skip the size
          ++i;
          while (i < m.size() && std::isdigit(static_cast<unsigned char>(m[i]))) ++i;
        }
      }
    }
  }
  return false;
}

// ---- worker ------------------------------------------------------------------

// Exit status of a survivor whose error was right but named the peer it was
// blocked on rather than the victim.
constexpr int kNamedOtherPeer = 3;

int fail(int rank, const std::string& why) {
  std::fprintf(stderr, "[fault worker %d] FAIL: %s\n", rank, why.c_str());
  return 1;
}

std::string hex_decode(std::string_view h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

// Checks the error a survivor saw: not ok, within the bound, naming the
// misbehaving rank and (for a collective) its sequence number.
int check_error(const Scenario& sc, int rank, const cclz::Status& st, double secs, const char* where) {
  std::fprintf(stderr, "[fault worker %d] %s: after %.2f s: %s\n", rank, where, secs, st.to_string().c_str());
  if (st.ok()) return fail(rank, std::string(where) + " succeeded although rank " + std::to_string(sc.victim) +
                                     " never took part");
  int bad = 0;
  if (secs > kTimeoutS + kSlackS) {
    bad = fail(rank, std::string(where) + " took " + std::to_string(secs) + " s, more than CCLZ_TIMEOUT=" +
                         std::to_string(kTimeoutS) + " s + " + std::to_string(kSlackS) + " s");
  }
  if (!sc.collective && st.code() != cclz::Result::timeout) {
    bad = fail(rank, "a rendezvous that never completes must end in Result::timeout");
  }
  if (std::string(sc.name) == "stall" && st.code() != cclz::Result::timeout) {
    bad = fail(rank, "a live peer that never joins must end in Result::timeout");
  }
  // Every survivor names the peer it was blocked on. In a ring that is the
  // victim only for its neighbours; the others name a live rank that was
  // itself blocked, so the chain of messages leads to the victim. The
  // launcher checks that at least one survivor names the victim itself.
  bool names_victim = names_number(st.message(), sc.victim, {"rank", "peer"});
  bool names_other = false;
  for (int r = 0; r < sc.world && !names_victim && !names_other; ++r) {
    if (r != rank && r != sc.victim) names_other = names_number(st.message(), r, {"rank", "peer"});
  }
  if (!names_victim && !(sc.collective && names_other)) {
    bad = fail(rank, "the message names neither rank " + std::to_string(sc.victim) + " nor the peer it waited on");
  }
  if (bad == 0 && !names_victim) bad = kNamedOtherPeer;
  if (sc.collective) {
    if (lower(st.message()).find("all_reduce") == std::string::npos) {
      bad = fail(rank, "the message does not name the collective (all_reduce)");
    }
    // Sequence numbers count collectives on this communicator: kWarmup done
    // before, so this is number kWarmup (from 0) or kWarmup + 1 (from 1).
    if (!names_number(st.message(), kWarmup, {"#", "seq", "sequence", "collective"}) &&
        !names_number(st.message(), kWarmup + 1, {"#", "seq", "sequence", "collective"})) {
      bad = fail(rank, "the message does not give the collective's sequence number (" + std::to_string(kWarmup) +
                           " or " + std::to_string(kWarmup + 1) + ")");
    }
  }
  return bad;
}

int worker(const Scenario& sc) {
  const int rank = env_int("RANK", -1);
  const auto t0 = Clock::now();
  std::unique_ptr<cclz::Comm> c;
  cclz::Status st;
  if (sc.unique_id) {
    const char* hex = std::getenv("CCLZ_TEST_UID");
    if (hex == nullptr) return fail(rank, "CCLZ_TEST_UID missing");
    std::string raw = hex_decode(hex);
    cclz::UniqueId id{};
    if (raw.size() != sizeof id.internal) return fail(rank, "CCLZ_TEST_UID has the wrong length");
    std::memcpy(id.internal, raw.data(), sizeof id.internal);
    st = cclz::Comm::init_rank(&c, sc.world, id, rank);
  } else {
    st = cclz::Comm::init_from_env(&c);
  }
  const double init_secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!sc.collective) return check_error(sc, rank, st, init_secs, "rendezvous");
  if (!st.ok() || !c) return fail(rank, "init_from_env: " + st.to_string());

  for (int i = 0; i < kWarmup; ++i) {
    std::int64_t x = rank, y = -1;
    st = c->all_reduce(&x, &y, 1, cclz::DataType::i64, cclz::ReduceOp::sum).wait();
    if (!st.ok()) return fail(rank, "warm-up all_reduce " + std::to_string(i) + ": " + st.to_string());
    if (y != std::int64_t{sc.world} * (sc.world - 1) / 2) return fail(rank, "warm-up all_reduce gave a wrong sum");
  }

  // Large enough that the all_reduce is mid-transfer when the victim dies.
  std::vector<float> a(4u << 20, 1.0f), b(a.size(), 0.0f);
  if (rank == sc.victim) {
    const std::string how = sc.name;
    if (how == "kill") {
      cclz::Request q = c->all_reduce(a.data(), b.data(), a.size(), cclz::DataType::f32, cclz::ReduceOp::sum);
      // 1 ms: the 16 MB ring needs ~10 ms, so the victim dies mid-transfer.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ::raise(SIGKILL);
    }
    if (how == "exit") ::_exit(0);
    if (how == "abort") {
      c->abort();
      // Everything after abort fails at once, locally.
      cclz::Status later = c->all_reduce(a.data(), b.data(), 16, cclz::DataType::f32, cclz::ReduceOp::sum).wait();
      if (later.ok()) return fail(rank, "an all_reduce after abort() succeeded");
      return 0;
    }
    if (how == "stall") {
      // Alive and connected, but late past everyone's deadline. Then it
      // joins: it must get an error too (its peers gave up), not hang.
      std::this_thread::sleep_for(std::chrono::seconds(kTimeoutS + 2));
      const auto t1 = Clock::now();
      cclz::Status late = c->all_reduce(a.data(), b.data(), a.size(), cclz::DataType::f32, cclz::ReduceOp::sum).wait();
      const double secs = std::chrono::duration<double>(Clock::now() - t1).count();
      std::fprintf(stderr, "[fault worker %d] late all_reduce after %.2f s: %s\n", rank, secs, late.to_string().c_str());
      if (late.ok()) return fail(rank, "the late rank's all_reduce succeeded although its peers had timed out");
      if (secs > kTimeoutS + kSlackS) return fail(rank, "the late rank hung past the bound");
      const auto t2 = Clock::now();
      cclz::Status d = c->destroy();
      if (std::chrono::duration<double>(Clock::now() - t2).count() > kTimeoutS + kSlackS) {
        return fail(rank, "destroy() on the late rank hung");
      }
      (void)d;
      return 0;
    }
    return fail(rank, "unknown victim behaviour");
  }

  const auto t1 = Clock::now();
  st = c->all_reduce(a.data(), b.data(), a.size(), cclz::DataType::f32, cclz::ReduceOp::sum).wait();
  const double secs = std::chrono::duration<double>(Clock::now() - t1).count();
  int rc = check_error(sc, rank, st, secs, "all_reduce");
  // The communicator stays in error; destroying it must not hang either.
  if (!c->async_error().ok()) {
    std::fprintf(stderr, "[fault worker %d] async_error: %s\n", rank, c->async_error().to_string().c_str());
  } else {
    rc |= fail(rank, "async_error() is success after a failed collective");
  }
  const auto t2 = Clock::now();
  cclz::Status d = c->destroy();
  const double dsecs = std::chrono::duration<double>(Clock::now() - t2).count();
  if (dsecs > kTimeoutS + kSlackS) rc |= fail(rank, "destroy() after the error took " + std::to_string(dsecs) + " s");
  (void)d;
  c.reset();
  return rc;
}

// ---- launcher ----------------------------------------------------------------

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

std::string hex_encode(const void* p, std::size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char b = static_cast<const unsigned char*>(p)[i];
    s.push_back(d[b >> 4]);
    s.push_back(d[b & 15]);
  }
  return s;
}

int launch(const Scenario& sc, const char* self) {
  const int port = free_port();
  if (port <= 0) {
    std::fprintf(stderr, "cclz-fault: no free port\n");
    return 2;
  }
  // The unique id's rendezvous service lives in this process, like a job
  // script that makes the id and hands it to the ranks.
  std::string uid_hex;
  if (sc.unique_id) {
    cclz::UniqueId id{};
    cclz::Status st = cclz::Comm::create_unique_id(&id);
    if (!st.ok()) {
      std::fprintf(stderr, "cclz-fault: create_unique_id: %s\n", st.to_string().c_str());
      return 1;
    }
    uid_hex = hex_encode(id.internal, sizeof id.internal);
  }
  std::fprintf(stderr, "cclz-fault %s: %d of %d ranks, CCLZ_TIMEOUT=%d, port %d\n", sc.name, sc.started, sc.world,
               kTimeoutS, port);
  std::map<pid_t, int> rank_of;
  for (int r = 0; r < sc.started; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (auto& [p, q] : rank_of) ::kill(p, SIGKILL);
      return 2;
    }
    if (pid == 0) {
      ::setenv("RANK", std::to_string(r).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(sc.world).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(sc.world).c_str(), 1);
      ::setenv("MASTER_ADDR", "127.0.0.1", 1);
      ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      ::setenv("CCLZ_TIMEOUT", std::to_string(kTimeoutS).c_str(), 1);
      ::setenv("CCLZ_FAULT_WORKER", "1", 1);
      if (!uid_hex.empty()) ::setenv("CCLZ_TEST_UID", uid_hex.c_str(), 1);
      ::execl(self, self, sc.name, static_cast<char*>(nullptr));
      std::perror("execl");
      ::_exit(127);
    }
    rank_of[pid] = r;
  }

  // Every worker has a bound; past it (plus start-up) a worker is hung.
  const auto deadline = Clock::now() + std::chrono::seconds(4 * kTimeoutS + 20);
  std::map<int, int> status_of;  // rank -> wait status
  while (status_of.size() < rank_of.size()) {
    int ws = 0;
    pid_t p = ::waitpid(-1, &ws, WNOHANG);
    if (p > 0) {
      status_of[rank_of[p]] = ws;
      continue;
    }
    if (Clock::now() > deadline) {
      for (auto& [pid, r] : rank_of) {
        if (status_of.count(r) == 0) {
          std::fprintf(stderr, "cclz-fault %s: rank %d HUNG (no exit after %d s); killing it\n", sc.name, r,
                       4 * kTimeoutS + 20);
          ::kill(pid, SIGKILL);
          ::waitpid(pid, &ws, 0);
          status_of[r] = -1;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  int bad = 0;
  int named_victim = 0;
  for (auto& [r, ws] : status_of) {
    std::string how;
    bool expected;
    if (ws == -1) {
      how = "hung";
      expected = false;
    } else if (WIFSIGNALED(ws)) {
      how = std::string("killed by signal ") + std::to_string(WTERMSIG(ws)) + " (" + strsignal(WTERMSIG(ws)) + ")";
      expected = r == sc.victim && std::string(sc.victim_end) == "sigkill" && WTERMSIG(ws) == SIGKILL;
    } else {
      how = "exit status " + std::to_string(WEXITSTATUS(ws));
      const bool survivor = r != sc.victim;
      expected = (WEXITSTATUS(ws) == 0 || (survivor && WEXITSTATUS(ws) == kNamedOtherPeer)) &&
                 !(r == sc.victim && std::string(sc.victim_end) == "sigkill");
      if (survivor && WEXITSTATUS(ws) == 0) ++named_victim;
    }
    std::fprintf(stderr, "cclz-fault %s: rank %d %s: %s\n", sc.name, r, r == sc.victim ? "(victim)" : "(survivor)",
                 how.c_str());
    if (!expected) ++bad;
  }
  if (sc.victim >= 0 && named_victim == 0) {
    std::fprintf(stderr, "cclz-fault %s: no survivor named rank %d\n", sc.name, sc.victim);
    ++bad;
  }
  std::fprintf(stderr, "cclz-fault %s: %s\n", sc.name, bad == 0 ? "PASS" : "FAIL");
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || find_scenario(argv[1]) == nullptr) {
    std::fprintf(stderr, "usage: %s <scenario>\nscenarios:", argv[0]);
    for (const Scenario& sc : kScenarios) std::fprintf(stderr, " %s", sc.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  const Scenario& sc = *find_scenario(argv[1]);
  if (std::getenv("CCLZ_FAULT_WORKER") != nullptr) return worker(sc);
  return launch(sc, "/proc/self/exe");
}
