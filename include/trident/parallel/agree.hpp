// trident/parallel/agree.hpp — making every rank reach the same verdict (DESIGN.md,
// decision 6). Start-up work (deck, files, weights) runs under agree(): if it fails on any
// rank, it fails on every rank with the same one-line message, so the job exits cleanly
// instead of leaving ranks blocked in a collective.
// defines: trident::parallel::AgreedError, agree
#pragma once

#include <mpi.h>

#include <functional>

#include "trident/core/error.hpp"

namespace trident::parallel {

// An Error that every rank of the job has thrown (the app exits cleanly, rank 0 prints).
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Collective over comm. Runs fn; if fn throws a trident::Error on any rank, every rank
// throws AgreedError with the message of the lowest failing rank. fn must not itself
// communicate over comm in a way a failing rank could skip.
void agree(MPI_Comm comm, const std::function<void()>& fn);

}  // namespace trident::parallel
