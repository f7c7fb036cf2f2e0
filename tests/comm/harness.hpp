// Harness for the communicator tests: communicators over in-process
// transports (ranks as threads, through the detail::make_comm testing door),
// a split connector for them, and child processes (this binary re-executed
// with "--child <role>") for the environment launch over UCX.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "cclz/cclz.hpp"
#include "comm_impl.hpp"

namespace cclz::ctest {

using detail::Clock;
using detail::Config;

// Defaults for tests: a timeout short enough that a broken test fails fast.
Config test_config(double timeout_s = 20);

// Makes `n` communicators over one in-process fabric and runs fn(comm, rank)
// on `n` threads; each thread destroys its communicator after fn. `infos`
// (host names, node overrides) default to one host.
void run_comms(int n, const Config& cfg, const std::function<void(Comm&, int)>& fn,
               std::vector<detail::RankInfo> infos = {});

// split() for in-process worlds: members[0] makes a new fabric and tells the
// others over the parent transport (tags tag_base), as the bootstrap does
// with UCX addresses.
detail::SubgroupConnector thread_connector();

// Runs fn(r) on n threads and joins them.
void run_threads(int n, const std::function<void(int)>& fn);

bool contains(const std::string& s, const std::string& sub);

double seconds_since(Clock::time_point t0);

// A TCP port that was free a moment ago on 127.0.0.1.
int free_port();

// Starts this binary as "--child args..." with `env` added to the environment.
pid_t spawn_child(const std::vector<std::string>& args, const std::vector<std::string>& env);
// Exit status (0..255), 128+signal, or -1 on timeout (the child is killed).
int wait_child(pid_t pid, double timeout_s);
// The child side (main.cpp dispatches here); returns the exit code.
int child_main(int argc, char** argv);

}  // namespace cclz::ctest
