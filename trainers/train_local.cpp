// cclz-train-local: trains the reference GPT in one process on the CPU.
// The flags are in options.cpp (--help), the loop in local.cpp. Exit status:
// 0 trained, 1 failed (data, memory, divergence), 2 bad command line.
#include <cstdio>

#include "local.hpp"
#include "options.hpp"

int main(int argc, char** argv) {
  cclz::train::TrainOptions opts;
  bool help = false;
  if (cclz::Status s = cclz::train::parse_train_args(argc, argv, &opts, &help); !s.ok()) {
    std::fprintf(stderr, "cclz-train-local: %s\n", s.to_string().c_str());
    return 2;
  }
  if (help) {
    std::fputs(cclz::train::train_usage(argv[0]).c_str(), stdout);
    return 0;
  }
  cclz::train::TrainResult result;
  if (cclz::Status s = cclz::train::train_local(opts, stdout, &result); !s.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "cclz-train-local: %s\n", s.to_string().c_str());
    return 1;
  }
  std::printf("done     %zu steps in %.1f s (%.1f ms/step training), train loss %.4f -> %.4f", result.train_loss.size(),
              result.seconds, 1e3 * result.step_seconds / static_cast<double>(result.train_loss.size()),
              static_cast<double>(result.train_loss.front()), static_cast<double>(result.train_loss.back()));
  if (!result.val.empty()) {
    std::printf(", val loss %.4f -> %.4f", static_cast<double>(result.val.front().loss),
                static_cast<double>(result.val.back().loss));
  }
  std::printf("\n");
  return 0;
}
