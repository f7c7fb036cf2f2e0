// main() of the communicator tests: "--child <role>" runs one rank of a
// multi-process test (see harness.hpp), anything else runs GoogleTest.
#include <gtest/gtest.h>

#include <cstring>

#include "harness.hpp"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--child") == 0) return cclz::ctest::child_main(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
