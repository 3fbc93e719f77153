// Agreement on start-up failures (see trident/parallel/agree.hpp).
#include "trident/parallel/agree.hpp"

#include <climits>
#include <string>
#include <vector>

namespace trident::parallel {

void agree(MPI_Comm comm, const std::function<void()>& fn) {
  std::string message;
  bool failed = false;
  try {
    fn();
  } catch (const AgreedError&) {
    throw;  // already agreed on by everyone
  } catch (const Error& e) {
    failed = true;
    message = e.what();
  }
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  if (size == 1) {
    if (failed) throw AgreedError(message);
    return;
  }
  int first = failed ? rank : INT_MAX;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT_MAX) return;
  int length = int(message.size());
  MPI_Bcast(&length, 1, MPI_INT, first, comm);
  std::vector<char> text(message.begin(), message.end());
  text.resize(std::size_t(length));
  MPI_Bcast(text.data(), length, MPI_CHAR, first, comm);
  std::string agreed(text.begin(), text.end());
  if (first != 0) agreed = "[rank " + std::to_string(first) + "] " + agreed;
  throw AgreedError(agreed);
}

}  // namespace trident::parallel
