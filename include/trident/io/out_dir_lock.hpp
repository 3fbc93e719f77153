// trident/io/out_dir_lock.hpp — one run per out_dir: an advisory lock on <out_dir>/.trident.lock.
// defines: trident::io::OutDirLock
//
// The lock is a POSIX record lock (fcntl F_SETLK): it works on Lustre (flock/localflock mount
// options), GPFS and NFS, and it dies with its process, so a lock left by a killed run is stale by
// construction and the next run takes it over (with a warning naming the dead holder). The file
// holds the holder's host, pid, start time and Slurm/PBS job id, for the refusal message. On a
// file system without locks (fcntl fails with ENOLCK, EINVAL or EOPNOTSUPP) the file's contents
// decide: a holder on this host whose pid is alive holds it, any other is taken over, with a
// warning that the lock is only advisory there.
#pragma once

#include <string>

namespace trident::io {

class OutDirLock {
 public:
  OutDirLock() = default;
  // Creates out_dir if needed and takes its lock, waiting up to wait_s seconds for a live
  // holder to let go (a requeued job whose predecessor's ranks are still exiting); throws
  // trident::Error naming the holder (host, pid, job id) when it cannot.
  static OutDirLock acquire(const std::string& out_dir, double wait_s);
  // TRIDENT_LOCK_WAIT_S, else 60 s.
  static double default_wait_seconds();
  OutDirLock(OutDirLock&& o) noexcept;
  OutDirLock& operator=(OutDirLock&& o) noexcept;
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;
  ~OutDirLock();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace trident::io
