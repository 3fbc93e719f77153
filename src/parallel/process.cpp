// The MPI process (see trident/parallel/process.hpp).
#include "trident/parallel/process.hpp"

#include <mpi.h>

#include <cstdlib>

namespace trident::parallel {

void init(int& argc, char**& argv) { MPI_Init(&argc, &argv); }
void finalize() { MPI_Finalize(); }

void abort_job(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return; the compiler does not know it
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace trident::parallel
