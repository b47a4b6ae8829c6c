// Real prefault rates on this host (issue 8, benchmark 6), built by bench_prefault.py with g++.
//
// For a fresh private anonymous mapping of SIZE bytes (4 KiB pages; THP is whatever the host's
// policy gives an mmap without madvise), seconds to:
//   populate      madvise(MADV_POPULATE_WRITE): the allocator's prefault
//   touch         one write per 4 KiB page: the allocator's fallback (Kernel::touch)
//   memset_fresh  memset of the whole fresh mapping (faults + writes)
//   memset_warm   memset of the same mapping once populated: the memory-bandwidth ceiling
// Rounds interleave the variants. Output: JSON {"variant": [seconds, one per round], ...}.
// Usage: bench_prefault SIZE_BYTES ROUNDS
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::exit(1);
}

char* Map(size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("mmap");
  return static_cast<char*>(p);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s SIZE_BYTES ROUNDS\n", argv[0]);
    return 64;
  }
  const size_t size = std::strtoull(argv[1], nullptr, 10);
  const int rounds = std::atoi(argv[2]);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (size == 0 || size % page != 0 || rounds <= 0) {
    std::fprintf(stderr, "SIZE_BYTES must be a positive multiple of %zu, ROUNDS > 0\n", page);
    return 64;
  }
  std::map<std::string, std::vector<double>> s;
  for (int r = 0; r < rounds; ++r) {
    {
      char* p = Map(size);
      auto t0 = Clock::now();
      if (::madvise(p, size, MADV_POPULATE_WRITE) != 0) Die("madvise(MADV_POPULATE_WRITE)");
      s["populate"].push_back(Seconds(t0, Clock::now()));
      ::munmap(p, size);
    }
    {
      char* p = Map(size);
      volatile char* v = p;
      auto t0 = Clock::now();
      for (size_t off = 0; off < size; off += page) v[off] = 0;
      s["touch"].push_back(Seconds(t0, Clock::now()));
      ::munmap(p, size);
    }
    {
      char* p = Map(size);
      auto t0 = Clock::now();
      std::memset(p, 1, size);
      auto t1 = Clock::now();
      std::memset(p, 2, size);
      auto t2 = Clock::now();
      s["memset_fresh"].push_back(Seconds(t0, t1));
      s["memset_warm"].push_back(Seconds(t1, t2));
      if (p[size - 1] != 2) Die("memset");
      ::munmap(p, size);
    }
  }
  std::printf("{");
  bool first = true;
  for (auto& [name, xs] : s) {
    std::printf("%s\"%s\": [", first ? "" : ", ", name.c_str());
    for (size_t i = 0; i < xs.size(); ++i) std::printf("%s%.6f", i ? ", " : "", xs[i]);
    std::printf("]");
    first = false;
  }
  std::printf("}\n");
  return 0;
}
