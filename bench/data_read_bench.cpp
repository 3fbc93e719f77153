// How a rank should read its sequences (issue 17): HDF5 hyperslab reads (io::TokenFile, what
// training uses) against a memory map of the contiguous /tokens found with H5Dget_offset.
// Random windows of T + 1 tokens, converted to int32 as training needs them; reports
// microseconds per sequence and how much the resident set grew.
// usage: trident_bench_data_read CONTIGUOUS.h5 CHUNKED.h5 T READS
#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "trident/core/rng.hpp"
#include "trident/io/dataset.hpp"

namespace {

double rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  return 0;
}

template <typename Read>
void measure(const char* what, std::int64_t n, int T, long reads, Read read) {
  std::vector<std::int32_t> buf(std::size_t(T) + 1);
  const double rss0 = rss_mb();
  const auto t0 = std::chrono::steady_clock::now();
  long long sum = 0;
  for (long i = 0; i < reads; ++i) {
    const std::int64_t start =
        std::int64_t(trident::rng::uniform_u64(1, 2, std::uint64_t(i)) % std::uint64_t(n - T - 1));
    read(start, buf.data());
    sum += buf[0];
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%-34s %8.2f us/sequence  resident +%.1f MB after %ld reads (checksum %lld)\n", what,
              s / double(reads) * 1e6, rss_mb() - rss0, reads, sum % 1000);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s CONTIGUOUS.h5 CHUNKED.h5 T READS\n", argv[0]);
    return 2;
  }
  const std::string contiguous = argv[1], chunked = argv[2];
  const int T = std::atoi(argv[3]);
  const long reads = std::atol(argv[4]);

  // The memory map: /tokens must be contiguous (H5Dget_offset fails on a chunked dataset).
  hid_t f = H5Fopen(contiguous.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "tokens", H5P_DEFAULT);
  const haddr_t offset = H5Dget_offset(ds);
  hid_t sp = H5Dget_space(ds);
  const std::int64_t n = H5Sget_simple_extent_npoints(sp);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
  if (offset == HADDR_UNDEF) {
    std::fprintf(stderr, "%s: /tokens is not contiguous\n", contiguous.c_str());
    return 1;
  }
  const int fd = ::open(contiguous.c_str(), O_RDONLY);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  void* map = ::mmap(nullptr, std::size_t(size), PROT_READ, MAP_SHARED, fd, 0);
  ::madvise(map, std::size_t(size), MADV_RANDOM);
  const auto* ids = reinterpret_cast<const std::uint16_t*>(static_cast<const char*>(map) + offset);
  measure("mmap (H5Dget_offset), contiguous", n, T, reads, [&](std::int64_t s, std::int32_t* out) {
    for (int t = 0; t <= T; ++t) out[t] = ids[s + t];
  });
  ::munmap(map, std::size_t(size));
  ::close(fd);

  trident::io::TokenFile a(contiguous);
  measure("hyperslab (TokenFile), contiguous", n, T, reads,
          [&](std::int64_t s, std::int32_t* out) { a.read(s, T + 1, out); });
  trident::io::TokenFile b(chunked);
  measure("hyperslab (TokenFile), chunked", b.num_tokens(), T, reads,
          [&](std::int64_t s, std::int32_t* out) { b.read(s, T + 1, out); });
  return 0;
}
