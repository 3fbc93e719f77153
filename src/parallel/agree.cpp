// Agreement on start-up failures (see trident/parallel/agree.hpp).
#include "trident/parallel/agree.hpp"

#include <climits>
#include <optional>
#include <string>

namespace trident::parallel {

namespace {

// Broadcasts `text` from `root` (every rank returns root's).
std::string broadcast_text(std::string text, int root, MPI_Comm comm) {
  int length = int(text.size());
  MPI_Bcast(&length, 1, MPI_INT, root, comm);
  text.resize(std::size_t(length));
  if (length > 0) MPI_Bcast(text.data(), length, MPI_CHAR, root, comm);
  return text;
}

// The message of the lowest rank that failed, prefixed with its rank unless 0; none when no
// rank failed. Collective over comm.
std::optional<std::string> first_failure(bool failed, const std::string& message,
                                         MPI_Comm comm) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  if (size == 1) return failed ? std::optional<std::string>(message) : std::nullopt;
  int first = failed ? rank : INT_MAX;
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == INT_MAX) return std::nullopt;
  std::string agreed = broadcast_text(rank == first ? message : std::string(), first, comm);
  if (first != 0) agreed = "[rank " + std::to_string(first) + "] " + agreed;
  return agreed;
}

[[noreturn]] void throw_for(const std::string& message, MPI_Comm comm) {
  int same = MPI_UNEQUAL;
  if (comm != MPI_COMM_NULL) MPI_Comm_compare(comm, MPI_COMM_WORLD, &same);
  if (same == MPI_IDENT || same == MPI_CONGRUENT) throw AgreedError(message);
  throw Error(message);
}

}  // namespace

void agree(const std::function<void()>& fn) { agree(MPI_COMM_WORLD, fn); }

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
  if (auto agreed = first_failure(failed, message, comm)) throw AgreedError(*agreed);
}

void agree_on_errors(const std::string& error, MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) {
    if (!error.empty()) throw Error(error);
    return;
  }
  if (auto agreed = first_failure(!error.empty(), error, comm)) throw_for(*agreed, comm);
}

void agree_on_root_error(const std::string& error, MPI_Comm comm) {
  const std::string agreed = comm == MPI_COMM_NULL ? error : broadcast_text(error, 0, comm);
  if (!agreed.empty()) throw_for(agreed, comm);
}

}  // namespace trident::parallel
