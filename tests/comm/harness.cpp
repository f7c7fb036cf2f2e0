// Harness for the communicator tests (see harness.hpp).
#include "harness.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "thread_transport.hpp"

extern char** environ;

namespace cclz::ctest {

using detail::RankInfo;
using detail::Transport;
using detail::World;
using testing::ThreadFabric;
using testing::ThreadTransport;

Config test_config(double timeout_s) {
  Config c;
  c.timeout_s = timeout_s;
  return c;
}

void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

void run_comms(int n, const Config& cfg, const std::function<void(Comm&, int)>& fn, std::vector<RankInfo> infos) {
  auto fabric = std::make_shared<ThreadFabric>(n);
  if (infos.empty()) infos.assign(static_cast<std::size_t>(n), RankInfo{"localhost", -1, {}});
  auto connector = thread_connector();
  run_threads(n, [&](int r) {
    World w;
    w.transport = std::make_unique<ThreadTransport>(fabric, r);
    w.ranks = infos;
    std::unique_ptr<Comm> c;
    Status st = detail::make_comm(std::move(w), cfg, &c, connector);
    ASSERT_TRUE(st.ok()) << st.to_string();
    fn(*c, r);
    EXPECT_TRUE(c->destroy().ok());
  });
}

detail::SubgroupConnector thread_connector() {
  struct State {
    std::mutex mu;
    std::map<std::uint64_t, std::shared_ptr<ThreadFabric>> fabrics;
  };
  auto state = std::make_shared<State>();
  return [state](Transport& parent, const std::vector<int>& members, std::uint64_t tag_base,
                 const std::vector<RankInfo>& parent_ranks, Clock::time_point deadline, World* out) -> Status {
    int me = -1;
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i] == parent.rank()) me = static_cast<int>(i);
    }
    if (me < 0) return {Result::invalid_argument, "thread_connector: not a member"};
    std::uint64_t id = 0;
    std::vector<detail::Op> ops(members.size());
    std::vector<detail::Op*> posted;
    if (me == 0) {
      auto f = std::make_shared<ThreadFabric>(static_cast<int>(members.size()));
      id = reinterpret_cast<std::uintptr_t>(f.get());
      {
        std::lock_guard lk(state->mu);
        state->fabrics[id] = f;
      }
      for (std::size_t i = 1; i < members.size(); ++i) {
        if (Status st = parent.post_send(members[i], tag_base, &id, sizeof id, &ops[i]); !st.ok()) return st;
        posted.push_back(&ops[i]);
      }
    } else {
      if (Status st = parent.post_recv(members[0], tag_base, &id, sizeof id, &ops[0]); !st.ok()) return st;
      posted.push_back(&ops[0]);
    }
    if (Status st = parent.wait(posted, deadline); !st.ok()) {
      for (auto* op : posted) {
        if (!op->done) parent.cancel(op);
      }
      return st;
    }
    std::shared_ptr<ThreadFabric> f;
    {
      std::lock_guard lk(state->mu);
      f = state->fabrics.at(id);
    }
    World w;
    w.transport = std::make_unique<ThreadTransport>(f, me);
    for (int m : members) w.ranks.push_back(parent_ranks[static_cast<std::size_t>(m)]);
    *out = std::move(w);
    return {};
  };
}

bool contains(const std::string& s, const std::string& sub) { return s.find(sub) != std::string::npos; }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

pid_t spawn_child(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  std::vector<std::string> argv_s = {"/proc/self/exe", "--child"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The parent's environment, with `env` (NAME=value) replacing same names.
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& mine : env) {
      replaced = replaced || kv.compare(0, mine.find('=') + 1, mine, 0, mine.find('=') + 1) == 0;
    }
    if (!replaced) env_s.push_back(kv);
  }
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data()) != 0) return -1;
  return pid;
}

int wait_child(pid_t pid, double timeout_s) {
  const auto t0 = Clock::now();
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (seconds_since(t0) > timeout_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace cclz::ctest
