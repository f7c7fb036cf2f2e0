// cclz-transport-bench: latency and bandwidth of the UCX transport between
// processes on this host (each rank a re-executed child process, ranks meet
// through a unique id). Measures:
//   pingpong  2 ranks, 8 B half round trip (latency) and 4 MB (bandwidth)
//   ring      N ranks, one 4 KB sendrecv step around the ring
//   allreduce N ranks, 4 KB f32 sum with the registry's "ring" all-reduce
// Usage: cclz-transport-bench [pingpong|ring N|allreduce N] ...
// With no arguments: pingpong, ring 4, ring 8, allreduce 4, allreduce 8.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "group.hpp"
#include "harness.hpp"

namespace cclz::ttest {
namespace {

double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

bool barrier(Transport& t, std::uint64_t tag) {
  const int n = t.size(), r = t.rank();
  char a = 0, b = 0;
  // Two laps of a ring: everyone has arrived once the second lap completes.
  for (int lap = 0; lap < 2; ++lap) {
    if (!sendrecv(t, (r + 1) % n, &a, 1, (r + n - 1) % n, &b, 1, tag + static_cast<std::uint64_t>(lap), 30).ok()) {
      return false;
    }
  }
  return true;
}

int run_pingpong(Transport& t) {
  const int r = t.rank();
  const int peer = 1 - r;
  struct Size {
    std::size_t bytes;
    int iters;
  };
  for (Size s : {Size{8, 20000}, Size{4 << 20, 200}}) {
    std::vector<char> buf(s.bytes, 'x');
    if (!barrier(t, 1000)) return 2;
    double t0 = 0;
    const int warm = s.iters / 10;
    for (int i = 0; i < s.iters + warm; ++i) {
      if (i == warm) t0 = now_s();
      if (r == 0) {
        if (!send_wait(t, peer, 1, buf.data(), s.bytes, 30).ok()) return 3;
        if (!recv_wait(t, peer, 2, buf.data(), s.bytes, 30).ok()) return 4;
      } else {
        if (!recv_wait(t, peer, 1, buf.data(), s.bytes, 30).ok()) return 5;
        if (!send_wait(t, peer, 2, buf.data(), s.bytes, 30).ok()) return 6;
      }
    }
    const double half = (now_s() - t0) / s.iters / 2;
    if (r == 0) {
      std::printf("pingpong %9zu B: %8.2f us one-way, %8.2f GB/s\n", s.bytes, half * 1e6,
                  static_cast<double>(s.bytes) / half / 1e9);
    }
  }
  return 0;
}

int run_ring(Transport& t) {
  const int n = t.size(), r = t.rank();
  const std::size_t bytes = 4096;
  const int iters = 2000, warm = 200;
  std::vector<char> out(bytes, static_cast<char>(r)), in(bytes);
  if (!barrier(t, 1000)) return 2;
  double t0 = 0;
  for (int i = 0; i < iters + warm; ++i) {
    if (i == warm) t0 = now_s();
    if (!sendrecv(t, (r + 1) % n, out.data(), bytes, (r + n - 1) % n, in.data(), bytes, 7, 30).ok()) return 3;
    if (in[0] != static_cast<char>((r + n - 1) % n)) return 4;
  }
  const double step = (now_s() - t0) / iters;
  if (!barrier(t, 2000)) return 5;
  if (r == 0) std::printf("ring      %2d ranks 4096 B: %8.2f us per step\n", n, step * 1e6);
  return 0;
}

int run_allreduce(Transport& t) {
  const coll::AlgorithmDesc* algo = coll::find_algorithm(coll::CollKind::all_reduce, "ring");
  if (algo == nullptr) {
    if (t.rank() == 0) std::printf("allreduce: no 'ring' all-reduce registered, skipped\n");
    return 0;
  }
  const int n = t.size(), r = t.rank();
  const std::size_t count = 1024;  // 4 KB of f32
  const int iters = 1000, warm = 100;
  std::vector<float> send(count, static_cast<float>(r + 1)), recv(count);
  std::vector<int> members(static_cast<std::size_t>(n)), nodes(static_cast<std::size_t>(n), 0);
  for (int i = 0; i < n; ++i) members[static_cast<std::size_t>(i)] = i;
  coll::ScratchPool pool;
  if (!barrier(t, std::uint64_t{1} << 43)) return 2;
  double t0 = 0;
  for (int i = 0; i < iters + warm; ++i) {
    if (i == warm) t0 = now_s();
    coll::Group g(t, members, nodes, r, static_cast<std::uint64_t>(i + 1), after(30), pool);
    coll::CollArgs a;
    a.kind = coll::CollKind::all_reduce;
    a.sendbuf = send.data();
    a.recvbuf = recv.data();
    a.count = count;
    a.dt = DataType::f32;
    a.op = ReduceOp::sum;
    const Status st = algo->run(g, a);
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", r, st.to_string().c_str());
      return 3;
    }
    if (recv[count - 1] != static_cast<float>(n * (n + 1) / 2)) return 4;
  }
  const double per = (now_s() - t0) / iters;
  if (!barrier(t, (std::uint64_t{1} << 43) + 8)) return 5;
  if (r == 0) std::printf("allreduce %2d ranks 4096 B (ring): %8.2f us\n", n, per * 1e6);
  return 0;
}

int rank_main(const std::string& mode, const UniqueId& id, int n, int r) {
  World w;
  const Status st = detail::connect_unique_id(id, n, r, after(30), &w);
  if (!st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", r, st.to_string().c_str());
    return 1;
  }
  if (mode == "pingpong") return run_pingpong(*w.transport);
  if (mode == "ring") return run_ring(*w.transport);
  if (mode == "allreduce") return run_allreduce(*w.transport);
  return 9;
}

int launch(const std::string& mode, int n) {
  UniqueId id;
  if (Status st = detail::make_unique_id(&id); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) kids.push_back(spawn_child({mode, id_to_hex(id), std::to_string(n), std::to_string(r)}));
  int worst = 0;
  for (pid_t k : kids) worst = std::max(worst, wait_child(k, 300));
  std::fflush(stdout);
  if (worst != 0) std::fprintf(stderr, "%s with %d ranks: a rank exited with %d\n", mode.c_str(), n, worst);
  return worst;
}

}  // namespace
}  // namespace cclz::ttest

int main(int argc, char** argv) {
  using namespace cclz::ttest;
  if (argc >= 6 && std::strcmp(argv[1], "--child") == 0) {
    cclz::UniqueId id;
    if (!id_from_hex(argv[3], &id)) return 100;
    return rank_main(argv[2], id, std::atoi(argv[4]), std::atoi(argv[5]));
  }
  std::vector<std::pair<std::string, int>> runs;
  for (int i = 1; i < argc; ++i) {
    const std::string m = argv[i];
    if (m == "pingpong") {
      runs.emplace_back(m, 2);
    } else if ((m == "ring" || m == "allreduce") && i + 1 < argc) {
      runs.emplace_back(m, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [pingpong|ring N|allreduce N]...\n", argv[0]);
      return 2;
    }
  }
  if (runs.empty()) runs = {{"pingpong", 2}, {"ring", 2}, {"ring", 4}, {"ring", 8}, {"allreduce", 4}, {"allreduce", 8}};
  int rc = 0;
  for (auto& [m, n] : runs) rc = std::max(rc, launch(m, n));
  return rc;
}
