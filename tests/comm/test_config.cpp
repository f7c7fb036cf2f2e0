// Configuration parsing (CCLZ_ALGO, CCLZ_TIMEOUT, CCLZ_CHECK, CCLZ_DEBUG,
// CCLZ_LOCAL_SIZE) and the node layout from host names and overrides.
// Environment tests run single-threaded and restore what they change.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>

#include "config.hpp"
#include "harness.hpp"
#include "topology.hpp"

namespace cclz::ctest {
namespace {

using coll::CollKind;
using detail::AlgoOverride;
using detail::parse_algo_spec;

// Sets (or unsets) one variable for the scope of a test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::size_t idx(CollKind k) { return static_cast<std::size_t>(k); }

TEST(CclzAlgo, BareNameAndPerCollectiveList) {
  AlgoOverride a;
  ASSERT_TRUE(parse_algo_spec("ring", &a).ok());
  EXPECT_EQ(a.any, "ring");
  EXPECT_TRUE(a.per_kind[idx(CollKind::all_reduce)].empty());

  ASSERT_TRUE(parse_algo_spec("all_reduce=ring, all_gather = doubling", &a).ok());
  EXPECT_TRUE(a.any.empty());
  EXPECT_EQ(a.per_kind[idx(CollKind::all_reduce)], "ring");
  EXPECT_EQ(a.per_kind[idx(CollKind::all_gather)], "doubling");
  EXPECT_TRUE(a.per_kind[idx(CollKind::broadcast)].empty());

  // Spelling variants of collective names.
  ASSERT_TRUE(parse_algo_spec("AllReduce=tree,reduce-scatter=ring", &a).ok());
  EXPECT_EQ(a.per_kind[idx(CollKind::all_reduce)], "tree");
  EXPECT_EQ(a.per_kind[idx(CollKind::reduce_scatter)], "ring");

  ASSERT_TRUE(parse_algo_spec("", &a).ok());
  EXPECT_TRUE(a.empty());
}

TEST(CclzAlgo, ErrorsNameWhatIsValid) {
  AlgoOverride a;
  a.any = "keep";
  Status st = parse_algo_spec("all_reduce=nope", &a);
  EXPECT_EQ(st.code(), Result::invalid_argument);
  EXPECT_TRUE(contains(st.message(), "all_reduce has no algorithm 'nope' (valid: ring, tree")) << st.message();
  EXPECT_EQ(a.any, "keep") << "a failed parse leaves the output alone";

  st = parse_algo_spec("allgathr=ring", &a);
  EXPECT_EQ(st.code(), Result::invalid_argument);
  EXPECT_TRUE(contains(st.message(), "unknown collective 'allgathr' (valid: all_reduce, reduce_scatter")) << st.message();

  st = parse_algo_spec("nosuch", &a);
  EXPECT_EQ(st.code(), Result::invalid_argument);
  EXPECT_TRUE(contains(st.message(), "no collective has an algorithm 'nosuch'")) << st.message();
  EXPECT_TRUE(contains(st.message(), "dissemination")) << st.message();

  st = parse_algo_spec("ring,tree", &a);
  EXPECT_EQ(st.code(), Result::invalid_argument);
}

TEST(CclzEnv, ReadsEveryVariableAndRejectsMalformedValues) {
  {
    ScopedEnv t("CCLZ_TIMEOUT", "2.5"), c("CCLZ_CHECK", "1"), d("CCLZ_DEBUG", "info"),
        a("CCLZ_ALGO", "broadcast=chain"), l("CCLZ_LOCAL_SIZE", "4");
    detail::Config cfg;
    ASSERT_TRUE(detail::config_from_env(&cfg).ok());
    EXPECT_EQ(cfg.timeout_s, 2.5);
    EXPECT_TRUE(cfg.check);
    EXPECT_EQ(cfg.log_level, detail::LogLevel::info);
    EXPECT_EQ(cfg.algo.per_kind[idx(CollKind::broadcast)], "chain");
    EXPECT_EQ(cfg.algo_spec, "broadcast=chain");
    EXPECT_EQ(cfg.local_size, 4);
  }
  for (const auto& [value, handoffs] : {std::pair{"auto", 0}, std::pair{"AUTO", 0}, std::pair{"1", 1},
                                        std::pair{"2", 2}}) {
    ScopedEnv h("CCLZ_SHM_ALLREDUCE_HANDOFFS", value);
    detail::Config cfg;
    ASSERT_TRUE(detail::config_from_env(&cfg).ok()) << value;
    EXPECT_EQ(cfg.shm_allreduce_handoffs, handoffs) << value;
  }
  for (const auto& [value, stores] : {std::pair{"auto", 0}, std::pair{"cache", 1}, std::pair{"Memory", 2}}) {
    ScopedEnv h("CCLZ_SHM_SLOT_STORES", value);
    detail::Config cfg;
    ASSERT_TRUE(detail::config_from_env(&cfg).ok()) << value;
    EXPECT_EQ(cfg.shm_slot_stores, stores) << value;
  }
  for (const auto& [value, bytes] : {std::pair{"0", std::uint64_t{0}}, std::pair{"64", std::uint64_t{64} << 10},
                                     std::pair{"off", ~std::uint64_t{0}}, std::pair{"OFF", ~std::uint64_t{0}}}) {
    ScopedEnv h("CCLZ_SHM_DIRECT_KB", value);
    detail::Config cfg;
    ASSERT_TRUE(detail::config_from_env(&cfg).ok()) << value;
    EXPECT_EQ(cfg.shm_direct_min_bytes, bytes) << value;
  }
  for (const auto& [value, mode] : {std::pair{"0", 0}, std::pair{"1", 1}, std::pair{"auto", 2}, std::pair{"AUTO", 2}}) {
    ScopedEnv h("CCLZ_SHM_CMA", value);
    detail::Config cfg;
    ASSERT_TRUE(detail::config_from_env(&cfg).ok()) << value;
    EXPECT_EQ(cfg.shm_cma, mode) << value;
  }
  {
    ScopedEnv l2("CCLZ_SHM_L2_KB", "2048"), llc("CCLZ_SHM_LLC_KB", "65536");
    detail::Config cfg;
    ASSERT_TRUE(detail::config_from_env(&cfg).ok());
    EXPECT_EQ(cfg.shm_l2_bytes, std::uint64_t{2} << 20);
    EXPECT_EQ(cfg.shm_llc_bytes, std::uint64_t{64} << 20);
  }
  {
    ScopedEnv t("CCLZ_TIMEOUT", nullptr), c("CCLZ_CHECK", nullptr), d("CCLZ_DEBUG", nullptr),
        a("CCLZ_ALGO", nullptr), l("CCLZ_LOCAL_SIZE", nullptr), h("CCLZ_SHM_ALLREDUCE_HANDOFFS", nullptr),
        k("CCLZ_SHM_DIRECT_KB", nullptr), l2("CCLZ_SHM_L2_KB", nullptr), llc("CCLZ_SHM_LLC_KB", nullptr),
        ss("CCLZ_SHM_SLOT_STORES", nullptr), cma("CCLZ_SHM_CMA", nullptr);
    detail::Config cfg;
    ASSERT_TRUE(detail::config_from_env(&cfg).ok());
    EXPECT_EQ(cfg.timeout_s, 300.0);
    EXPECT_FALSE(cfg.check);
    EXPECT_EQ(cfg.log_level, detail::LogLevel::none);
    EXPECT_TRUE(cfg.algo.empty());
    EXPECT_EQ(cfg.local_size, 0);
    EXPECT_EQ(cfg.shm_allreduce_handoffs, 0);
    EXPECT_EQ(cfg.shm_direct_min_bytes, std::uint64_t{1024} << 10);
    EXPECT_EQ(cfg.shm_l2_bytes, 0u);
    EXPECT_EQ(cfg.shm_llc_bytes, 0u);
    EXPECT_EQ(cfg.shm_slot_stores, 0);
    EXPECT_EQ(cfg.shm_cma, 2);  // auto
  }
  struct Bad {
    const char* name;
    const char* value;
  };
  for (Bad b : {Bad{"CCLZ_TIMEOUT", "soon"}, Bad{"CCLZ_TIMEOUT", "-1"}, Bad{"CCLZ_CHECK", "maybe"},
                Bad{"CCLZ_DEBUG", "LOUD"}, Bad{"CCLZ_ALGO", "all_reduce=nope"}, Bad{"CCLZ_LOCAL_SIZE", "0"},
                Bad{"CCLZ_LOCAL_SIZE", "2x"}, Bad{"CCLZ_SPIN_US", "fast"}, Bad{"CCLZ_YIELD_US", "-5"},
                Bad{"CCLZ_POLL_MS", "0"}, Bad{"CCLZ_POLL_MS", "1ms"}, Bad{"CCLZ_SHM_ALLREDUCE_HANDOFFS", "3"},
                Bad{"CCLZ_SHM_SLOT_STORES", "1"}, Bad{"CCLZ_SHM_SLOT_STORES", "streaming"},
                Bad{"CCLZ_SHM_ALLREDUCE_HANDOFFS", "0"}, Bad{"CCLZ_SHM_ALLREDUCE_HANDOFFS", "one"},
                Bad{"CCLZ_SHM_DIRECT_KB", "-1"}, Bad{"CCLZ_SHM_DIRECT_KB", "1M"}, Bad{"CCLZ_SHM_DIRECT_KB", "never"},
                Bad{"CCLZ_SHM_L2_KB", "0"}, Bad{"CCLZ_SHM_L2_KB", "1M"}, Bad{"CCLZ_SHM_LLC_KB", "-32768"},
                Bad{"CCLZ_SHM_CMA", "yes"}, Bad{"CCLZ_SHM_CMA", "2"}}) {
    ScopedEnv e(b.name, b.value);
    detail::Config cfg;
    Status st = detail::config_from_env(&cfg);
    EXPECT_EQ(st.code(), Result::invalid_argument) << b.name << "=" << b.value;
    EXPECT_TRUE(contains(st.message(), b.name)) << st.message();
  }
}

TEST(CclzEnv, ZeroTimeoutMeansNoLimit) {
  detail::Config cfg;
  cfg.timeout_s = 0;
  EXPECT_GT(cfg.deadline_from_now() - Clock::now(), std::chrono::hours(24 * 365));
}

TEST(Topology, HostNamesNumberedByLowestRank) {
  std::vector<detail::RankInfo> r = {{"x", -1, {}}, {"y", -1, {}}, {"x", -1, {}}, {"z", -1, {}}, {"y", -1, {}}};
  detail::Topology t = detail::compute_topology(r, 0);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(t.local_rank, (std::vector<int>{0, 0, 1, 0, 1}));
  EXPECT_EQ(t.node_size, (std::vector<int>{2, 2, 1}));
  EXPECT_EQ(t.source, "hostname");
  EXPECT_EQ(t.describe(r), "node 0: ranks 0,2 (x); node 1: ranks 1,4 (y); node 2: ranks 3 (z)");
}

TEST(Topology, LocalSizeOverridesHostNames) {
  std::vector<detail::RankInfo> r(7, {"same", -1, {}});
  detail::Topology t = detail::compute_topology(r, 3);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 0, 0, 1, 1, 1, 2}));
  EXPECT_EQ(t.local_rank, (std::vector<int>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(t.describe(), "node 0: ranks 0-2; node 1: ranks 3-5; node 2: ranks 6");
}

TEST(Topology, NodeIdOverridesWinAndAreRenumberedDensely) {
  // Ids 7 and 3 become 0 and 1 (order of lowest rank); the rank without an
  // id is grouped by host name apart from every id.
  std::vector<detail::RankInfo> r = {{"h", 7, {}}, {"h", 3, {}}, {"h", 7, {}}, {"h", -1, {}}, {"h", 3, {}}};
  detail::Topology t = detail::compute_topology(r, 2);
  EXPECT_EQ(t.node_of, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(t.source, "CCLZ_NODE_ID");
}

// Affinity masks as RankInfo::cpus holds them: CPU i is bit i%8 of byte i/8.
std::vector<std::byte> cpus(std::initializer_list<int> list) {
  std::vector<std::byte> bits;
  for (int c : list) {
    const auto byte = static_cast<std::size_t>(c / 8);
    if (bits.size() <= byte) bits.resize(byte + 1);
    bits[byte] |= static_cast<std::byte>(1u << (c % 8));
  }
  return bits;
}

TEST(Topology, OversubscriptionCountsTheUnionOfTheHostsAffinityMasks) {
  // Two ranks bound one per core: each mask has one CPU, together two.
  std::vector<detail::RankInfo> bound = {{"h", -1, cpus({0})}, {"h", -1, cpus({1})}};
  EXPECT_FALSE(detail::host_oversubscribed(bound, 0));
  EXPECT_FALSE(detail::host_oversubscribed(bound, 1));
  // Four unbound ranks on two CPUs, and four bound two per core.
  std::vector<detail::RankInfo> four(4, {"h", -1, cpus({0, 1})});
  EXPECT_TRUE(detail::host_oversubscribed(four, 2));
  std::vector<detail::RankInfo> wrapped = {
      {"h", -1, cpus({0})}, {"h", -1, cpus({1})}, {"h", -1, cpus({0})}, {"h", -1, cpus({1})}};
  EXPECT_TRUE(detail::host_oversubscribed(wrapped, 0));
  // Only the ranks of the same host count; CPU numbers past 8 (a second byte).
  std::vector<detail::RankInfo> two_hosts = {{"a", -1, cpus({0})}, {"b", -1, cpus({0})}, {"a", -1, cpus({9})},
                                             {"b", -1, cpus({0})}};
  EXPECT_FALSE(detail::host_oversubscribed(two_hosts, 0));
  EXPECT_TRUE(detail::host_oversubscribed(two_hosts, 1));
  // A mask unknown: the host's online CPUs stand in, not this thread's own
  // mask, which differs between bound ranks (and the ranks must agree).
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  ASSERT_GT(online, 0);
  std::vector<detail::RankInfo> unknown(static_cast<std::size_t>(online) + 1, {"h", -1, {}});
  EXPECT_TRUE(detail::host_oversubscribed(unknown, 0));
  unknown.resize(static_cast<std::size_t>(online));
  cpu_set_t saved, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof(saved), &saved), 0);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &saved)) ++first;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);  // as a rank bound to one core
  const bool bound_answer = detail::host_oversubscribed(unknown, 0);
  ASSERT_EQ(sched_setaffinity(0, sizeof(saved), &saved), 0);
  EXPECT_FALSE(bound_answer);
  EXPECT_FALSE(detail::host_oversubscribed(unknown, 0));
}

}  // namespace
}  // namespace cclz::ctest
