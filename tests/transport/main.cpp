// Test main for the transport suite: "--child <role> ..." runs a rank of a
// multi-process test (see harness.cpp); anything else runs GoogleTest.
#include <gtest/gtest.h>

#include <cstring>

#include "harness.hpp"

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "--child") == 0) return cclz::ttest::child_main(argc, argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
