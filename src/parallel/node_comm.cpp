// The ranks of a node (see trident/parallel/node_comm.hpp).
#include "trident/parallel/node_comm.hpp"

namespace trident::parallel {

Comm split_by_node(const Comm& comm, std::string name) {
  MPI_Comm node;
  MPI_Comm_split_type(comm.raw(), MPI_COMM_TYPE_SHARED, comm.rank(), MPI_INFO_NULL, &node);
  Comm c(node, std::move(name), true);
  return c;
}

}  // namespace trident::parallel
