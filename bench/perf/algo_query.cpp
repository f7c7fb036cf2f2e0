// Algorithm queries without running anything: a coll::Group with this rank's
// shape over a transport that refuses every transfer, handed to the
// registry's supports() and the tuner. Both only look at the group's shape
// and the call's arguments, so the answer matches what the communicator
// decides for the same call. CCLZ_ALGO is read with the communicator's own
// parser (src/config.hpp) and applied in its order of precedence.
#include "algo_query.hpp"

#include <memory>

#include "config.hpp"

namespace cclz::perf {
namespace {

// A transport that moves nothing: queries must never send.
class NullTransport final : public detail::Transport {
 public:
  NullTransport(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "null"; }
  Status post_send(int, std::uint64_t, const void*, std::size_t, detail::Op*, Traffic) override { return refuse(); }
  Status post_recv(int, std::uint64_t, void*, std::size_t, detail::Op*, Traffic) override { return refuse(); }
  Status wait(std::span<detail::Op* const>, detail::Clock::time_point) override { return refuse(); }
  void cancel(detail::Op*) override {}
  void fail(const Status&) override {}

 private:
  static Status refuse() { return {Result::internal_error, "cclz-perf: algorithm query tried to move data"}; }
  int rank_, size_;
};

}  // namespace

struct AlgoQuery::State {
  NullTransport transport;
  coll::ScratchPool scratch;
  std::unique_ptr<coll::Group> group;
  detail::Config cfg;
  State(int rank, int size) : transport(rank, size) {}
};

std::vector<std::string> algorithms_for(coll::CollKind kind) {
  std::vector<std::string> names;
  for (const coll::AlgorithmDesc* d : coll::all_algorithms()) {
    if (d->kind == kind) names.emplace_back(d->name);
  }
  return names;
}

AlgoQuery::AlgoQuery(const Comm& comm) : s_(std::make_unique<State>(comm.rank(), comm.size())) {
  std::vector<int> members, nodes;
  for (int r = 0; r < comm.size(); ++r) {
    members.push_back(r);
    nodes.push_back(comm.node_of(r));
  }
  s_->group = std::make_unique<coll::Group>(s_->transport, std::move(members), std::move(nodes), comm.rank(), 0,
                                            detail::Clock::now(), s_->scratch);
  // The communicator refused to start on a malformed CCLZ_ALGO, so this
  // parses; if not, the tuner's answer is the best guess.
  (void)detail::config_from_env(&s_->cfg);
}

const std::string& AlgoQuery::algo_env() const { return s_->cfg.algo_spec; }

AlgoQuery::~AlgoQuery() = default;

std::string AlgoQuery::tuned(const coll::CollArgs& a) const {
  const detail::AlgoOverride& ov = s_->cfg.algo;
  const std::string& per_kind = ov.per_kind[static_cast<std::size_t>(a.kind)];
  if (!per_kind.empty()) return per_kind;  // the comm fails the call if it does not fit
  if (!ov.any.empty() && supports(ov.any, a)) return ov.any;
  const coll::AlgorithmDesc* d = coll::tune(*s_->group, a);
  return d != nullptr ? d->name : "";
}

bool AlgoQuery::supports(const std::string& name, const coll::CollArgs& a) const {
  const coll::AlgorithmDesc* d = coll::find_algorithm(a.kind, name);
  if (d == nullptr) return false;
  return d->supports == nullptr || d->supports(*s_->group, a);
}

}  // namespace cclz::perf
