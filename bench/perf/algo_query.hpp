// Which algorithms exist for a collective, which of them can run a given
// call, and which one the communicator picks when the call names none: the
// same registry and tuner (collectives/registry.cpp, tuner.cpp) and the same
// precedence as CommImpl::choose_algorithm (CCLZ_ALGO per collective, then a
// bare CCLZ_ALGO name where it fits, then the tuner).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algorithm.hpp"
#include "cclz/cclz.hpp"

namespace cclz::perf {

// Registered algorithm names for `kind`, in registry order.
std::vector<std::string> algorithms_for(coll::CollKind kind);

// Answers for one rank of `comm`: its group shape (size, rank, nodes) is
// what the tuner and supports() look at.
class AlgoQuery {
 public:
  explicit AlgoQuery(Comm& comm);

  // The algorithm a call without CallOptions::algorithm runs ("" if none).
  std::string tuned(const coll::CollArgs& a) const;
  // CCLZ_ALGO as the communicator read it ("" if unset).
  const std::string& algo_env() const;
  // Whether `name` can run this call (false if it is not registered).
  bool supports(const std::string& name, const coll::CollArgs& a) const;

 private:
  detail::CommImpl* impl_;
};

}  // namespace cclz::perf
