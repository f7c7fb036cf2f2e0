// Test harness for the bootstrap and the UCX transport: ranks as threads of
// this process (each with its own UcxTransport) or as child processes
// (this test binary re-executed with "--child <role> ...", see main.cpp), and
// blocking send/recv helpers over the Transport interface.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap.hpp"

namespace cclz::ttest {

using detail::Clock;
using detail::Op;
using detail::Transport;
using detail::World;

inline Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Post + wait; on error the op is cancelled (as coll::Group does).
Status send_wait(Transport& t, int peer, std::uint64_t tag, const void* buf, std::size_t bytes, double timeout_s = 10,
                 Transport::Traffic traffic = Transport::Traffic::collective);
Status recv_wait(Transport& t, int peer, std::uint64_t tag, void* buf, std::size_t bytes, double timeout_s = 10,
                 Transport::Traffic traffic = Transport::Traffic::collective);
// Receive from `src` and send to `dst` at once (a ring step).
Status sendrecv(Transport& t, int dst, const void* sbuf, std::size_t sbytes, int src, void* rbuf, std::size_t rbytes,
                std::uint64_t tag, double timeout_s = 10);

// Runs `n` ranks on threads: rank r connects through a fresh unique id with
// `connect_timeout_s`, then runs fn(world, r) on the same thread; the world
// is destroyed there too. A failed connect fails the test (fn not called).
void run_world(int n, const std::function<void(World&, int)>& fn, double connect_timeout_s = 10);

// Runs fn(r) on n threads and joins them.
void run_threads(int n, const std::function<void(int)>& fn);

std::string id_to_hex(const UniqueId& id);
bool id_from_hex(const std::string& hex, UniqueId* id);

// Starts this test binary as a child: argv = {self, "--child", args...}.
pid_t spawn_child(const std::vector<std::string>& args);
// Waits up to timeout_s for the child; returns its exit status (0..255),
// 128+signal if killed, or -1 on timeout (the child is then killed).
int wait_child(pid_t pid, double timeout_s);

// The child side: dispatches on argv[2] (the role); returns the exit code.
int child_main(int argc, char** argv);

}  // namespace cclz::ttest
