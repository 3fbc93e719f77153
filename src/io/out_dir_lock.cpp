// One run per out_dir (see trident/io/out_dir_lock.hpp).
#include "trident/io/out_dir_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <sstream>
#include <thread>

#include "trident/core/error.hpp"
#include "trident/core/log.hpp"

namespace trident::io {

namespace {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string job_id() {
  for (const char* var : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"})
    if (const char* v = std::getenv(var); v && *v) return str(var, "=", v);
  return "";
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// The holder's record: key=value lines (host, pid, started, job).
std::string own_record() {
  return str("host=", host_name(), "\npid=", getpid(), "\nstarted=", now_utc(), "\njob=", job_id(),
             "\n");
}

std::map<std::string, std::string> read_record(int fd) {
  std::string text;
  char buf[512];
  ssize_t n;
  off_t at = 0;
  while ((n = pread(fd, buf, sizeof buf, at)) > 0) {
    text.append(buf, std::size_t(n));
    at += n;
    if (text.size() > 4096) break;
  }
  std::map<std::string, std::string> rec;
  std::istringstream is(text);
  for (std::string line; std::getline(is, line);)
    if (auto eq = line.find('='); eq != std::string::npos)
      rec[line.substr(0, eq)] = line.substr(eq + 1);
  return rec;
}

std::string describe(const std::map<std::string, std::string>& rec) {
  auto get = [&](const char* k) {
    auto it = rec.find(k);
    return it == rec.end() || it->second.empty() ? std::string("?") : it->second;
  };
  std::string s = str("host ", get("host"), ", pid ", get("pid"));
  if (auto it = rec.find("job"); it != rec.end() && !it->second.empty()) s += str(", ", it->second);
  return s + str(", started ", get("started"));
}

void write_record(int fd, const std::string& path) {
  const std::string rec = own_record();
  TRIDENT_CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, rec.data(), rec.size(), 0) == ssize_t(rec.size()),
                "io.out_dir: cannot write the lock file '", path, "': ", std::strerror(errno));
  fsync(fd);
}

// Without fcntl locks: is the recorded holder a live process on this host (not us)?
bool record_holder_alive(const std::map<std::string, std::string>& rec) {
  auto h = rec.find("host"), p = rec.find("pid");
  if (h == rec.end() || p == rec.end()) return false;
  if (h->second != host_name()) return true;  // cannot tell from here: assume it lives
  const long pid = std::atol(p->second.c_str());
  if (pid <= 0 || pid == long(getpid())) return false;
  return kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

double OutDirLock::default_wait_seconds() {
  if (const char* v = std::getenv("TRIDENT_LOCK_WAIT_S"); v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    TRIDENT_CHECK(end && *end == '\0' && s >= 0, "TRIDENT_LOCK_WAIT_S = '", v,
                  "': expected seconds (a number >= 0)");
    return s;
  }
  return 60;
}

OutDirLock OutDirLock::acquire(const std::string& out_dir, double wait_s) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TRIDENT_CHECK(!ec, "io.out_dir: cannot create '", out_dir, "': ", ec.message());
  const std::string path = out_dir + "/.trident.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TRIDENT_CHECK(fd >= 0, "io.out_dir: cannot open the lock file '", path, "': ",
                std::strerror(errno));
  OutDirLock lock;
  lock.fd_ = fd;
  lock.path_ = path;
  const auto t0 = std::chrono::steady_clock::now();
  bool said_waiting = false;
  for (;;) {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &fl) == 0) {
      // A record left behind means its writer died holding the lock (a clean exit empties it).
      const auto old = read_record(fd);
      if (!old.empty())
        log::warn("io.out_dir: taking over the stale lock of a run that ended without "
                  "releasing it (", describe(old), ")");
      write_record(fd, path);
      return lock;
    }
    const int err = errno;
    const auto holder = read_record(fd);
    bool busy = err == EACCES || err == EAGAIN;
    if (err == ENOLCK || err == EINVAL || err == EOPNOTSUPP) {
      // No locks on this file system: the record decides (advisory only).
      busy = record_holder_alive(holder);
      if (!busy) {
        log::warn("io.out_dir: the file system of '", out_dir, "' has no fcntl locks (",
                  std::strerror(err), "); the out_dir lock is only a record there, not a lock",
                  holder.empty() ? std::string() : str("; taking over from ", describe(holder)));
        write_record(fd, path);
        return lock;
      }
    } else if (!busy) {
      fail("io.out_dir: cannot lock '", path, "': ", std::strerror(err));
    }
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited >= wait_s)
      fail("io.out_dir: '", out_dir, "' is in use by another run (", describe(holder),
           "); waited ", wait_s, " s (TRIDENT_LOCK_WAIT_S) for it to end; use another "
           "io.out_dir or stop that run");
    if (!said_waiting) {
      log::info("io.out_dir: '", out_dir, "' is locked by ", describe(holder),
                "; waiting up to ", wait_s, " s for it to end");
      said_waiting = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

OutDirLock::OutDirLock(OutDirLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) {
  o.fd_ = -1;
}

OutDirLock& OutDirLock::operator=(OutDirLock&& o) noexcept {
  if (this != &o) {
    this->~OutDirLock();
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

OutDirLock::~OutDirLock() {
  if (fd_ < 0) return;
  // Emptied on a clean release: a record found later means a holder that died.
  if (ftruncate(fd_, 0) != 0) { /* the lock goes with the close anyway */ }
  ::close(fd_);
  fd_ = -1;
}

}  // namespace trident::io
