// Algorithm queries without running anything: the communicator's own choice
// (CommImpl::algorithm_for: call option, CCLZ_ALGO, tuner, supports()), so
// the table names exactly what each call runs, shared-memory window included.
#include "algo_query.hpp"

#include "comm_impl.hpp"

namespace cclz::perf {

std::vector<std::string> algorithms_for(coll::CollKind kind) {
  std::vector<std::string> names;
  for (const coll::AlgorithmDesc* d : coll::all_algorithms()) {
    if (d->kind == kind) names.emplace_back(d->name);
  }
  return names;
}

AlgoQuery::AlgoQuery(Comm& comm) : impl_(comm.impl()) {}

const std::string& AlgoQuery::algo_env() const { return impl_->config().algo_spec; }

std::string AlgoQuery::tuned(const coll::CollArgs& a) const {
  std::string name;
  return impl_->algorithm_for(a, {}, &name, nullptr).ok() ? name : "";
}

bool AlgoQuery::supports(const std::string& name, const coll::CollArgs& a) const {
  CallOptions opt;
  opt.algorithm = name;
  return impl_->algorithm_for(a, opt, nullptr, nullptr).ok();
}

}  // namespace cclz::perf
