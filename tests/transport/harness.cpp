// Harness for the transport tests (see harness.hpp).
#include "harness.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace cclz::ttest {

static Status wait_one(Transport& t, Op* op, double timeout_s) {
  Op* ops[] = {op};
  Status st = t.wait(ops, after(timeout_s));
  if (!st.ok() && op->handle != nullptr && !op->done) t.cancel(op);
  return st;
}

Status send_wait(Transport& t, int peer, std::uint64_t tag, const void* buf, std::size_t bytes, double timeout_s,
                 Transport::Traffic traffic) {
  Op op;
  if (Status st = t.post_send(peer, tag, buf, bytes, &op, traffic); !st.ok()) return st;
  return wait_one(t, &op, timeout_s);
}

Status recv_wait(Transport& t, int peer, std::uint64_t tag, void* buf, std::size_t bytes, double timeout_s,
                 Transport::Traffic traffic) {
  Op op;
  if (Status st = t.post_recv(peer, tag, buf, bytes, &op, traffic); !st.ok()) return st;
  return wait_one(t, &op, timeout_s);
}

Status sendrecv(Transport& t, int dst, const void* sbuf, std::size_t sbytes, int src, void* rbuf, std::size_t rbytes,
                std::uint64_t tag, double timeout_s) {
  Op r, s;
  if (Status st = t.post_recv(src, tag, rbuf, rbytes, &r); !st.ok()) return st;
  if (Status st = t.post_send(dst, tag, sbuf, sbytes, &s); !st.ok()) {
    t.cancel(&r);
    return st;
  }
  Op* ops[] = {&r, &s};
  Status st = t.wait(ops, after(timeout_s));
  if (!st.ok()) {
    for (Op* op : ops) {
      if (op->handle != nullptr && !op->done) t.cancel(op);
    }
  }
  return st;
}

void run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& th : threads) th.join();
}

void run_world(int n, const std::function<void(World&, int)>& fn, double connect_timeout_s) {
  UniqueId id;
  const Status made = detail::make_unique_id(&id);
  ASSERT_TRUE(made.ok()) << made.to_string();
  run_threads(n, [&](int r) {
    World w;
    const Status st = detail::connect_unique_id(id, n, r, after(connect_timeout_s), &w);
    ASSERT_TRUE(st.ok()) << "rank " << r << ": " << st.to_string();
    fn(w, r);
  });
}

std::string id_to_hex(const UniqueId& id) {
  std::string s;
  char b[3];
  for (char c : id.internal) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned char>(c));
    s += b;
  }
  return s;
}

bool id_from_hex(const std::string& hex, UniqueId* id) {
  if (hex.size() != 2 * sizeof id->internal) return false;
  for (std::size_t i = 0; i < sizeof id->internal; ++i) {
    unsigned v = 0;
    if (std::sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    id->internal[i] = static_cast<char>(v);
  }
  return true;
}

pid_t spawn_child(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {"/proc/self/exe", "--child"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Resolve the binary before fork so the child only calls exec.
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return -1;
  self[n] = '\0';
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(self, argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_child(pid_t pid, double timeout_s) {
  const auto deadline = after(timeout_s);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (r < 0) return -1;
    if (Clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// ------------------------------------------------------------ child roles

// peer: rank 1 of 2; echoes one 8-byte message from rank 0, then idles
// until killed (the parent tests what a dead peer looks like).
static int role_echo_then_idle(const UniqueId& id) {
  World w;
  if (!detail::connect_unique_id(id, 2, 1, after(10), &w).ok()) return 2;
  char buf[8];
  if (!recv_wait(*w.transport, 0, 1, buf, sizeof buf).ok()) return 3;
  if (!send_wait(*w.transport, 0, 1, buf, sizeof buf).ok()) return 4;
  ::sleep(60);
  return 0;
}

// Makes a unique id whose root serves 2 ranks, joins it as rank 0 (so the
// root has a live connection and a deadline), and exits while it waits.
static int role_root_then_exit() {
  UniqueId id;
  if (!detail::make_unique_id(&id).ok()) return 2;
  std::thread([id] {
    World w;
    (void)detail::connect_unique_id(id, 2, 0, after(30), &w);
  }).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::exit(0);  // runs static destructors while both threads are blocked
}

int child_main(int argc, char** argv) {
  if (argc < 4) return 100;
  const std::string role = argv[2];
  UniqueId id;
  if (!id_from_hex(argv[3], &id)) return 101;
  if (role == "echo_then_idle") return role_echo_then_idle(id);
  if (role == "root_then_exit") return role_root_then_exit();
  return 102;
}

}  // namespace cclz::ttest
