// GoogleTest main for the io unit tests, with MPI for the parallel-HDF5 tests.
//
// Under mpirun/srun MPI starts at once and only the IoMpi.* tests run (unless a
// --gtest_filter says otherwise); ranks other than 0 print failures only, and the exit
// status is the worst over the ranks:
//   mpirun -np 2 --oversubscribe build/test/trident_unit_io --gtest_filter='IoMpi.*'
// Run alone (CTest runs each test as its own process), MPI starts only in the tests that
// call iotest::need_mpi(), with shared-memory transports, so that the many serial tests
// do not each pay for a singleton MPI start-up.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "io_test_util.hpp"
#include "trident/core/log.hpp"

namespace iotest {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

void need_mpi() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  if (!launched_by_mpi()) {
    // One process: no network transports to probe.
    setenv("OMPI_MCA_pml", "ob1", 0);
    setenv("OMPI_MCA_btl", "self,vader", 0);
  }
  MPI_Init(nullptr, nullptr);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  trident::log::set_rank(rank);
}

}  // namespace iotest

int main(int argc, char** argv) {
  int rank = 0, size = 1;
  if (iotest::launched_by_mpi()) {
    iotest::need_mpi();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank != 0) GTEST_FLAG_SET(brief, true);  // read by InitGoogleTest
  }
  ::testing::InitGoogleTest(&argc, argv);
  if (size > 1 && GTEST_FLAG_GET(filter) == "*") GTEST_FLAG_SET(filter, "IoMpi.*");
  int rc = RUN_ALL_TESTS();
  int init = 0;
  MPI_Initialized(&init);
  if (init) {
    MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
  }
  return rc;
}
