// trident/parallel/node_comm.hpp — the ranks of a communicator that share a node (memory),
// as one Comm: what measures "inside a node" against "between nodes" (plan/calibrate.cpp).
// defines: trident::parallel::split_by_node
#pragma once

#include <string>

#include "trident/parallel/comm.hpp"

namespace trident::parallel {

// Collective over comm: the members on this rank's node (MPI_COMM_TYPE_SHARED), ordered
// as in comm.
Comm split_by_node(const Comm& comm, std::string name);

}  // namespace trident::parallel
