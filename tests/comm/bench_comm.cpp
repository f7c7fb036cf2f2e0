// Communicator overhead benchmark (not a test): N processes on this host
// over UCX (init_from_env on 127.0.0.1), small all-reduces timed three ways:
//   engine/wait:  comm.all_reduce(...).wait() per call (the blocking path)
//   engine/test:  all_reduce then poll test() (the worker runs it)
//   direct:       the same algorithm called in a loop inside one custom task,
//                 i.e. the algorithm and transport alone, no per-call engine
// Prints microseconds per call from rank 0; the gap between the first and
// the last is the communicator's per-call cost.
// Usage: cclz-comm-bench [nranks=2] [bytes=4096] [iters=20000] [modes=wtd]
// (modes: w = engine/wait, t = engine/test, d = direct)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness.hpp"

namespace cclz::ctest {

static int bench_child(int iters, std::size_t bytes, const std::string& modes) {
  std::unique_ptr<Comm> c;
  if (Status st = Comm::init_from_env(&c); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.to_string().c_str());
    return 1;
  }
  const std::size_t count = bytes / 4;
  std::vector<float> in(count, 1.f), out(count);
  auto check = [&](const Status& st) {
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.to_string().c_str());
      std::exit(1);
    }
  };
  std::string algo, source;
  coll::CollArgs a;
  a.kind = coll::CollKind::all_reduce;
  a.sendbuf = in.data();
  a.recvbuf = out.data();
  a.count = count;
  a.dt = DataType::f32;
  check(c->impl()->algorithm_for(a, {}, &algo, &source));
  const coll::AlgorithmDesc* desc = coll::find_algorithm(coll::CollKind::all_reduce, algo);

  auto time_it = [&](const char* what, auto&& body) {
    for (int i = 0; i < iters / 10; ++i) body();  // warm up
    check(c->all_reduce(in.data(), out.data(), 1, DataType::f32, ReduceOp::sum).wait());  // line up
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) body();
    const double us = seconds_since(t0) * 1e6 / iters;
    if (c->rank() == 0) std::printf("%-12s %8.2f us/call  (%s, %zu bytes, %d ranks)\n", what, us, algo.c_str(), bytes, c->size());
  };
  if (modes.find('w') != std::string::npos) time_it("engine/wait", [&] { check(c->all_reduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum).wait()); });
  if (modes.find('t') != std::string::npos) time_it("engine/test", [&] {
    Request q = c->all_reduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
    Status st;
    while (!q.test(&st)) {
    }
    check(st);
  });
  if (modes.find('d') != std::string::npos) time_it("direct", [&] {
    // One task per 100 calls, so the engine's cost is spread thin.
    static int k = 0;
    if (k++ % 100 != 0) return;
    check(c->impl()
              ->run_custom("bench", "", [&](coll::Group& g) -> Status {
                for (int i = 0; i < 100; ++i) {
                  if (Status st = desc->run(g, a); !st.ok()) return st;
                }
                return {};
              })
              .wait());
  });
  return c->destroy().ok() ? 0 : 1;
}

int child_main(int argc, char** argv) {
  if (argc >= 6 && std::string(argv[2]) == "bench") {
    return bench_child(std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10), argv[5]);
  }
  return 2;
}

}  // namespace cclz::ctest

int main(int argc, char** argv) {
  using namespace cclz::ctest;
  if (argc >= 2 && std::string(argv[1]) == "--child") return child_main(argc, argv);
  const int n = argc > 1 ? std::atoi(argv[1]) : 2;
  const std::string bytes = argc > 2 ? argv[2] : "4096";
  const std::string iters = argc > 3 ? argv[3] : "20000";
  const std::string modes = argc > 4 ? argv[4] : "wtd";
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pids.push_back(spawn_child({"bench", iters, bytes, modes},
                               {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                                "MASTER_PORT=" + std::to_string(port), "CCLZ_MASTER_PORT="}));
  }
  int rc = 0;
  for (pid_t p : pids) rc |= wait_child(p, 300);
  return rc;
}
