// GoogleTest main for the model unit tests: MPI starts only in the tests that build a model
// (need_mpi(), with shared-memory transports: one process), and ends here.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

namespace modeltest {

void need_mpi() {
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  setenv("OMPI_MCA_pml", "ob1", 0);
  setenv("OMPI_MCA_btl", "self,vader", 0);
  MPI_Init(nullptr, nullptr);
}

}  // namespace modeltest

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  int init = 0;
  MPI_Initialized(&init);
  if (init) MPI_Finalize();
  return rc;
}
