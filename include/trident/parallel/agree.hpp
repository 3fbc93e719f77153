// trident/parallel/agree.hpp — making every rank reach the same verdict (DESIGN.md,
// decision 6). Start-up work (deck, files, weights) runs under agree(): if it fails on any
// rank, it fails on every rank with the same one-line message, so the job exits cleanly
// instead of leaving ranks blocked in a collective.
// defines: trident::parallel::AgreedError, agree, agree_on_errors, agree_on_root_error
#pragma once

#include <mpi.h>

#include <functional>
#include <string>

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
// The same over the whole job (every rank of MPI_COMM_WORLD): start-up work in the commands,
// which need no communicator of their own for it.
void agree(const std::function<void()>& fn);

// For failures met as messages (HDF5's, the file system's) rather than exceptions; the
// thrown error is an AgreedError when comm spans the whole world (rank 0 alone prints it),
// else a plain Error. Collective over comm (MPI_COMM_NULL: this process alone).
// Each rank passes its error ("" for none); if any rank has one, every rank throws the
// lowest failing rank's, prefixed "[rank r] " unless r is 0.
void agree_on_errors(const std::string& error, MPI_Comm comm);
// Rank 0's error ("" for none; the others' are not read), thrown on every rank. Also a
// barrier: no rank returns before rank 0 has called it.
void agree_on_root_error(const std::string& error, MPI_Comm comm);

}  // namespace trident::parallel
