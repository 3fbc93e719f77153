// trident/parallel/process.hpp — the MPI process: start, end, abort, and this process's place
// in the job (MPI_COMM_WORLD), so that no code outside parallel calls MPI for them.
// defines: trident::parallel::init, finalize, abort_job, world_rank, world_size
#pragma once

namespace trident::parallel {

// MPI_Init / MPI_Finalize: once each, first and last thing of main.
void init(int& argc, char**& argv);
void finalize();
// Ends every rank of the job with `code` (MPI_Abort): an error on one rank that the others
// cannot learn of would otherwise leave them waiting.
[[noreturn]] void abort_job(int code);
int world_rank();
int world_size();

}  // namespace trident::parallel
